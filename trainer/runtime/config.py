"""Run configuration for the training runtime: one pydantic model, validated before any process group exists.

Imports no torch: the CLI validates a job spec's `entry` and `hyperparameters` against this model when the spec
loads, so a typo fails `trainforge check` in a second instead of a worker minutes later.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from trainforge import exits
from trainforge.models import EXPERIMENT_NAME, RUN_ID, S3_URI, StrictModel, lineage_checked
from trainforge.errors import TrainforgeError

# The bundled tasks and their factory arguments, known without importing torch. tasks.py builds them; a test
# keeps the two equal.
# Each bundled task's arguments and their types (known without importing torch; a test keeps them equal to tasks.py's
# factories): a sweep searching one with the wrong type is refused before a trial runs.
BUNDLED_TASKS: dict[str, dict[str, type]] = {"classifier": {"width": int, "depth": int},
                                             "char_lm": {"context": int, "dim": int, "layers": int, "heads": int}}
# The eval metrics each bundled task reports, and its default metric with its direction (a test keeps them equal to tasks.py).
BUNDLED_TASK_METRICS: dict[str, tuple[str, ...]] = {"classifier": ("loss", "accuracy"), "char_lm": ("loss", "perplexity")}
BUNDLED_DEFAULT_METRIC: dict[str, tuple[str, str]] = {"classifier": ("accuracy", "max"), "char_lm": ("loss", "min")}
# A researcher's own task: "package.module:factory", a function returning a Task.
TASK_REFERENCE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


class UserError(TrainforgeError):
    """A problem retrying cannot fix (bad config for this machine, bad task code): the worker exits EXIT_USER_ERROR."""

    exit_code = exits.EXIT_USER_ERROR

    def __init__(self, message: str):
        super().__init__("", [message])


class PeerLost(RuntimeError):
    """Another rank is gone (it never did its part of a shared step): not this rank's fault, so the worker exits
    EXIT_PEER_LOST and the attempt is retried from the last checkpoint."""

    exit_code = exits.EXIT_PEER_LOST


class DeviceFault(RuntimeError):
    """This rank's GPU failed or is missing (not the job's fault): the worker exits EXIT_DEVICE_FAULT and the attempt is
    retried from the last checkpoint."""

    exit_code = exits.EXIT_DEVICE_FAULT


class _Model(BaseModel):
    model_config = StrictModel.model_config


class CheckpointConfig(_Model):
    dir: Path = Field(Path("checkpoints"), description="local tier: one sub-directory per step")
    interval_steps: int = Field(50, ge=1, le=10**12)
    keep_last: int = Field(2, ge=1)
    keep_best: bool = Field(True, description="also keep the checkpoint with the best eval metric")
    async_save: bool = True
    # An emergency checkpoint on SIGTERM is skipped when a committed one is at most this old (seconds).
    emergency_skip_if_newer_than_s: float = Field(0.0, ge=0)
    # After SIGTERM, a worker that has not exited after this long (stuck in a collective or in C++) exits anyway.
    preemption_grace_s: float = Field(25.0, gt=0)
    s3_uri: str | None = Field(None, pattern=S3_URI,
                               description="durable tier, e.g. s3://<checkpoints bucket>/teams/<team>/<job>")
    s3_endpoint_url: str | None = Field(None, description="any S3-compatible endpoint; default: AWS for the region")
    s3_max_concurrency: int = Field(8, ge=1, le=64)
    s3_close_timeout_s: float = Field(120.0, ge=0, description="at the end of a run, how long to wait for the last upload")
    start_from: Path | None = Field(None, description="another job's checkpoint directory: its newest committed checkpoint is "
                                                      "copied here when this job has none, and the run continues from it")
    export_final: bool = Field(True, description="at the end, also write final_model.pt: the full unsharded weights, gathered "
                                                 "into rank 0's host memory. Off for a model larger than one host's memory or "
                                                 "disk; the sharded checkpoint is then the hand-off")


class MetricsConfig(_Model):
    port: int | None = Field(None, ge=1, le=65535, description="Prometheus endpoint of local rank 0; rank r serves port + r")
    addr: str = "0.0.0.0"


class TrackingConfig(_Model):
    uri: str | None = Field(None, description="MLflow tracking URI, e.g. http://mlflow.mlflow:5000; None disables tracking")
    experiment: str = Field("trainforge", pattern=EXPERIMENT_NAME, description="the team's experiment: <team>/<this>")
    close_timeout_s: float = Field(30.0, ge=0)
    lineage: dict[str, str] = Field({}, description="tagged trainforge.lineage.<key>; parent_run_id nests the run under that run")

    @field_validator("lineage")
    @classmethod
    def _lineage(cls, lineage: dict[str, str]) -> dict[str, str]:
        return lineage_checked(lineage)


class SweepTrialConfig(_Model):
    """Set by `trainforge sweep` on each trial: rank 0 reports every evaluation to the study and stops a pruned trial."""

    storage: str = Field(..., description="the study's Optuna storage URL (SQLite locally, the platform's PostgreSQL on the cluster)")
    study: str
    trial_id: int = Field(..., ge=0, description="the trial's id in the storage (Optuna's, unique across studies)")
    trial_number: int | None = Field(None, ge=0, description="its number within the sweep (0, 1, ...): what status and MLflow show")
    metric: str = Field(..., description="the eval metric the study optimises")
    heartbeat_s: float = Field(10.0, gt=0, description="how often rank 0 tells the study the trial is alive")
    parent_run_id: str | None = Field(None, description="the sweep's MLflow run: the trial's run is nested under it")


class NcclConfig(_Model):
    """How collectives fail. A dead or stuck rank must not leave its peers hanging: once training runs, a collective
    that takes longer than `timeout_s` aborts the job (its launcher restarts the group from the last checkpoint). Until
    the first step is done (rendezvous, the model's build, a checkpoint's load from S3) the limit is `startup_timeout_s`.
    On a timeout NCCL's flight recorder (the last collectives of every rank, with their sizes and states) is written
    into the run directory, naming which rank stopped where. NCCL only: gloo (CPU) keeps its own limits."""

    timeout_s: int = Field(600, ge=30, le=86400, description="a collective's limit once the first step is done")
    startup_timeout_s: int = Field(1800, ge=60, le=86400, description="the limit until then: rendezvous, build, checkpoint load")
    flight_recorder_entries: int = Field(2000, ge=0, le=100000, description="collectives kept per rank for the dump on a timeout (0: off)")


FLIGHT_RECORDER_FILE = "nccl-flight-recorder-rank"  # in the run's output directory; torch appends the rank


def nccl_environment(cfg: NcclConfig, output_dir: str) -> dict[str, str]:
    """What ProcessGroupNCCL reads at its creation (torch 2.13 ProcessGroupNCCL.hpp, FlightRecorder.hpp): errors
    handled asynchronously (3: a failed or timed-out collective tears the process down, without waiting on the stuck
    communicator's cleanup), and the flight recorder kept and dumped on a timeout into the run directory."""
    entries = str(cfg.flight_recorder_entries)
    dump = str(Path(output_dir) / FLIGHT_RECORDER_FILE)
    # torch 2.13's names (TORCH_NCCL_TRACE_BUFFER_SIZE and TORCH_NCCL_DEBUG_INFO_TEMP_FILE are its deprecated aliases:
    # setting them prints a warning in every process, even on gloo).
    return {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_FR_BUFFER_SIZE": entries,
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1" if cfg.flight_recorder_entries else "0", "TORCH_FR_DUMP_TEMP_FILE": dump}


class RewarmConfig(_Model):
    """A promoted sweep trial (`trainforge sweep best --promote`) resumes at its trial's last step under a longer
    schedule, whose factor there is far above where the trial's decayed to (about 10x): from `from_step` the learning
    rate climbs linearly over `steps` from the trial's last factor to this run's own. The default scheduler's; a task's
    own scheduler is its own."""
    from_step: int = Field(..., ge=1)
    from_factor: float = Field(..., ge=0, le=1)
    steps: int = Field(..., ge=1)


class RunConfig(_Model):
    job_id: str = Field("adhoc", pattern=RUN_ID, max_length=63)
    team: str = Field("default", pattern=RUN_ID, max_length=63)
    task: str = "classifier"
    task_args: dict[str, int | float | str] = Field({}, description="keyword arguments of the task factory, e.g. {width: 2048}")
    strategy: Literal["ddp", "fsdp"] = "ddp"
    compile: bool = Field(False, description="torch.compile the model (per FSDP unit under FSDP); worth it on GPUs, off on CPU")
    activation_checkpointing: Literal["none", "selective", "full"] = Field(
        "none", description="per unit (the task's FSDP units, e.g. transformer blocks): full recomputes each unit's forward in "
                            "backward (least memory); selective keeps matmul and attention outputs and recomputes the rest")
    # auto: bf16 where the device computes it natively, else fp16 + loss scaling (CUDA) or fp32 (runtime/precision.py)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    seed: int = 0
    deterministic: bool | None = Field(
        None, description="deterministic kernels; unset: what the device can honour: on on the CPU (resume is bit-identical), off on "
                          "CUDA (ops without a deterministic kernel would raise, attention would take slower kernels); the choice is "
                          "in the log and result.json")
    max_steps: int = Field(200, ge=1, le=10**12)
    batch_size: int = Field(64, ge=1, description="per rank, per micro-batch")
    grad_accum_steps: int = Field(1, ge=1)
    lr: float = Field(3e-3, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_steps: int = Field(20, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    rewarm: RewarmConfig | None = None
    max_grad_norm: float | None = Field(1.0, gt=0)
    eval_every: int = Field(50, ge=1)
    eval_batches: int | None = Field(None, ge=1, description="cap on eval batches per rank; None = whole eval set")
    metric: str | None = Field(None, description="eval metric that picks the best checkpoint and drives early stopping; default: the task's")
    metric_mode: Literal["max", "min"] | None = Field(None, description="default: the task's for its default metric")
    early_stopping_patience: int | None = Field(None, ge=1, description="evals without improvement before stopping")
    target_metric: float | None = Field(None, description="stop once the eval metric reaches this")
    log_every: int = Field(10, ge=1)
    output_dir: Path = Path("run")
    checkpoint: CheckpointConfig = CheckpointConfig()
    nccl: NcclConfig = NcclConfig()
    metrics: MetricsConfig = MetricsConfig()
    tracking: TrackingConfig = TrackingConfig()
    sweep: SweepTrialConfig | None = None
    # Test hook: sleep this long after each step (to give a killer a window mid-run). Zero in real runs.
    step_sleep_s: float = Field(0.0, ge=0)

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        if task not in BUNDLED_TASKS and not TASK_REFERENCE.match(task):
            raise ValueError(f"unknown task {task!r}. Fix: one of the bundled tasks {sorted(BUNDLED_TASKS)}, "
                             "or your own as 'package.module:factory'")
        return task

    @model_validator(mode="after")
    def _bundled_task_args(self) -> RunConfig:
        accepted = BUNDLED_TASKS.get(self.task)
        if accepted is None:  # the researcher's own task: its arguments are its code's to check
            return self
        unknown = sorted(set(self.task_args) - set(accepted))
        if unknown:
            raise ValueError(f"task_args: {unknown} are not arguments of the bundled task {self.task!r}. Fix: use {list(accepted)}")
        return self

    @model_validator(mode="after")
    def _warmup_fits(self) -> RunConfig:
        if self.warmup_steps >= self.max_steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below max_steps ({self.max_steps}). Fix: lower warmup_steps")
        return self
