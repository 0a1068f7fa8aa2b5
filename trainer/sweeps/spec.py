"""The sweep spec: a base job, a search space over its run-config fields, an objective, a sampler and a pruner,
limits on trials, parallelism, dollars and time. Validated whole before anything is created: every problem named by
its field, with the fix. Imports no torch and no optuna.

    name: lr-sweep
    base: ../examples/classifier.yaml      # or the job spec inline
    space:
      lr: {type: float, low: 1e-4, high: 3e-1, log: true}
      batch_size: {type: int, low: 16, high: 128, step: 16}
      task_args.width: {type: categorical, choices: [64, 128, 256]}
    objective: {metric: accuracy, direction: maximize}
    sampler: tpe            # tpe | random | grid | cmaes
    pruner: {type: hyperband}   # median | hyperband | successive_halving | none
    max_trials: 16
    max_parallel: 2
    budget: {usd: 25, wall_time: 2h}
    seed: 0
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, ValidationError, model_validator

from trainforge import durations, errors
from trainforge.models import DNS_LABEL, StrictModel
from trainforge.trainer.runtime.config import RunConfig
from trainforge.trainer.spec import JobSpec, SpecError, parse_spec, read_yaml
from trainforge.trainer.sweeps import checks



_Model = StrictModel


class FloatParam(_Model):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _range(self) -> FloatParam:
        _check_range(self.low, self.high, self.log, self.step)
        return self

    def values(self) -> list[Any] | None:
        if self.step is None:
            return None
        count = int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1
        return [round(self.low + i * self.step, 12) for i in range(count)]

    def extremes(self) -> list[Any]:
        return [self.low, self.high]


class IntParam(_Model):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _range(self) -> IntParam:
        _check_range(self.low, self.high, self.log, None if self.step == 1 else self.step)
        return self

    def values(self) -> list[Any]:
        return list(range(self.low, self.high + 1, self.step))

    def extremes(self) -> list[Any]:
        return [self.low, self.high]


class CategoricalParam(_Model):
    type: Literal["categorical"]
    choices: list[bool | int | float | str] = Field(..., min_length=1)

    def values(self) -> list[Any]:
        return list(self.choices)

    def extremes(self) -> list[Any]:
        return list(self.choices)


def _check_range(low: float, high: float, log: bool, step: float | None) -> None:
    if low >= high:
        raise ValueError(f"low ({low}) must be below high ({high}). Fix: swap them, or use a categorical with one choice")
    if log and low <= 0:
        raise ValueError(f"a log scale needs low > 0 (got {low}). Fix: a positive low, or log: false")
    if log and step is not None:
        raise ValueError("log and step cannot be combined (Optuna samples one or the other). Fix: drop step, or log: false")


Param = Annotated[Union[FloatParam, IntParam, CategoricalParam], Field(discriminator="type")]


class Objective(_Model):
    metric: str = Field(..., min_length=1, description="an eval metric the task reports, e.g. loss, accuracy")
    direction: Literal["minimize", "maximize"] | None = Field(None, description="default: the task's own direction for its default metric")


class SecondObjective(_Model):
    """What a trial cost, as a second objective: the controller knows it when the trial ends (no task reports it)."""
    metric: Literal["cost_usd", "run_s"] = Field(..., description="the trial's own cost in USD, or its run time in seconds")
    direction: Literal["minimize"] = "minimize"


class Pruner(_Model):
    type: Literal["median", "hyperband", "successive_halving", "none"] = "median"
    startup_trials: int = Field(3, ge=0, description="median: trials that run to the end before any is pruned")
    warmup_steps: int | None = Field(None, ge=0, description="median: steps before a trial may be pruned; default: 3/4 of the base's "
                                                            "max_steps (benchmarks/bench_search.py: earlier, it stopped the "
                                                            "configurations that end best)")
    min_resource: int | None = Field(None, ge=1, description="hyperband, successive_halving: steps every trial gets; default: the base's eval_every")
    reduction_factor: int = Field(3, ge=2, description="hyperband, successive_halving: 1/reduction_factor of the trials go on at each rung")


class Budget(_Model):
    usd: float | None = Field(None, gt=0, description="no trial starts that could take the sweep's cost over this")
    wall_time: str | None = Field(None, description="e.g. 2h: no trial starts after it, running ones are stopped")

    @model_validator(mode="after")
    def _duration(self) -> Budget:
        if self.wall_time is not None:
            try:
                durations.seconds(self.wall_time)
            except ValueError as exc:
                raise ValueError(f"wall_time: {exc}") from None
        return self

    @property
    def wall_time_s(self) -> float | None:
        return None if self.wall_time is None else durations.seconds(self.wall_time)


class SweepSpec(_Model):
    name: str = Field(..., pattern=DNS_LABEL, max_length=32)
    base: str | dict[str, Any] = Field(..., description="the base job spec: a path (relative to the sweep file) or inline")
    space: dict[str, Param] = Field(..., description="run-config fields (or task_args.<arg>) and their ranges")
    objective: Objective
    second_objective: SecondObjective | None = Field(None, description="e.g. {metric: cost_usd}: search the trade-off; "
                                                                        "`best` and `report` show the Pareto front")
    sampler: Literal["tpe", "random", "grid", "cmaes"] = "tpe"
    pruner: Pruner = Pruner()
    max_trials: int = Field(..., ge=1, le=10_000)
    max_parallel: int = Field(1, ge=1, le=256)
    budget: Budget = Budget()
    seed: int = 0
    warm_start: list[Annotated[str, Field(pattern=DNS_LABEL, max_length=32)]] = Field(
        [], max_length=16, description="earlier sweeps in the same storage: their trials told to this one's sampler (none "
                                       "re-runs) where this sweep searches all they searched; else their best (up to 3 each) run first")

    def grid(self) -> dict[str, list[Any]]:
        """Every searched field's finite values (the grid sampler's space; parse_sweep refuses a grid over a range)."""
        grid = {name: param.values() for name, param in self.space.items()}
        ranges = [name for name, values in grid.items() if values is None]
        if ranges:
            raise ValueError(f"space: {ranges} are ranges without a step: no grid. Fix: give them a step, or make them categorical")
        return {name: values for name, values in grid.items() if values is not None}



class Sweep:
    """A validated sweep: the spec, its base job, the objective's direction, and how many trials it plans."""

    def __init__(self, spec: SweepSpec, base: JobSpec, direction: str, source: str):
        self.spec, self.base, self.direction, self.source = spec, base, direction, source

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def planned_trials(self) -> int:
        if self.spec.sampler == "grid":
            return min(self.spec.max_trials, math.prod(len(v) for v in self.spec.grid().values()))
        return self.spec.max_trials

    def max_steps(self, params: dict[str, Any] | None = None) -> int:
        merged = {**self.base.hyperparameters, **(params or {})}
        return int(merged.get("max_steps", RunConfig.model_fields["max_steps"].default))

    def eval_every(self) -> int:
        return int(self.base.hyperparameters.get("eval_every", RunConfig.model_fields["eval_every"].default))

    def with_limits(self, *, max_trials: int, usd: float | None, wall_time_s: float | None) -> Sweep:
        """The same search under other limits (an extension): the spec is frozen, so a copy."""
        budget = self.spec.budget.model_copy(update={"usd": usd, "wall_time": None if wall_time_s is None else duration(wall_time_s)})
        return Sweep(self.spec.model_copy(update={"max_trials": max_trials, "budget": budget}), self.base, self.direction, self.source)


