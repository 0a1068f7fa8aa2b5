"""A sweep's limits after its start: `trainforge sweep extend` records raised limits in the study, as floors over the
spec's; a running controller takes them up at its next look, every later start reads them.

Exactly once, whoever extends at once: a member's extension is first written as a request of its own
(`extension.<id>`: one key, which no other write touches), then applied by `take_up_asked`: the raised limits and the
ids of the requests applied are one attribute, written together. Two writers that both read the old limits lose one
write, and with it that request's id, so the request is pending again; each writer looks again after its write, as
does a running controller at every look, so it is applied once more, and only once.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import optuna

from trainforge.trainer.sweeps.faults import pause_point
from trainforge.trainer.sweeps.spec import Sweep
from trainforge.trainer.sweeps.keys import StudyKey, extension_key, extension_of


# `trainforge sweep extend` records the raised limits in the study; they are floors over the spec's own (a spec asking
# for more raises them further), read by a running controller at its next look and by every later start.


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
    limits = Limits.of(sweep).raised_by(study.user_attrs.get(StudyKey.EXTENDED) or {})
    if limits == Limits.of(sweep):
        return sweep
    return sweep.with_limits(max_trials=limits.max_trials, usd=limits.usd, wall_time_s=limits.wall_time_s)


def recorded_limits(study: optuna.Study) -> Limits:
    """The limits of the latest start (its spec), raised by extensions: what `extend` adds to."""
    return _recorded(study.user_attrs)


def _recorded(attrs: dict[str, Any]) -> Limits:
    spec = json.loads(attrs.get(StudyKey.SPEC) or "{}")
    budget = spec.get("budget") or {}
    wall = budget.get("wall_time")
    from trainforge.trainer.sweeps.spec import parse_duration
    base = Limits(int(spec.get("max_trials", 0)), budget.get("usd"), None if wall is None else parse_duration(wall, "budget.wall_time"))
    return base.raised_by(attrs.get(StudyKey.EXTENDED) or {})


def taken_requests(study: optuna.Study) -> set[str]:
    """The ids of the members' extension requests already applied (a study from before they were kept with the
    limits holds them apart)."""
    return _taken(study.user_attrs)


def _taken(attrs: dict[str, Any]) -> set[str]:
    return set((attrs.get(StudyKey.EXTENDED) or {}).get("taken") or []) | set(attrs.get(StudyKey.EXTENSIONS_TAKEN) or [])


def take_up(study: optuna.Study, request: str, *, trials: int = 0, usd: float = 0.0, wall_time_s: float = 0.0) -> bool:
    """A member's extension request (a cluster sweep's controller takes them up from its TrainJob), applied once:
    False if it already was. Its id is written in the same attribute as the raised limits, so a controller killed
    after that write has taken it up and one killed before has not: never half, never twice."""
    return _raise(study, study.user_attrs, trials, usd, wall_time_s, request) is not None


def extend(study: optuna.Study, *, trials: int = 0, usd: float = 0.0, wall_time_s: float = 0.0) -> tuple[Limits, Limits]:
    """Raise the sweep's limits by these amounts (a limit the sweep never had stays unlimited); (before, after)."""
    raised = _raise(study, study.user_attrs, trials, usd, wall_time_s, None)
    assert raised is not None  # no request id: nothing to find taken
    return raised


def _raise(study: optuna.Study, attrs: dict[str, Any], trials: int, usd: float, wall_time_s: float,
           request: str | None) -> tuple[Limits, Limits] | None:
    """The limits raised from one read of the study (`attrs`): whether `request` was applied, the limits and the
    ids applied all come from that one read and go back in one write. Reading them apart let a write that landed
    in between pair a request's check with limits that already held it (applied twice), or one request's raise with
    another's missing id. None where `request` already was applied."""
    if request is not None and request in _taken(attrs):
        return None
    taken = list((attrs.get(StudyKey.EXTENDED) or {}).get("taken") or [])
    before = _recorded(attrs)
    pause_point("extend-read")  # read, not yet written: where two unguarded writers would lose one's extension
    after = Limits(before.max_trials + trials, None if before.usd is None else before.usd + usd,
                   None if before.wall_time_s is None else before.wall_time_s + wall_time_s)
    study.set_user_attr(StudyKey.EXTENDED, {"max_trials": after.max_trials, "usd": after.usd, "wall_time_s": after.wall_time_s,
                                            "at": time.time(), "taken": [*taken, *([request] if request else [])]})
    return before, after


ASK_ROUNDS = 16  # looks for requests still pending after a write (each round follows a write that landed)


def ask(study: optuna.Study, *, trials: int = 0, usd: float = 0.0, wall_time_s: float = 0.0) -> str:
    """Record a member's extension as a request of its own; its id. Nothing raised yet: take_up_asked applies it."""
    request = uuid.uuid4().hex
    study.set_user_attr(extension_key(request), {"trials": trials, "usd": usd, "wall_time_s": wall_time_s, "at": time.time()})
    return request


def take_up_asked(study: optuna.Study, attrs: dict[str, Any] | None = None) -> int:
    """Apply every extension asked in the study and not yet applied, each once; how many were. `attrs`: the study's
    attributes as just read (a controller's look), so that a study with nothing pending costs no second read."""
    applied = 0
    for _ in range(ASK_ROUNDS):
        attrs = study.user_attrs if attrs is None else attrs
        taken = set((attrs.get(StudyKey.EXTENDED) or {}).get("taken") or []) | set(attrs.get(StudyKey.EXTENSIONS_TAKEN) or [])
        pending = sorted(((value.get("at", 0.0), request, value) for key, value in attrs.items()
                          if (request := extension_of(key)) is not None and request not in taken), key=lambda p: (p[0], p[1]))
        if not pending:
            return applied
        for _, request, value in pending:
            applied += take_up(study, request, trials=int(value.get("trials", 0)), usd=float(value.get("usd", 0.0)),
                               wall_time_s=float(value.get("wall_time_s", 0.0)))
        attrs = None  # look again: a writer that read the limits before ours landed may have written over them
    return applied


CONTROLLER_SEEN_S = 30.0  # a controller that wrote its running time this recently is taken to be running


def controller_running(study: optuna.Study) -> bool:
    seen = study.user_attrs.get(StudyKey.CONTROLLER_SEEN_AT)
    return seen is not None and time.time() - float(seen) < CONTROLLER_SEEN_S and not study.user_attrs.get(StudyKey.FINISHED_BECAUSE)


