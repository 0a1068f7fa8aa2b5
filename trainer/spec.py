"""The job spec: one YAML file that runs unchanged on this machine or on the cluster.

Light on purpose: the CLI imports this module on every command, so it must not import torch, pulumi or mlflow.
Every message names the field, the bad value and the fix. `entry` and `hyperparameters` are checked against the
runtime's own `RunConfig` (torch-free) as the spec loads: a typo fails here, not in a worker after GPU nodes
scaled up from zero.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from trainforge import catalog, contract, durations, nodes
from trainforge import errors, yamlfile
from trainforge.models import DNS_LABEL, EXPERIMENT_NAME, S3_URI, StrictModel, lineage_checked
from trainforge.stackconfig import PlatformConfig
from trainforge.trainer.runtime.config import RunConfig

QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"
GPU_TYPES = {row.gpu_model for row in catalog.CATALOG.values() if row.gpus}


# Run-config fields the submitter sets from the job spec itself (identity, entry, paths, tracking) or a sweep sets per
# trial: never hyperparameters, never searched.
SUBMITTER_OWNED = frozenset({"job_id", "team", "task", "task_args", "output_dir", "checkpoint", "tracking", "metrics", "sweep"})


class SpecError(errors.TrainforgeError):
    """A job spec that must not run. str() is the whole message: one line per problem."""

    what = "invalid job spec"


_Model = StrictModel


class Entry(_Model):
    task: str | None = Field(None, description="a bundled task (classifier, char_lm) or your own 'package.module:factory'")
    command: list[str] | None = Field(None, min_length=1, description="or any command; it runs under torchrun's environment")
    args: dict[str, Any] = Field({}, description="task factory arguments (task_args)")

    @model_validator(mode="after")
    def _one_of(self) -> Entry:
        if (self.task is None) == (self.command is None):
            raise ValueError("give exactly one of entry.task or entry.command. Fix: e.g. entry: {task: char_lm}")
        if self.command is not None and self.args:
            raise ValueError("args: are a task factory's arguments; a command takes none of them. Fix: put them in "
                             "entry.command, or in hyperparameters (the command reads them as JSON from $"
                             f"{contract.HYPERPARAMETERS_ENV})")
        return self


class Workers(_Model):
    nodes: int = Field(1, ge=1, le=512)
    procs_per_node: int = Field(1, ge=1, le=64)


class Resources(_Model):
    instance_type: str | None = Field(None, description="e.g. p5.48xlarge; sets GPUs per node and the node flavour")
    gpu_type: str | None = Field(None, description=f"or a GPU model: one of {sorted(GPU_TYPES)}")
    gpus_per_node: int | None = Field(None, ge=0, le=16)
    # Per node (worker pod). The defaults fit the smallest GPU node of the catalogue (an xlarge: 4 vCPUs, 16 GiB, of
    # which the kubelet's reservations and the node's DaemonSets leave ~3.4 CPU and ~13 GiB): a larger request on a
    # node that cannot hold it would be Pending for ever, and `check` refuses it.
    cpu: str = Field("3", pattern=QUANTITY)
    memory: str = Field("12Gi", pattern=QUANTITY)
    # The container's scratch disk on the node (its writable layer, logs, emptyDirs but /dev/shm), requested and limited:
    # a pod that writes more is evicted instead of filling a disk other teams' pods share. Checkpoints go to FSx.
    ephemeral_storage: str = Field("20Gi", pattern=QUANTITY)

    @field_validator("cpu", "memory", "ephemeral_storage")
    @classmethod
    def _counted(cls, amount: str, info: ValidationInfo) -> str:
        """Requests are also the limits: zero would be no limit at all, and would count as nothing against the team's
        ResourceQuota and Kueue quota (unbounded use beside other teams, uncounted)."""
        if nodes.quantity(str(info.field_name), amount) <= 0:
            example = {"cpu": "'500m' or '3'", "memory": "'512Mi' or '12Gi'"}.get(str(info.field_name), "'5Gi' or '20Gi'")
            raise ValueError(f"{amount!r} is zero: a worker's {info.field_name} is both what it reserves and its limit, so "
                             f"it must be more than nothing. Fix: e.g. {example}")
        return amount

    @field_validator("instance_type")
    @classmethod
    def _known(cls, name: str | None) -> str | None:
        if name is not None:
            try:
                catalog.lookup(name)
            except catalog.UnknownInstanceType as exc:
                raise ValueError(f"{exc}. Fix: a type from trainforge.catalog") from None
        return name

    @field_validator("gpu_type")
    @classmethod
    def _gpu(cls, gpu: str | None) -> str | None:
        if gpu is not None and gpu not in GPU_TYPES:
            raise ValueError(f"{gpu!r} is not a GPU trainforge knows. Fix: one of {sorted(GPU_TYPES)}")
        return gpu

    @model_validator(mode="after")
    def _consistent(self) -> Resources:
        if self.instance_type and self.gpu_type:
            raise ValueError("give instance_type or gpu_type, not both. Fix: keep instance_type")
        if self.instance_type and self.gpus_per_node is not None:
            have = catalog.lookup(self.instance_type).gpus
            if self.gpus_per_node > have:
                raise ValueError(f"gpus_per_node: {self.instance_type} has {have} GPUs, asked for {self.gpus_per_node}. Fix: at most {have}")
        return self

    def instance(self) -> catalog.InstanceType | None:
        """The instance type a node of this job runs on: given, or the smallest that holds the GPUs asked for."""
        if self.instance_type:
            return catalog.lookup(self.instance_type)
        if self.gpu_type:
            wanted = self.gpus_per_node or 1
            fits = [r for r in catalog.CATALOG.values() if r.gpu_model == self.gpu_type and r.gpus >= wanted]
            return min(fits, key=lambda r: (r.gpus, r.name)) if fits else None
        return None

    def gpus(self) -> int:
        if self.gpus_per_node is not None:
            return self.gpus_per_node
        instance = self.instance()
        return instance.gpus if instance else 0


class Checkpointing(_Model):
    interval_steps: int = Field(100, ge=1, le=10**12)
    keep_last: int = Field(2, ge=1)
    s3_uri: str | None = Field(None, pattern=S3_URI)
    start_from: str | None = Field(None, pattern=DNS_LABEL, max_length=40,
                                   description="another job of the team: this job starts from its newest checkpoint (weights, "
                                               "optimizer, step) when it has none of its own, e.g. a sweep's best trial")


class Tracking(_Model):
    experiment: str = Field("trainforge", pattern=EXPERIMENT_NAME, description="the team's MLflow experiment: <team>/<this>")
    lineage: dict[str, str] = Field({}, description="where the job comes from, tagged trainforge.lineage.<key> on its MLflow run "
                                                    "(parent_run_id nests it under that run)")

    @field_validator("lineage")
    @classmethod
    def _lineage(cls, lineage: dict[str, str]) -> dict[str, str]:
        return lineage_checked(lineage)


class Limits(_Model):
    max_runtime: str = Field("2h", description="e.g. 90m, 2h, 1h30m, 1d")
    max_cost_usd: float | None = Field(None, gt=0)
    max_restarts: int = Field(5, ge=0, le=100, description="restarts after a worker dies or the job is preempted")

    @field_validator("max_runtime")
    @classmethod
    def _duration(cls, value: str) -> str:
        if durations.seconds(value) == 0:
            raise ValueError(f"{value!r} leaves the job no time to run. Fix: e.g. {durations.EXAMPLES}")
        return value

    @property
    def max_runtime_hours(self) -> float:
        return durations.seconds(self.max_runtime) / 3600


class JobSpec(_Model):
    name: str = Field(..., pattern=DNS_LABEL, max_length=40)
    team: str = Field(..., pattern=DNS_LABEL, max_length=40)
    image: str | None = Field(None, pattern=r"^[\w.\-/:@]+$", description="default: the stack's runtime image (its ECR repository)")
    entry: Entry
    workers: Workers = Workers()
    resources: Resources = Resources()
    capacity: Literal["on-demand", "spot", "spot-fallback"] = "spot"
    checkpoint: Checkpointing = Checkpointing()
    tracking: Tracking = Tracking()
    hyperparameters: dict[str, Any] = Field({}, description="run config fields for the runtime, e.g. {lr: 3e-4, max_steps: 5000}")
    limits: Limits = Limits()
    priority: Literal["low", "normal", "high"] = "normal"
    sweep: dict[str, Any] | None = Field(None, description="set by `trainforge sweep` on its trials: the study the trial reports to")

    @field_validator("hyperparameters")
    @classmethod
    def _known_run_fields(cls, values: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(SUBMITTER_OWNED & set(values))
        if clash:
            raise ValueError(f"{clash} are set by the submitter from the spec itself. Fix: use entry, checkpoint or tracking instead")
        return values

    @model_validator(mode="after")
    def _runs_as_configured(self) -> JobSpec:
        """The runtime's RunConfig accepts what the submitter will pass it (task entries; a command reads no run config)."""
        if self.entry.task is not None:
            problems = run_config_problems(self.entry.task, self.entry.args, self.hyperparameters)
            if problems:
                raise ValueError("\n".join(problems))
        return self