def duration(seconds: float) -> str:
    return durations.spelled(seconds)


def parse_duration(text: str, field: str) -> int:
    """A duration in the one grammar (trainforge/durations.py), in seconds; a clear error naming `field` otherwise."""
    try:
        return durations.seconds(text)
    except ValueError as exc:
        raise SweepSpecError(field, [str(exc)]) from None


def load_sweep(path: str | Path) -> Sweep:
    path = Path(path)
    return parse_sweep(read_yaml(path), str(path), path.parent)


class SweepSpecError(SpecError):
    """A sweep spec that must not start (its base job's own problems stay an invalid job spec, naming the base)."""

    what = "invalid sweep spec"


def parse_sweep(raw: Any, source: str, relative_to: Path = Path(".")) -> Sweep:
    if not isinstance(raw, dict):
        raise SweepSpecError(source, ["a sweep spec is a mapping of fields. Fix: see examples/sweep.yaml"])
    if raw.get("space") == {}:
        raise SweepSpecError(source, ["space: empty: a sweep searches at least one field. Fix: e.g. space: {lr: {type: float, low: 1e-4, high: 1e-1, log: true}}"])
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as exc:
        raise SweepSpecError(source, errors.problems(exc, {"literal_error": " Fix: use one of the listed values."})) from None
    base = _base(spec, source, relative_to)
    problems = checks.space_problems(spec, base) + checks.objective_problems(spec, base) + checks.second_objective_problems(spec)
    if spec.name in spec.warm_start:
        problems.append(f"warm_start: {spec.name!r} is this sweep. Fix: name earlier sweeps (continuing this one needs no warm start)")
    if not problems:
        problems += checks.combination_problems(spec, base) + checks.pruner_problems(spec, base)
    if spec.sampler == "grid":
        problems += [f"space.{name}: the grid sampler needs a finite set of values. Fix: give it a step, or make it categorical"
                     for name, p in spec.space.items() if p.values() is None]
    if problems:
        raise SweepSpecError(source, problems)
    return Sweep(spec, base, checks.direction(spec, base), source)


def _base(spec: SweepSpec, source: str, relative_to: Path) -> JobSpec:
    if isinstance(spec.base, dict):
        return parse_spec(spec.base, f"{source}: base")
    path = Path(spec.base)
    path = path if path.is_absolute() else relative_to / path
    if not path.exists():
        raise SpecError(source, [f"base: {spec.base!r} does not exist (looked at {path}). Fix: a job spec's path relative to the sweep file"])
    base = parse_spec(read_yaml(path), str(path))
    if base.entry.task is None:
        raise SpecError(source, ["base: the job runs a command, not a task: a sweep sets run-config fields. Fix: a base with entry.task"])
    return base
