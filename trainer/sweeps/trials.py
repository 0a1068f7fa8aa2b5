"""A trial's job: the sweep's base job with the trial's sampled parameters applied — run-config fields and task
arguments into the entry, where it runs (instance type, capacity) into its placement — and its link to the study."""

from __future__ import annotations

from typing import Any

from trainforge.trainer.spec import SUBMITTER_OWNED, JobSpec, parse_spec, task_arg_of

# Where a trial runs, searchable beside its run config: what a trial costs is decided here (categorical only).
INFRA_FIELDS = {"instance_type": "resources.instance_type", "capacity": "capacity"}
# Fields the submitter sets from the job spec itself, or the sweep sets per trial: not searchable.
NOT_SEARCHABLE = SUBMITTER_OWNED | {"step_sleep_s"}  # and the runtime's test hook


def apply_params(base: JobSpec, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The base's task arguments and hyperparameters with a trial's parameters applied."""
    args, hyper = dict(base.entry.args), dict(base.hyperparameters)
    for name, value in params.items():
        if name in INFRA_FIELDS:
            continue  # where it runs, not what it runs (placed_as)
        arg = task_arg_of(name)
        if arg is not None:
            args[arg] = value
        else:
            hyper[name] = value
    return args, hyper


def placed_as(base: JobSpec, params: dict[str, Any]) -> JobSpec:
    """The base job placed as a trial's instance type and capacity say (validated as a job spec)."""
    chosen = {k: v for k, v in params.items() if k in INFRA_FIELDS}
    if not chosen:
        return base
    raw = base.model_dump(mode="json", exclude_none=True)
    if "instance_type" in chosen:
        raw["resources"] = {**{k: v for k, v in raw.get("resources", {}).items() if k not in ("gpu_type", "gpus_per_node")},
                            "instance_type": chosen["instance_type"]}
    if "capacity" in chosen:
        raw["capacity"] = chosen["capacity"]
    return parse_spec(raw, "trial")


def trial_job(base: JobSpec, name: str, params: dict[str, Any], link: dict[str, Any] | None) -> JobSpec:
    """The base job with a trial's parameters and the sweep's link to its study (the runtime's `sweep` settings)."""
    args, hyper = apply_params(base, params)
    placed = placed_as(base, params)
    return placed.model_copy(update={"name": name, "entry": base.entry.model_copy(update={"args": args}),
                                     "hyperparameters": hyper, "sweep": link or None})