# Where a RunConfig field comes from in the job spec.
TASK_ARG_PATH = "task_args."  # a task argument as a run-config path (`task_args.width`): in overrides and a sweep's space


def task_arg_path(name: str) -> str:
    return f"{TASK_ARG_PATH}{name}"


def task_arg_of(path: str) -> str | None:
    """The task argument a run-config path names (`task_args.width` -> `width`); None for any other field."""
    return path[len(TASK_ARG_PATH):] if path.startswith(TASK_ARG_PATH) else None


_RUN_FIELD_IN_SPEC = {"task": "entry.task", "task_args": "entry.args"}
RUN_FIXES = {"extra_forbidden": " Fix: remove it or correct the spelling (the fields are trainforge.trainer.runtime.RunConfig's).",
             "missing": " Fix: add it.", "float_parsing": " Fix: a number, e.g. 3e-4.", "int_parsing": " Fix: a whole number.",
             "bool_parsing": " Fix: true or false."}


def run_config_problems(task: str, task_args: dict[str, Any], hyperparameters: dict[str, Any]) -> list[str]:
    """RunConfig's complaints about a task entry and its hyperparameters, each named by its place in the job spec."""
    try:
        RunConfig.model_validate({**hyperparameters, "task": task, "task_args": task_args})
    except ValidationError as exc:
        lines = errors.problems(exc, RUN_FIXES)
    else:
        return []
    out = []
    for line in lines:
        head, sep, rest = line.partition(":")
        top = head.split(".", 1)[0].split("[", 1)[0]
        if sep and top in _RUN_FIELD_IN_SPEC:
            out.append(_RUN_FIELD_IN_SPEC[top] + head[len(top):] + sep + rest)
        elif sep and errors.FIELD_PREFIX.match(line):
            out.append(f"hyperparameters.{line}")
        else:
            out.append(f"hyperparameters: {line}")
    return out


