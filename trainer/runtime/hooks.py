"""Decisions taken after each evaluation: stop early, stop at a target, or (sweeps) prune the trial.

An `on_eval` hook sees the step and the evaluation's metrics (the same numbers on every rank) and returns a stop
reason or None. Hooks run on rank 0 only — a sweep's pruner talks to its study from one process — and the
decision rides the step's agreement collective (loop.py), so every rank stops at the same step. A hook with
state (`state_dict` / `load_state_dict`) is checkpointed with the rest of the trainer's state and restored on
resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trainforge.trainer.runtime.config import RunConfig, UserError

if TYPE_CHECKING:
    from trainforge.trainer.runtime.tasks import Task

# Every reason a hook may give, in a fixed order: the collective carries its position (0 = keep going).
STOP_REASONS: tuple[str, ...] = ("early_stopping", "target_metric", "pruned")


def reason_code(reason: str | None) -> int:
    if reason is None:
        return 0
    if reason not in STOP_REASONS:
        raise ValueError(f"stop reason {reason!r} is not one of {STOP_REASONS}: add it to trainforge.trainer.runtime.hooks.STOP_REASONS")
    return STOP_REASONS.index(reason) + 1


def reason_of(code: int) -> str | None:
    return STOP_REASONS[code - 1] if code > 0 else None


class EvalHook(Protocol):
    name: str

    def on_eval(self, step: int, metrics: dict[str, float]) -> str | None: ...


@runtime_checkable
class Stateful(Protocol):
    """Anything whose state belongs in a checkpoint: the trainer's counters, the scheduler, the sampler, a hook."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def better(value: float, than: float | None, mode: str) -> bool:
    return than is None or (value > than if mode == "max" else value < than)


@dataclass
class EarlyStopping:
    """Stop after `patience` evaluations without a better `metric`."""

    metric: str
    mode: str  # "max" | "min"
    patience: int
    name: str = "early_stopping"
    best: float | None = None
    evals_without_improvement: int = 0

    def on_eval(self, step: int, metrics: dict[str, float]) -> str | None:
        value = metrics[self.metric]
        if better(value, self.best, self.mode):
            self.best, self.evals_without_improvement = value, 0
        else:
            self.evals_without_improvement += 1
        return "early_stopping" if self.evals_without_improvement >= self.patience else None

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "evals_without_improvement": self.evals_without_improvement}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.evals_without_improvement = state["best"], state["evals_without_improvement"]


@dataclass
class TargetMetric:
    """Stop once `metric` reaches `target` (at least it for "max", at most it for "min")."""

    metric: str
    mode: str
    target: float
    name: str = "target_metric"

    def on_eval(self, step: int, metrics: dict[str, float]) -> str | None:
        value = metrics[self.metric]
        reached = value >= self.target if self.mode == "max" else value <= self.target
        return "target_metric" if reached else None


def first_stop(hooks: list[EvalHook], step: int, metrics: dict[str, float]) -> str | None:
    """Every hook sees every evaluation (a stateful one must count it); the first reason given wins."""
    reasons = [hook.on_eval(step, metrics) for hook in hooks]
    return next((r for r in reasons if r is not None), None)


def resolve_metric(cfg: RunConfig, task: Task) -> RunConfig:
    """Fill in the task's default metric and mode; refuse a metric the task does not report."""
    name, mode = task.default_metric
    metric = cfg.metric or name
    if metric not in task.metrics:
        raise UserError(f"metric: task {task.name!r} reports {list(task.metrics)}, not {metric!r}. Fix: pick one of those")
    if cfg.metric_mode is None and metric != name:
        raise UserError(f"metric_mode: say whether {metric!r} is better when higher (max) or lower (min)")
    return cfg.model_copy(update={"metric": metric, "metric_mode": cfg.metric_mode or mode})



def resolved_metric(cfg: RunConfig) -> tuple[str, str]:
    """The run's metric and its mode, as resolve_metric filled them in (every run resolves them before it starts)."""
    if cfg.metric is None or cfg.metric_mode is None:
        raise ValueError("the run config's metric is not resolved: call resolve_metric first")
    return cfg.metric, cfg.metric_mode


def default_eval_hooks(cfg: RunConfig) -> list[EvalHook]:
    """The stop rules the run config asks for. A target reached wins over patience run out at the same evaluation."""
    out: list[EvalHook] = []
    metric, mode = resolved_metric(cfg)
    if cfg.target_metric is not None:
        out.append(TargetMetric(metric, mode, cfg.target_metric))
    if cfg.early_stopping_patience is not None:
        out.append(EarlyStopping(metric, mode, cfg.early_stopping_patience))
    return out
