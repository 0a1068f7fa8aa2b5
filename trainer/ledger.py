"""What jobs cost and what a team has spent: node-hours x the price of the job's instance type in its region.

A job admitted against a stack is priced in that stack's region; one submitted without a stack has no region, so
the price table's first (reference) region stands in, and every figure says which region was used.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

from trainforge.pricing import PriceUnknown, price_table


class Priced(Protocol):
    """What the ledger reads of a job's record (the local backend's JobState)."""

    name: str
    team: str
    nodes: int
    run_seconds: float
    instance_type: str | None
    capacity: str
    region: str | None
    created_at: float
    started_at: float | None


def job_cost(job: Priced) -> dict:
    """AWS-equivalent cost of the node-hours a job used: on-demand, spot, and as submitted (spot-fallback at on-demand).
    Unrounded: a job of a few seconds on a cheap instance costs well under $0.0001, and rounded here it read as free to
    what sums or compares it (a sweep's cost objective, a team's month); the views round for display."""
    hours = job.nodes * job.run_seconds / 3600
    out: dict[str, Any] = {"node_hours": hours, "on_demand_usd": None, "spot_usd": None, "cost_usd": None, "priced_in": None}
    if job.instance_type:
        try:
            table = price_table()
            out["priced_in"] = job.region or table.regions[0]
            quote = table.quote(job.instance_type, out["priced_in"])
        except PriceUnknown:
            return out
        on_demand, spot = quote.on_demand * hours, quote.spot * hours
        out.update(on_demand_usd=on_demand, spot_usd=spot, cost_usd=quote.hourly(job.capacity) * hours, savings_usd=on_demand - spot)
    return out


def started_at(job: Priced) -> float:
    return job.started_at or job.created_at


def month_start(now: datetime.datetime | None = None) -> float:
    """The start of this budget month as a timestamp: a UTC month, as the cluster's budget controller counts it
    (trainer/controllers/budget.py), so `check` on a laptop and the cluster agree near a month's end whatever the local time zone."""
    from trainforge.trainer.controllers.budget import month_start as utc_month_start
    return utc_month_start(now or datetime.datetime.now(datetime.timezone.utc)).timestamp()


def spent_this_month(team: str, jobs: Iterable[Priced], now: datetime.datetime | None = None) -> float:
    start = month_start(now)
    return sum(job_cost(j)["cost_usd"] or 0.0 for j in jobs if j.team == team and started_at(j) >= start)


@dataclass
class CostReport:
    jobs: list[dict]
    teams: list[dict]


def cost_report(jobs: Iterable[Priced], states: dict[str, str] | None = None) -> CostReport:
    """Per job and per team: node-hours, as submitted, on-demand, and what spot saved."""
    per_job = [{"name": j.name, "team": j.team, "state": (states or {}).get(j.name, ""), "instance_type": j.instance_type,
                "capacity": j.capacity, **job_cost(j)} for j in jobs]
    teams: dict[str, dict] = {}
    for r in per_job:
        t = teams.setdefault(r["team"], {"team": r["team"], "jobs": 0, "node_hours": 0.0, "cost_usd": 0.0, "on_demand_usd": 0.0})
        t["jobs"] += 1
        t["node_hours"] += r["node_hours"]
        t["cost_usd"] += r["cost_usd"] or 0.0
        t["on_demand_usd"] += r["on_demand_usd"] or 0.0
    summary = [{**t, "savings_usd": t["on_demand_usd"] - t["cost_usd"]} for t in teams.values()]
    return CostReport(per_job, summary)
