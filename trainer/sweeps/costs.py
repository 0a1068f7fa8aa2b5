"""What a sweep's trial costs: at most (its admission's estimate, which the USD budget reserves before it starts) and
in the end (the backend's own figure where it keeps one, else the estimate scaled by how long the trial ran)."""

from __future__ import annotations

import datetime
import optuna

from trainforge.trainer.admission import Admission
from trainforge.trainer.backends import JobReport, LocalRun
from trainforge.trainer.spec import JobSpec
from trainforge.trainer.sweeps.keys import TrialKey


def trial_estimate(spec: JobSpec, decision: Admission) -> float:
    """What a trial may cost at most: the admission's estimate (its max_runtime on its instance type); without a
    stack, the same at the price table's first region — where the local ledger prices local jobs too."""
    if decision.cost is not None:
        return decision.cost.expected_usd
    where = decision.placement
    if where.instance is None:
        return 0.0
    from trainforge.pricing import PriceUnknown, estimate, price_table
    try:
        return estimate(where.instance.name, where.nodes, spec.limits.max_runtime_hours, spec.capacity,
                        where.region or price_table().regions[0]).expected_usd
    except PriceUnknown:
        return 0.0


def trial_cost(report: JobReport | None, trial: optuna.trial.FrozenTrial, max_runtime_hours: float,
               ran_s: float | None) -> tuple[float, float | None]:
    """What the trial's job cost, and how many seconds it ran where known: the backend's own figure where it keeps one
    (local: node-hours x price), else the estimate scaled by its running time (`ran_s`, run_clock: queue and
    suspension excluded), else by its trial's start to end (a job nothing dated)."""
    if report is not None and isinstance(report.details, LocalRun) and report.details.cost.get("cost_usd") is not None:
        return float(report.details.cost["cost_usd"]), report.details.run_seconds
    estimate = float(trial.user_attrs.get(TrialKey.ESTIMATE_USD, 0.0))
    ran = ran_s
    if ran is None:
        ended = trial.datetime_complete or (datetime.datetime.now() if trial.datetime_start else None)  # a trial the controller tells
        ran = (ended - trial.datetime_start).total_seconds() if ended and trial.datetime_start else None
    return (estimate * min(1.0, ran / (max_runtime_hours * 3600)) if ran is not None else estimate), ran
