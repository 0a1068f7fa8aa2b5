"""What a sweep spec must satisfy beyond its fields' types, checked against its base job before anything starts: every
searched field is one a trial can set, each extreme (and each combination of extremes) is a run config the runtime
accepts, the objective is a metric the task reports, and a pruner or a second objective can act. Each problem names
its field and the fix."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trainforge.trainer.runtime.config import BUNDLED_DEFAULT_METRIC, BUNDLED_TASK_METRICS, BUNDLED_TASKS, RunConfig
from trainforge.trainer.spec import JobSpec, SpecError, run_config_problems, task_arg_of
from trainforge.trainer.sweeps.trials import INFRA_FIELDS, NOT_SEARCHABLE, apply_params, placed_as

if TYPE_CHECKING:
    from trainforge.trainer.sweeps.spec import SweepSpec


def task_of(base: JobSpec) -> str:
    """The base job's task (a sweep's base runs a task: parse_sweep refuses a command base before these checks)."""
    if base.entry.task is None:
        raise SpecError("base", ["the job runs a command, not a task: a sweep sets run-config fields. Fix: a base with entry.task"])
    return base.entry.task


MAX_COMBINATIONS = 4096  # 2^12 searched fields' extremes: checked in well under a second


def combination_problems(spec: SweepSpec, base: JobSpec) -> list[str]:
    """Each field's extremes pass alone; a trial draws them together (warmup_steps near its high with max_steps near
    its low). Every combination of the extremes is what a trial could get at worst."""
    import itertools
    names = list(spec.space)
    extremes = [list(dict.fromkeys(spec.space[n].extremes())) for n in names]
    if math.prod(len(e) for e in extremes) > MAX_COMBINATIONS:
        return []
    for values in itertools.product(*extremes):
        params = dict(zip(names, values))
        for problem in run_config_problems(task_of(base), *apply_params(base, params)):
            return [f"space: a trial could draw {params}, which the run config refuses: {problem} (or narrow the ranges so "
                    "that every combination is valid)"]
    return []


def _smallest(spec: SweepSpec, base: JobSpec, field: str) -> int:
    if field in spec.space:
        return int(min(spec.space[field].extremes()))
    return int(base.hyperparameters.get(field, RunConfig.model_fields[field].default))


def pruner_problems(spec: SweepSpec, base: JobSpec) -> list[str]:
    """A pruner that could never act is refused rather than silently doing nothing."""
    p, shortest = spec.pruner, _smallest(spec, base, "max_steps")
    if p.type == "median" and p.warmup_steps is not None and p.warmup_steps >= shortest:
        return [f"pruner.warmup_steps: {p.warmup_steps} is not below the shortest trial's max_steps ({shortest}): no trial would "
                f"ever be pruned. Fix: warmup_steps below {shortest}, or pruner: {{type: none}}"]
    if p.type in ("hyperband", "successive_halving") and p.min_resource is not None and p.min_resource >= shortest:
        return [f"pruner.min_resource: {p.min_resource} steps is not below the shortest trial's max_steps ({shortest}): no trial "
                f"would ever be pruned. Fix: min_resource below {shortest} (a few evaluations' worth)"]
    return []

def second_objective_problems(spec: SweepSpec) -> list[str]:
    if spec.second_objective is None:
        return []
    problems = []
    if spec.pruner.type != "none":
        problems.append("pruner: a sweep with a second objective cannot prune (Optuna prunes single-objective studies only: a "
                        "trial's cost is known when it ends). Fix: pruner: {type: none}")
    if spec.sampler == "cmaes":
        problems.append("sampler: cmaes searches one objective. Fix: tpe (multi-objective TPE), random or grid")
    return problems

def _infra_problems(name: str, param: Any, base: JobSpec) -> list[str]:
    """A searched instance type or capacity: categorical, and each choice a job the spec accepts."""
    if param.type != "categorical":
        return [f"space.{name}: where a trial runs is a choice, not a range. Fix: type: categorical with choices"]
    problems = []
    for choice in param.choices:
        try:
            placed_as(base, {name: choice})
        except SpecError as exc:
            problems.append(f"space.{name}: the choice {choice!r} is refused: {'; '.join(exc.problems)}")
            continue
        if name == "instance_type":
            from trainforge.pricing import PriceUnknown, price_table
            table = price_table()
            try:
                table.hourly(choice, "on-demand", table.regions[0])
            except PriceUnknown:
                problems.append(f"space.instance_type: the choice {choice!r} is refused: it has no price in the dated price table, "
                                "and the search trades what a trial costs. Fix: a priced type (`trainforge prices`)")
    return problems

def space_problems(spec: SweepSpec, base: JobSpec) -> list[str]:
    problems = []
    task = task_of(base)
    for name, param in spec.space.items():
        if name in INFRA_FIELDS:
            problems += _infra_problems(name, param, base)
            continue
        arg = task_arg_of(name)
        if arg is not None:
            accepted = BUNDLED_TASKS.get(task)
            if accepted is not None and arg not in accepted:
                problems.append(f"space.{name}: {arg!r} is not an argument of the bundled task {task!r}. Fix: one of {list(accepted)}")
                continue
            kind = accepted[arg] if accepted is not None else None
            wrong = [v for v in param.extremes() if kind is not None and not _is_a(v, kind)]
            if kind is not None and wrong:
                problems.append(f"space.{name}: the task's {arg!r} is {kind.__name__}, but this searches {param.type} values "
                                f"(e.g. {wrong[0]!r}): every trial would fail. Fix: "
                                + (f"type: {kind.__name__}" if param.type != "categorical" else f"{kind.__name__} choices only"))
                continue
        elif name not in RunConfig.model_fields or name in NOT_SEARCHABLE:
            searchable = sorted(set(RunConfig.model_fields) - NOT_SEARCHABLE)
            problems.append(f"space.{name}: not a run-config field a sweep can set. Fix: one of {searchable}, or task_args.<arg>")
            continue
        for value in param.extremes():
            for problem in run_config_problems(task, *apply_params(base, {name: value})):
                problems.append(f"space.{name}: the value {value!r} is refused by the run config: {problem}")
                break
    return problems


def _is_a(value: Any, kind: type) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)

def objective_problems(spec: SweepSpec, base: JobSpec) -> list[str]:
    reported = BUNDLED_TASK_METRICS.get(task_of(base))
    if reported is None:  # the researcher's own task: its metrics are known only to its code
        return [] if spec.objective.direction else ["objective.direction: needed for your own task's metric. Fix: minimize or maximize"]
    if spec.objective.metric not in reported:
        return [f"objective.metric: the task {base.entry.task!r} never reports {spec.objective.metric!r}. Fix: one of {list(reported)}"]
    return []


def direction(spec: SweepSpec, base: JobSpec) -> str:
    if spec.objective.direction:
        return spec.objective.direction
    default = BUNDLED_DEFAULT_METRIC.get(task_of(base))
    if default and default[0] == spec.objective.metric:
        return "maximize" if default[1] == "max" else "minimize"
    return "maximize" if spec.objective.metric == "accuracy" else "minimize"  # loss, perplexity: lower is better
