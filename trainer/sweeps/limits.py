"""A sweep's limits after its start: `trainforge sweep extend` records raised limits in the study, as floors over the
spec's; a running controller takes them up at its next look, every later start reads them."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import optuna

from trainforge.trainer.sweeps.faults import pause_point
from trainforge.trainer.sweeps.spec import Sweep


# `trainforge sweep extend` records the raised limits in the study; they are floors over the spec's own (a spec asking
# for more raises them further), read by a running controller at its next look and by every later start.
EXTENDED = "extended"


@dataclass(frozen=True)
class Limits:
    max_trials: int
    usd: float | None
    wall_time_s: float | None

    @classmethod
    def of(cls, sweep: Sweep) -> Limits:
        return cls(sweep.spec.max_trials, sweep.spec.budget.usd, sweep.spec.budget.wall_time_s)

    def raised_by(self, floor: dict[str, Any]) -> Limits:
        def higher(mine: float | None, theirs: float | None) -> float | None:
            if mine is None or theirs is None:
                return mine  # unlimited stays unlimited; no extension leaves the spec's
            return max(mine, theirs)
        return Limits(max(self.max_trials, int(floor.get("max_trials") or 0)), higher(self.usd, floor.get("usd")),
                      higher(self.wall_time_s, floor.get("wall_time_s")))


def in_effect(sweep: Sweep, study: optuna.Study) -> Sweep:
    """The sweep under the limits in effect: the spec's, raised by any extension recorded in the study."""
    limits = Limits.of(sweep).raised_by(study.user_attrs.get(EXTENDED) or {})
    if limits == Limits.of(sweep):
        return sweep
    return sweep.with_limits(max_trials=limits.max_trials, usd=limits.usd, wall_time_s=limits.wall_time_s)


def recorded_limits(study: optuna.Study) -> Limits:
    """The limits of the latest start (its spec), raised by extensions: what `extend` adds to."""
    spec = json.loads(study.user_attrs.get("spec") or "{}")
    budget = spec.get("budget") or {}
    wall = budget.get("wall_time")
    from trainforge.trainer.sweeps.spec import parse_duration
    base = Limits(int(spec.get("max_trials", 0)), budget.get("usd"), None if wall is None else parse_duration(wall, "budget.wall_time"))
    return base.raised_by(study.user_attrs.get(EXTENDED) or {})


def taken_requests(study: optuna.Study) -> set[str]:
    """The ids of the members' extension requests already applied (a study from before they were kept with the
    limits holds them apart)."""
    attrs = study.user_attrs
    return set((attrs.get(EXTENDED) or {}).get("taken") or []) | set(attrs.get("extensions_taken") or [])


def take_up(study: optuna.Study, request: str, *, trials: int = 0, usd: float = 0.0, wall_time_s: float = 0.0) -> bool:
    """A member's extension request (a cluster sweep's controller takes them up from its TrainJob), applied once:
    False if it already was. Its id is written in the same attribute as the raised limits, so a controller killed
    after that write has taken it up and one killed before has not: never half, never twice."""
    if request in taken_requests(study):
        return False
    extend(study, trials=trials, usd=usd, wall_time_s=wall_time_s, request=request)
    return True


def extend(study: optuna.Study, *, trials: int = 0, usd: float = 0.0, wall_time_s: float = 0.0,
           request: str | None = None) -> tuple[Limits, Limits]:
    """Raise the sweep's limits by these amounts (a limit the sweep never had stays unlimited); (before, after).
    `request`: the id of the member's request this applies (take_up), recorded with the limits."""
    taken = list((study.user_attrs.get(EXTENDED) or {}).get("taken") or [])
    before = recorded_limits(study)
    pause_point("extend-read")  # read, not yet written: where two unguarded writers would lose one's extension
    after = Limits(before.max_trials + trials, None if before.usd is None else before.usd + usd,
                   None if before.wall_time_s is None else before.wall_time_s + wall_time_s)
    study.set_user_attr(EXTENDED, {"max_trials": after.max_trials, "usd": after.usd, "wall_time_s": after.wall_time_s,
                                   "at": time.time(), "taken": [*taken, *([request] if request else [])]})
    return before, after


CONTROLLER_SEEN_S = 30.0  # a controller that wrote its running time this recently is taken to be running


def controller_running(study: optuna.Study) -> bool:
    seen = study.user_attrs.get("controller_seen_at")
    return seen is not None and time.time() - float(seen) < CONTROLLER_SEEN_S and not study.user_attrs.get("finished_because")