def image_of(spec: JobSpec, platform: PlatformConfig | None, deployed: str | None = None) -> str:
    """The image the job runs: its own, else the one the platform deployed (`deployed`: the team settings name it, the
    kubernetes backend reads them), else the stack's release image in the stack's ECR repository, else the public one."""
    if spec.image:
        return spec.image
    if deployed:
        return deployed
    if platform is not None and platform.account_id:
        import trainforge
        return contract.runtime_image(platform.account_id, platform.region, platform.environment, trainforge.__version__)
    return contract.DEFAULT_RUNTIME_IMAGE


def with_image(spec: JobSpec, platform: PlatformConfig | None, deployed: str | None = None) -> JobSpec:
    return spec if spec.image else spec.model_copy(update={"image": image_of(spec, platform, deployed)})


SPEC_FIXES = {"missing": " Fix: add it.", "extra_forbidden": " Fix: remove it or correct the spelling."}


def parse_spec(raw: Any, source: str = "<spec>") -> JobSpec:
    if not isinstance(raw, dict):
        raise SpecError(source, [f"a job spec is a mapping of fields, got {type(raw).__name__}. Fix: see examples/quickstart.yaml"])
    try:
        return JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(source, errors.problems(exc, SPEC_FIXES)) from None


def read_yaml(path: str | Path) -> Any:
    """A spec file's YAML, or a SpecError that names the file and what is wrong with it."""
    path = Path(path)
    try:
        return yamlfile.read(path)
    except FileNotFoundError:
        raise SpecError(str(path), ["no such file. Fix: check the path"]) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SpecError(str(path), [yamlfile.describe(exc)]) from None


def load_spec(path: str | Path) -> JobSpec:
    return parse_spec(read_yaml(path), str(path))
