"""Prometheus metrics, one endpoint per worker (port = base + local rank), labelled job, team and rank.

The names are the dashboard's and the alert rules' contract: rename one and they go blank.
"""

from __future__ import annotations

import time
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
CHECKPOINT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
LABELS = ("job", "team", "rank")


def model_flops_utilisation(tokens_per_second: float, flops_per_token: float, peak_flops_all_gpus: float) -> float:
    """The share of the GPUs' dense bf16 peak the model's training FLOPs use (recomputation not counted: MFU, not HFU)."""
    return tokens_per_second * flops_per_token / peak_flops_all_gpus


class RuntimeMetrics:
    def __init__(self, *, job: str, team: str, rank: int, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        values = (job, team, str(rank))

        def gauge(name: str, doc: str):
            return Gauge(name, doc, LABELS, registry=self.registry).labels(*values)

        def counter(name: str, doc: str):
            return Counter(name, doc, LABELS, registry=self.registry).labels(*values)

        def histogram(name: str, doc: str, buckets):
            return Histogram(name, doc, LABELS, buckets=buckets, registry=self.registry).labels(*values)

        self.step = gauge("trainforge_step", "Optimizer steps completed")
        self.loss = gauge("trainforge_loss", "Training loss of the last step (mean over ranks)")
        self.samples_per_second = gauge("trainforge_samples_per_second", "Samples per second, all ranks")
        self.tokens_per_second = gauge("trainforge_tokens_per_second", "Tokens per second, all ranks (token tasks)")
        self.mfu = gauge("trainforge_mfu", "Model FLOPs utilisation: tokens/s x training FLOPs per token / (GPUs x dense bf16 peak)")
        self.flops_per_token: float | None = None  # set by configure_mfu where the task, the device and the peak are known
        self.peak_flops_all_gpus: float | None = None
        self.eval_metric = Gauge("trainforge_eval_metric", "Last evaluation metrics", (*LABELS, "metric"), registry=self.registry)
        self._eval_labels = values
        self.step_seconds = histogram("trainforge_step_seconds", "Wall time of one optimizer step", STEP_BUCKETS)
        self.data_wait_seconds = counter("trainforge_data_wait_seconds_total", "Time spent waiting for input batches")
        self.checkpoint_blocking_seconds = histogram("trainforge_checkpoint_blocking_seconds",
                                                     "Training time blocked by a checkpoint save (staging)", CHECKPOINT_BUCKETS)
        self.checkpoint_total_seconds = histogram("trainforge_checkpoint_total_seconds",
                                                  "From save start to commit marker", CHECKPOINT_BUCKETS)
        self.last_checkpoint_age = gauge("trainforge_last_checkpoint_age_seconds", "Age of the newest committed checkpoint")
        self.last_checkpoint_step = gauge("trainforge_last_checkpoint_step", "Step of the newest committed checkpoint")
        self.s3_upload_lag = gauge("trainforge_s3_upload_lag_seconds", "How long the newest checkpoint has waited for S3")
        self.s3_upload_failures = counter("trainforge_s3_upload_failures_total", "Failed S3 checkpoint upload attempts")
        self.s3_upload_seconds = histogram("trainforge_s3_upload_seconds", "Duration of a whole checkpoint upload", CHECKPOINT_BUCKETS)
        self.restarts = gauge("trainforge_restarts", "Times this job resumed from a checkpoint")
        self.checkpoint_interval_steps = gauge("trainforge_checkpoint_interval_steps", "Steps between periodic checkpoints")
        # Set on each node's local rank 0 only, so a sum over a job's series is its cost rate (nodes x price).
        self.node_price = gauge("trainforge_node_price_usd_per_hour", "What one node of this job costs per hour (as submitted)")
        self.gpu_memory_bytes = gauge("trainforge_gpu_memory_allocated_bytes", "CUDA memory allocated by this rank")
        self.gpu_memory_peak_bytes = gauge("trainforge_gpu_memory_peak_bytes", "Peak CUDA memory allocated by this rank")
        self.gpu_utilization = gauge("trainforge_gpu_utilization_ratio", "GPU utilisation (0-1) over the last sample period")
        self._last_commit_time: float | None = None
        self.last_checkpoint_age.set_function(lambda: 0.0 if self._last_commit_time is None else time.time() - self._last_commit_time)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)

    def checkpoint_committed(self, step: int, committed_at: float, total_seconds: float | None) -> None:
        self._last_commit_time = committed_at
        self.last_checkpoint_step.set(step)
        if total_seconds is not None:
            self.checkpoint_total_seconds.observe(total_seconds)

    def watch_s3_lag(self, lag: Callable[[], float]) -> None:
        self.s3_upload_lag.set_function(lag)

    def s3_event(self, name: str, value: float) -> None:
        if name == "upload_failures":
            self.s3_upload_failures.inc(value)
        elif name == "upload_seconds":
            self.s3_upload_seconds.observe(value)

    def logged(self, step: int, loss: float, step_s: float, counts: dict[str, int], data_wait_s: float) -> None:
        """A log step: the job's mean loss, the interval's mean step time (one observation per log interval) and the
        job's throughput from `counts` (samples, tokens where the task counts them, summed over ranks)."""
        self.step.set(step)
        self.loss.set(loss)
        self.step_seconds.observe(step_s)
        self.samples_per_second.set(counts["samples"] / step_s)
        if "tokens" in counts:
            self.tokens_per_second.set(counts["tokens"] / step_s)
            if self.flops_per_token and self.peak_flops_all_gpus:
                self.mfu.set(model_flops_utilisation(counts["tokens"] / step_s, self.flops_per_token, self.peak_flops_all_gpus))
        self.data_wait_seconds.inc(data_wait_s)
        self.sample_gpu()

    def configure_mfu(self, flops_per_token: float | None, device_name: str | None, gpus: int) -> None:
        """MFU is reported where it means something: a token task on GPUs whose peak the catalog knows."""
        from trainforge import catalog
        peak = catalog.peak_bf16_flops(device_name) if device_name else None
        if flops_per_token and peak:
            self.flops_per_token, self.peak_flops_all_gpus = flops_per_token, peak * gpus

    def evaluated(self, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.eval_metric.labels(*self._eval_labels, name).set(value)

    def sample_gpu(self) -> None:
        import torch
        if not torch.cuda.is_available():
            return
        self.gpu_memory_bytes.set(torch.cuda.memory_allocated())
        self.gpu_memory_peak_bytes.set(torch.cuda.max_memory_allocated())
        try:
            self.gpu_utilization.set(torch.cuda.utilization() / 100.0)
        except Exception:  # noqa: BLE001 - needs NVML (pynvml); memory gauges still work without it
            pass
