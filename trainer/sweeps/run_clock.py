"""How long a trial's job ran: admitted and running, never queued. A trial on a busy cluster waits in Kueue's queue,
is suspended when preempted and readmitted later; what it costs and how long it ran are its running intervals alone,
so a congested cluster neither ends a sweep early on its USD budget nor makes the cost objective measure congestion.

Each interval is timed by the job's own conditions where the cluster gives them (TrainJob `Suspended` False/True,
PyTorchJob `Running`, the end's `Complete`/`Failed`), so a controller that was down while a trial ended or was
preempted still counts the right span; where no condition dates a change, the controller's look does. The clock lives
in the study (the source of truth a restarted controller reads), written only when a trial starts or stops running:

- `trial.<n>.running_since`: epoch seconds, while its job runs;
- `trial.<n>.ran_s`: its closed running intervals so far;
- `trial.<n>.queued_s`: from its trial's start (the job's creation) to its first running moment, shown apart.

An interval whose end the controller did not see (suspended and readmitted while it was down) is counted whole: the
clock may overstate a trial's time, never understate what it spent."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainforge.trainer.sweeps.keys import TrialFact, fact_key, fact_of

if TYPE_CHECKING:  # the backends (and admission under them) only where a job is looked at: study.py reads the keys
    from trainforge.trainer.backends import JobReport

ADMITTED_CONDITIONS = ("Running",)  # PyTorchJob; a TrainJob's admission is its Suspended condition turning False
END_CONDITIONS = ("Complete", "Succeeded", "Failed")
CLOCK_FACTS = (TrialFact.RUNNING_SINCE, TrialFact.RAN_S, TrialFact.QUEUED_S)


def clocks_of(attrs: dict[str, Any]) -> dict[str, Any]:
    """The run clocks among a study's attributes."""
    return {k: v for k, v in attrs.items() if (fact := fact_of(k)) is not None and fact[1] in CLOCK_FACTS}


@dataclass(frozen=True)
class Seen:
    """One look at a trial's job: whether it runs, and when its current phase began (by its conditions where they
    say, else the look's own time)."""

    running: bool
    ended: bool
    at: float
    admitted_at: float | None = None  # when its conditions say it was last admitted (where they say)


def _epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _condition_time(status: dict[str, Any], types: tuple[str, ...], true: bool) -> float | None:
    wanted = "True" if true else "False"
    times = [_epoch(c.get("lastTransitionTime")) for c in status.get("conditions") or []
             if c.get("type") in types and c.get("status") == wanted]
    known = [t for t in times if t is not None]
    return max(known) if known else None


def seen(report: JobReport | None, now: float) -> Seen:
    """What a look at a job says of its clock. `report` None: the job is gone (deleted, never created): ended now."""
    from trainforge.trainer.backends import ClusterObject, JobPhase
    if report is None:
        return Seen(running=False, ended=True, at=now)
    running = report.state in (JobPhase.RUNNING, JobPhase.RESTARTING)  # a restarting job's pods still hold their nodes
    ended = report.state.ended
    status = report.details.status if isinstance(report.details, ClusterObject) else {}
    admitted = _condition_time(status, ADMITTED_CONDITIONS, True) or _condition_time(status, ("Suspended",), False)
    if ended:
        at = _condition_time(status, END_CONDITIONS, True)
    elif running:
        at = admitted
    else:
        at = _condition_time(status, ("Suspended",), True)
    return Seen(running, ended, min(at, now) if at is not None else now, admitted)


def observe(attrs: dict[str, Any], number: int, look: Seen, started: float | None) -> dict[str, Any]:
    """The study attributes to write after a look (empty when nothing changed). `attrs`: the study's attributes as
    read; `started`: when the trial started (its job's creation), for the queue time."""
    since = attrs.get(fact_key(number, TrialFact.RUNNING_SINCE))
    if look.running and since is None:
        out: dict[str, Any] = {fact_key(number, TrialFact.RUNNING_SINCE): look.at}
        if fact_key(number, TrialFact.QUEUED_S) not in attrs and started is not None:
            out[fact_key(number, TrialFact.QUEUED_S)] = round(max(0.0, look.at - started), 3)
        return out
    if not look.running and since is not None:
        ran = float(attrs.get(fact_key(number, TrialFact.RAN_S)) or 0.0) + max(0.0, look.at - float(since))
        return {fact_key(number, TrialFact.RAN_S): round(ran, 3), fact_key(number, TrialFact.RUNNING_SINCE): None}
    return {}


def ran_s(attrs: dict[str, Any], number: int, last: Seen) -> float | None:
    """Its running time once its job has ended (`attrs` after `observe(..., last)`): its closed intervals; a job no
    look saw running (it ran and ended between looks, or while no controller was up) ran from its last admission to
    its end where its conditions date both. None where nothing dates it: the caller falls back to the trial's own
    start and end."""
    if fact_key(number, TrialFact.RAN_S) in attrs:
        return float(attrs[fact_key(number, TrialFact.RAN_S)])
    if last.admitted_at is not None and last.ended:
        return round(max(0.0, last.at - last.admitted_at), 3)
    return None
