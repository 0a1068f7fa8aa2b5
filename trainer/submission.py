"""What every job passes before it is created, whichever path creates it: `submit` and `check`, a sweep's trials
(local, or launched by the controller in the cluster), a sweep's controller, the promoted best trial. Admission
(trainer/admission.py) judges quota, cost limit and budget; this module gathers what it judges by — the cluster's
live queue where the job goes to a cluster, and the team's spend this month against its budget — so no path admits
as if the team had spent nothing (a team over its budget was refused by `check` while its sweep launched trials)."""

from __future__ import annotations

from typing import Any

from trainforge.stackconfig import PlatformConfig
from trainforge.trainer.admission import Admission, admit
from trainforge.trainer.spec import JobSpec


def to_cluster(target: Any) -> bool:
    """Whether the job goes to a cluster (a backend with a live queue and the budget controller's figures)."""
    return target is not None and hasattr(target, "live_queue") and hasattr(target, "budget")


def month_spend(team: str, *, spent: float | None = None, target: Any = None, queue: dict | None = None) -> tuple[float, float | None]:
    """The team's spend this month and, from a cluster, its budget there: as given, else what the cluster's budget
    controller recorded (so the CLI and the cluster agree), else what the team's local jobs cost."""
    budget = None
    if to_cluster(target):
        recorded = target.budget(team, queue=queue)
        budget = recorded.budget_usd
        if spent is None:
            spent = recorded.spent_usd
    if spent is not None:
        return spent, budget
    from trainforge.trainer import ledger
    from trainforge.trainer.backends.local_records import all_jobs
    return ledger.spent_this_month(team, all_jobs()), budget


def admit_now(spec: JobSpec, platform: PlatformConfig, target: Any = None, *, spent: float | None = None,
              live_queue: dict | None = None) -> Admission:
    """Would `spec` (its image already filled in) be admitted now where `target` runs it: on a cluster against its
    live queue (`live_queue`, where the caller has just read it) and recorded spend; locally against the team's local
    jobs' cost this month. `spent` overrides the month's spend (the CLI's --spent)."""
    live = (live_queue if live_queue is not None else target.live_queue(spec.team)) if to_cluster(target) else None
    used, budget = month_spend(spec.team, spent=spent, target=target, queue=live)
    return admit(spec, platform, spent_this_month_usd=used, budget_usd=budget, live_queue=live)
