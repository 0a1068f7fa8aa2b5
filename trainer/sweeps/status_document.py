"""What a cluster sweep's controller publishes on its TrainJob and what a member reads there: one typed record.

The controller (trainer/controllers/sweep.py) writes a `StatusDocument` (or, where it could not start, a
`ControllerFailed`) into the TrainJob's status annotation, gzip + base64 JSON; `status`, `best`, `report`, `cancel` and
`resume` (trainer/sweeps/targets.py) read it back with `published(job)`. Both sides go through these classes, so a
field is named once. A document written by an earlier controller reads the same: a key this version does not know is
ignored, one it does not find takes its default; one without the fields every document has is refused as damaged.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import gzip
import json
import zlib
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from trainforge import contract
from trainforge.errors import EXIT_FAILED, TrainforgeError
from trainforge.trainer.sweeps.study import TrialRow


@dataclass
class ShownTrial(TrialRow):
    """A trial as the status object shows it: its row (study.rows) and its evaluations by step (empty where the
    curves did not fit; JSON keys are strings)."""
    intermediate: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Selection:
    """How a bounded document chose its trials (beyond STATUS_EVERY_TRIAL): how many are the best, how many are
    running or waiting, how many the newest (the sets overlap)."""
    best: int
    alive: int
    newest: int


@dataclass(frozen=True)
class StatusDocument:
    sweep: str
    direction: str  # the first objective's
    metric: str
    space: dict[str, Any]  # the spec's search space, as JSON (what the member's study is rebuilt over)
    directions: list[str] = field(default_factory=list)  # every objective's; older documents: the first alone
    second_metric: Optional[str] = None
    planned: int = 0
    counted: int = 0
    running: int = 0
    spent_usd: float = 0.0
    budget_usd: Optional[float] = None
    wall_time: Optional[str] = None
    finished_because: Optional[str] = None
    mlflow_run_id: Optional[str] = None
    updated_at: float = 0.0
    trials_total: Optional[int] = None  # every trial of the study, shown or not
    counts: dict[str, int] = field(default_factory=dict)  # every trial, by state
    best: list[int] = field(default_factory=list)  # the best trials' numbers (the Pareto front's, with two objectives)
    shown: Optional[Selection] = None  # None: every trial is shown
    truncated: Optional[str] = None  # what was left out to fit the annotation
    trials: list[ShownTrial] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.trials_total if self.trials_total is not None else len(self.trials)

    def holds(self) -> Optional[str]:
        """Which trials the document holds, for a person; None where it holds every one."""
        if self.shown is None:
            return None
        counts = ", ".join(f"{n} {state}" for state, n in sorted(self.counts.items()))
        return (f"{len(self.trials)} of {self.total} trials ({counts}): the best {self.shown.best}, the {self.shown.alive} running "
                f"or waiting and the newest {self.shown.newest}" + (f"; {self.truncated} left out to fit" if self.truncated else ""))

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> StatusDocument:
        trials = [ShownTrial(**_known(ShownTrial, t)) for t in raw.get("trials") or []]
        shown = Selection(**_known(Selection, raw["shown"])) if raw.get("shown") else None
        found = {**_known(cls, raw), "trials": trials, "shown": shown}
        found["directions"] = found.get("directions") or [raw["direction"]]
        return cls(**found)


@dataclass(frozen=True)
class ControllerFailed:
    """Published instead of a status document by a controller that could not start (the study refused the spec)."""
    error: str
    updated_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


Published = Union[StatusDocument, ControllerFailed]


def _known(kind: Any, raw: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(kind)}
    return {k: v for k, v in raw.items() if k in names}


def encode(document: Published) -> str:
    return base64.b64encode(gzip.compress(json.dumps(document.to_json(), separators=(",", ":"), default=str).encode(), mtime=0)).decode()


def decode(text: str) -> Published:
    try:
        raw = json.loads(gzip.decompress(base64.b64decode(text)))
        if not isinstance(raw, dict):
            raise TypeError(f"a JSON object was expected, not {type(raw).__name__}")
        if "error" in raw:
            return ControllerFailed(**_known(ControllerFailed, raw))
        return StatusDocument.from_json(raw)
    except (ValueError, TypeError, KeyError, OSError, EOFError, binascii.Error, zlib.error) as exc:
        raise TrainforgeError("", [f"the sweep controller's status annotation {contract.SWEEP_STATUS_ANNOTATION} is damaged "
                                   f"({type(exc).__name__}: {exc}). Fix: the controller writes it anew within seconds while it runs; "
                                   "`trainforge sweep resume NAME` starts a controller that does"], exit_code=EXIT_FAILED) from None


def published(job: dict[str, Any]) -> Optional[Published]:
    """What the controller's TrainJob `job` says of its sweep; None before its first report."""
    text = ((job.get("metadata") or {}).get("annotations") or {}).get(contract.SWEEP_STATUS_ANNOTATION)
    return decode(text) if text else None
