"""The training loop: one code path for one process or many, DDP or FSDP2, CPU (gloo) or CUDA (NCCL). Steps,
evaluation, the per-step stop agreement and logging; the process group is distributed.py's, when and what to
checkpoint the checkpointer's, and the metrics, S3 and MLflow wiring channels.py's."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainforge import exits, paths
from trainforge.trainer.runtime import build, channels, hooks, precision
from trainforge.trainer.runtime.checkpoint import CheckpointManager, Subject
from trainforge.trainer.runtime.config import RunConfig
from trainforge.trainer.runtime.data import ResumableDistributedSampler, micro_batches
from trainforge.trainer.runtime.distributed import Distributed, resolve_deterministic, seed_everything, settle_timeout
from trainforge.trainer.runtime.preemption import PreemptionGuard
from trainforge.trainer.runtime.stop_agreement import InFlight, agree, land
from trainforge.trainer.runtime.tasks import Task

log = logging.getLogger("trainforge.runtime")


@dataclass
class TrainerState:
    step: int = 0
    last_eval: dict[str, float] = field(default_factory=dict)
    restarts: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "last_eval": dict(self.last_eval), "restarts": self.restarts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.last_eval, self.restarts = state["step"], dict(state["last_eval"]), state["restarts"]


@dataclass
class _LogInterval:
    """Host-side bookkeeping between two log steps: nothing here reads the device."""
    started_at: float
    first_step: int
    data_wait_s: float = 0.0


def add_eval_sums(total: dict[str, torch.Tensor], sums: dict[str, Any], device: torch.device) -> None:
    """Add one batch's eval sums to the running totals, each on `device`: a task may return a CPU scalar or a float
    (a user's task; on CUDA, mixing it with the model's device would be refused), and the totals are all-reduced as one
    tensor there."""
    for key, value in sums.items():
        value = torch.as_tensor(value).detach().float().to(device)
        total[key] = total[key] + value if key in total else value


def packed_eval_sums(total: dict[str, torch.Tensor], device: torch.device) -> tuple[list[str], torch.Tensor]:
    """The totals in key order as one tensor on `device`: what the all-reduce takes."""
    keys = sorted(total)
    return keys, (torch.stack([total[k] for k in keys]) if keys else torch.zeros(0, device=device))


@dataclass
class RunResult:
    exit_code: int
    step: int
    last_eval: dict[str, float]
    resumed_from: int | None
    stopped_because: str
    precision: str = "fp32"  # what the run computed in
    precision_reason: str = ""
    deterministic: bool = True  # whether its kernels were deterministic, and why (distributed.resolve_deterministic)
    deterministic_reason: str = ""


class Trainer:
    def __init__(self, task: Task, cfg: RunConfig, env: Distributed):
        self.precision = precision.agreed(cfg.precision, env.device, env.control_group, announce=env.is_main)
        # What is logged, tracked and run: the precision chosen, the task's metric where the config names none.
        deterministic, self.deterministic_reason = resolve_deterministic(cfg.deterministic, env.device)
        cfg = hooks.resolve_metric(cfg.model_copy(update={"precision": self.precision.chosen, "deterministic": deterministic}), task)
        self.task, self.cfg, self.env = task, cfg, env
        if env.is_main:
            log.info("deterministic: %s (%s)", deterministic, self.deterministic_reason)
        seed_everything(cfg.seed, deterministic)
        self.model, self.host_memory = build.build_model(task, cfg, env, self.precision.chosen)
        self.optimizer = build.optimizer_for(task, self.model, cfg)
        self.scheduler = build.scheduler_for(task, self.optimizer, cfg)
        self.scaler = torch.amp.GradScaler("cuda") if cfg.precision == "fp16" else None
        self.sampler = ResumableDistributedSampler(len(task.train_set), env.rank, env.world_size, cfg.seed)  # type: ignore[arg-type]  # sized
        self.state = TrainerState()
        self._interval = _LogInterval(time.perf_counter(), 0)
        self.eval_hooks: list[hooks.EvalHook] = hooks.default_eval_hooks(cfg)
        self.checkpoints = CheckpointManager(cfg.checkpoint, rank=env.rank, world_size=env.world_size, metric_mode=hooks.resolved_metric(cfg)[1],
                                             process_group=env.checkpoint_group,
                                             subject=Subject(self.model, self.optimizer, self.stateful), device=env.device)
        self.output = Path(cfg.output_dir)
        self.output.mkdir(parents=True, exist_ok=True)
        # What building the model cost in host memory, per rank (FSDP2 builds on meta: about a shard, not the model).
        (self.output / f"host-memory-rank{env.rank}.json").write_text(json.dumps(dataclasses.asdict(self.host_memory)))
        if env.is_main:
            log.info("model built (%s): host memory %.0f MiB -> peak %.0f MiB, model %.0f MiB", self.host_memory.materialised,
                     self.host_memory.before_mb, self.host_memory.peak_mb, self.host_memory.model_mb)
        self.metrics = channels.runtime_metrics(cfg, env, self.checkpoints)
        if env.device.type == "cuda" and task.flops_per_token is not None:
            self.metrics.configure_mfu(task.flops_per_token(self.model), torch.cuda.get_device_name(env.device), env.world_size)
        self.s3 = channels.durable_tier(cfg, env, self.checkpoints, self.metrics)
        self.tracker = channels.tracker(cfg, env, task, self.precision, self.checkpoints)

    def _autocast(self):
        """DDP computes under autocast; FSDP2 in its units' MixedPrecisionPolicy (build.py), without autocast."""
        if self.cfg.strategy == "fsdp":
            return contextlib.nullcontext()
        return precision.autocast(self.cfg.precision, self.env.device)

    def _precision_record(self) -> tuple[str, str, bool, str]:
        return self.precision.chosen, self.precision.reason, bool(self.cfg.deterministic), self.deterministic_reason

    def close(self, status: str) -> None:
        """Finish the checkpoint machinery (its staging threads and cached buffers must not outlive the process
        group or the CUDA context), then flush the side channels (S3, MLflow) before the process goes away."""
        self.checkpoints.close()
        if self.s3 is not None:
            if not self.s3.close(timeout=self.cfg.checkpoint.s3_close_timeout_s):
                log.warning("the last checkpoint did not reach S3 within %.0f s; it is on the local tier only",
                            self.cfg.checkpoint.s3_close_timeout_s)
        if self.tracker is not None:
            self.tracker.close(status, timeout=self.cfg.tracking.close_timeout_s)

    # ---- state -----------------------------------------------------------------------------------------------

    def add_eval_hook(self, hook: hooks.EvalHook) -> None:
        """Run `hook` after every evaluation (on rank 0); a stateful hook is checkpointed under its name."""
        self.eval_hooks.append(hook)

    def stateful(self) -> dict[str, hooks.Stateful]:
        """Everything checkpointed besides the model and optimizer, by name: one place to add a stateful piece."""
        pieces: dict[str, hooks.Stateful] = {"state": self.state, "scheduler": self.scheduler, "sampler": self.sampler}
        pieces |= {f"hook.{h.name}": h for h in self.eval_hooks if isinstance(h, hooks.Stateful)}
        return pieces

    def resume(self) -> int | None:
        """Continue from the newest sound checkpoint: S3's copy synced down first, or another job's adopted
        (`checkpoint.start_from`) when this one has none."""
        if self.s3 is not None:
            self.s3.sync_down(self.checkpoints.directory)
        self.checkpoints.adopt(self.cfg.checkpoint.start_from)
        resumed = self.checkpoints.load_latest()
        if resumed is None:
            return None
        self.state.restarts += 1
        self.metrics.restarts.set(self.state.restarts)
        if self.env.is_main:
            log.info("resumed from %s (step %d)%s", resumed.path, resumed.step,
                     "" if resumed.rng_restored else "; new world size, RNG reseeded")
        return resumed.step

    def _metric(self) -> float | None:
        return self.state.last_eval.get(hooks.resolved_metric(self.cfg)[0])

    # ---- steps -----------------------------------------------------------------------------------------------

    def _to_device(self, batch):
        return tuple(t.to(self.env.device, non_blocking=True) for t in batch)

    def train_step(self, batches) -> tuple[torch.Tensor, dict[str, int]]:
        """One optimizer step over grad_accum_steps micro-batches; returns this rank's mean loss (a device tensor: the
        host reads it only at log steps) and the samples/tokens it trained on."""
        total_loss: torch.Tensor | None = None
        totals = {"samples": 0}
        accum = self.cfg.grad_accum_steps
        for i in range(accum):
            waited = time.perf_counter()
            batch = self._to_device(next(batches))
            self._interval.data_wait_s += time.perf_counter() - waited
            # DDP all-reduces gradients on every backward unless told not to: only the last micro-batch syncs.
            sync = i == accum - 1 or not hasattr(self.model, "no_sync")
            with (contextlib.nullcontext() if sync else self.model.no_sync()), self._autocast():  # type: ignore[operator]  # DDP's
                loss, counts = self.task.loss(self.model, batch)
            scaled = loss / accum if accum > 1 else loss
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            self.sampler.advance(counts["samples"])
            total_loss = loss.detach() if total_loss is None else total_loss + loss.detach()
            for k, v in counts.items():
                totals[k] = totals.get(k, 0) + v
        # An async checkpoint may still be copying parameters and optimizer state: the step must not mutate them yet.
        self.checkpoints.wait_for_staging()
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.cfg.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if total_loss is None:
            raise ValueError("grad_accum_steps: at least 1")
        return (total_loss / accum if accum > 1 else total_loss), totals

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        n = len(self.task.eval_set)  # type: ignore[arg-type]  # every task's datasets are sized
        per_rank = n // self.env.world_size
        indices = list(range(self.env.rank * per_rank, (self.env.rank + 1) * per_rank))
        loader = torch.utils.data.DataLoader(torch.utils.data.Subset(self.task.eval_set, indices), batch_size=self.cfg.batch_size)
        sums: dict[str, torch.Tensor] = {}
        for i, batch in enumerate(loader):
            if self.cfg.eval_batches is not None and i >= self.cfg.eval_batches:
                break
            with self._autocast():
                add_eval_sums(sums, self.task.eval_sums(self.model, self._to_device(batch)), self.env.device)
        keys, packed = packed_eval_sums(sums, self.env.device)
        dist.all_reduce(packed)
        self.model.train()
        return self.task.summarize({k: float(v) for k, v in zip(keys, packed.tolist())})

    # ---- the loop ----------------------------------------------------------------------------------------------

    def run(self, guard: PreemptionGuard) -> RunResult:
        """The loop. Per step the host reads nothing from the device: the loss stays there until a log step, and the
        stop agreement is a host-side collective read one step later. So every rank stops at the same step, at most
        one step after the first rank was told to stop (about two step times after SIGTERM), or at the step whose
        evaluation made rank 0's hooks decide."""
        cfg, env = self.cfg, self.env
        resumed_from = self.resume()
        batches = micro_batches(self.task.train_set, self.sampler, cfg.batch_size)
        metrics_file = open(self.output / paths.METRICS_FILE, "a") if env.is_main else None
        stopped = "max_steps"
        self.model.train()
        in_flight: InFlight | None = None
        self._interval = _LogInterval(time.perf_counter(), self.state.step)
        try:
            first_step = self.state.step + 1
            while self.state.step < cfg.max_steps:
                loss, counts = self.train_step(batches)
                self.state.step += 1
                if self.state.step == first_step:  # built, resumed, warmed up: the start-up allowance ends
                    settle_timeout(env, cfg.nccl)
                evaluating = self.state.step % cfg.eval_every == 0 or self.state.step == cfg.max_steps
                agreed = land(in_flight)  # the previous step's answer
                in_flight = None
                stop_code = 0
                if evaluating and not agreed.preempted:
                    stop_code = hooks.reason_code(self._after_eval(metrics_file))
                in_flight = agree(guard, stop_code, self.env)
                if agreed.preempted or evaluating:
                    # Read this step's answer now: a preemption stops here, and rank 0's decision after an
                    # evaluation stops every rank at this same step.
                    answer = land(in_flight)
                    in_flight = None
                    if agreed.preempted or answer.preempted:
                        self._log_step(loss, counts, metrics_file)
                        return self._preempted(guard, resumed_from)
                    stopped = answer.stop_reason or stopped
                last = stopped != "max_steps" or self.state.step == cfg.max_steps
                if self.state.step % cfg.log_every == 0 or last:
                    self._log_step(loss, counts, metrics_file)
                self.checkpoints.maybe_save(self.state.step, self._metric())
                if stopped != "max_steps":
                    break
                if cfg.step_sleep_s:
                    time.sleep(cfg.step_sleep_s)
            land(in_flight)
            in_flight = None
            self.checkpoints.final_save(self.state.step, self._metric())
            if cfg.checkpoint.export_final:
                self.checkpoints.export_full_model(self.output / paths.FINAL_MODEL_FILE)
            return RunResult(exits.EXIT_OK, self.state.step, self.state.last_eval, resumed_from, stopped, *self._precision_record())
        except BaseException:
            self.checkpoints.abandon()  # a failing run exits now, not after a save in flight that it will never commit
            raise
        finally:
            if in_flight is not None:
                in_flight.work.wait()
            if metrics_file:
                metrics_file.close()

    def _log_step(self, loss: torch.Tensor, counts: dict[str, int], metrics_file) -> None:
        """The one place the host reads the loss: at log steps (and the last step). The mean over ranks, the step time
        averaged over the interval since the previous log step (measured after the read, so it includes the device's
        work), then Prometheus, the JSONL log, the console and MLflow."""
        mean = loss.detach().float().reshape(1).clone()
        dist.all_reduce(mean)
        loss_value = mean.item() / self.env.world_size
        now, step, world = time.perf_counter(), self.state.step, self.env.world_size
        interval = self._interval
        steps = max(1, step - interval.first_step)
        step_s = (now - interval.started_at) / steps
        lr = self.scheduler.get_last_lr()[0]
        self.metrics.logged(step, loss_value, step_s, {k: v * world for k, v in counts.items()}, interval.data_wait_s)
        self._interval = _LogInterval(now, step)
        if metrics_file:
            metrics_file.write(json.dumps({"step": step, "loss": loss_value, "lr": lr, "step_s": step_s, "samples": counts["samples"] * world,
                                           "t": time.time()}) + "\n")
            metrics_file.flush()
        if self.env.is_main:
            rate = 1.0 / step_s if step_s > 0 else 0.0
            eta = (self.cfg.max_steps - step) / rate if rate else 0.0
            log.info("step %d/%d  loss %.4f  lr %.2e  %.1f steps/s  %.0f samples/s  ETA %.0f s", step, self.cfg.max_steps,
                     loss_value, lr, rate, counts["samples"] * world * rate, eta)
        if self.tracker is not None:
            self.tracker.log_metrics(step, {"loss": loss_value, "lr": lr, "samples_per_second": counts["samples"] * world / step_s})

    def _after_eval(self, metrics_file) -> str | None:
        """Evaluate (every rank), then rank 0's hooks decide whether to stop; the other ranks learn it from the collective."""
        self.state.last_eval = self.evaluate()
        self.metrics.evaluated(self.state.last_eval)
        if self.tracker is not None:
            self.tracker.log_metrics(self.state.step, {f"eval_{k}": v for k, v in self.state.last_eval.items()})
        if metrics_file:
            metrics_file.write(json.dumps({"step": self.state.step, "eval": self.state.last_eval}) + "\n")
        if not self.env.is_main:
            return None
        return hooks.first_stop(self.eval_hooks, self.state.step, self.state.last_eval)

    def _preempted(self, guard: PreemptionGuard, resumed_from: int | None) -> RunResult:
        saved = self.checkpoints.emergency_save(self.state.step, self._metric())
        if self.env.is_main:
            channels.flush_within_grace(self.s3, guard, self.cfg.checkpoint.preemption_grace_s)
        if self.env.is_main and guard.received_at is not None:
            elapsed = time.monotonic() - guard.received_at
            log.warning("preempted at step %d: %s in %.2f s after SIGTERM", self.state.step,
                        "committed checkpoint" if saved else "recent checkpoint kept", elapsed)
            (self.output / paths.PREEMPTED_FILE).write_text(json.dumps({"step": self.state.step, "sigterm_to_commit_s": elapsed,
                                                                    "emergency_checkpoint": saved}))
        return RunResult(exits.EXIT_PREEMPTED, self.state.step, self.state.last_eval, resumed_from, "preempted",
                         *self._precision_record())
