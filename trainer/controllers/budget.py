"""The monthly budget the cluster enforces: one pass of the budget controller.

Every few minutes: work out each team's month-to-date cost from OpenCost's allocation API (aggregated by namespace),
write spent / month / as-of into the team's settings ConfigMap,
and hold the team's Kueue ClusterQueue (`stopPolicy: Hold`: queued jobs wait, running ones finish) once the spend
reaches the budget; lift the hold when the month rolls over or the budget is raised. Every hold and release is a
Kubernetes Event in the team's namespace and a Prometheus metric.

Missing data changes nothing: if OpenCost cannot be read, or answers something that is not an allocation set for
the window asked, the pass holds and releases nobody and says why (a stale figure must not lock a team out, nor a
blind controller let one overspend). Only holds this controller set (its annotation on the ClusterQueue) are lifted
by it; a hold a platform engineer set by hand stays.

Month-to-date is durable. OpenCost computes from Prometheus, which keeps `monitoring.retention_days` (15 by default):
asked for the month so far on the 20th it would know only the last 15 days, the spend would shrink every day and a
held team would be released. So each whole UTC day, once an hour has passed since it ended (OpenCost's lag), is
*settled*: asked for once, its figure kept in the team's ConfigMap (`spent_days`) for the rest of the month. Spent is
the settled days plus the unsettled rest of the month asked for now; it only grows within a month, and a hold is
released only by a new month or a raised budget.

The decision (`decide`) is a pure function of the team's state and its spend; `BudgetController` does the I/O.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from trainforge import contract
from trainforge.errors import EXIT_FAILED, TrainforgeError
from trainforge.trainer.kube import rfc3339

if TYPE_CHECKING:
    from trainforge.trainer.kube import Cluster

log = logging.getLogger("trainforge.budget")
Action = Literal["hold", "release", "none"]
TEAM_LABEL = contract.LABEL_TEAM


class CostUnavailable(TrainforgeError):
    """OpenCost could not say what the teams spent: the pass changes nothing."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str):
        super().__init__("", [message])


def month_of(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m")


def month_start(moment: dt.datetime) -> dt.datetime:
    utc = moment.astimezone(dt.timezone.utc)
    return utc.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


SETTLE_LAG = dt.timedelta(hours=1)


def allocation(opencost_url: str, start: dt.datetime, end: dt.datetime, timeout_s: float = 20.0) -> dict[str, float]:
    """Cost per namespace in [start, end), as OpenCost allocates it.

    A namespace OpenCost does not list ran nothing in the window: it spent $0 (that is data, not missing data)."""
    window = f"{rfc3339(start)},{rfc3339(end)}"
    query = urllib.parse.urlencode({"window": window, "aggregate": "namespace", "accumulate": "true"})
    url = f"{opencost_url.rstrip('/')}/allocation?{query}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise CostUnavailable(f"OpenCost answered {exc.code} {exc.reason} for {url}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise CostUnavailable(f"OpenCost at {opencost_url} cannot be reached: {getattr(exc, 'reason', exc)}") from None
    except json.JSONDecodeError:
        raise CostUnavailable(f"OpenCost's answer from {url} is not JSON") from None
    return _namespace_costs(body, url)


def month_to_date(opencost_url: str, now: dt.datetime, timeout_s: float = 20.0) -> dict[str, float]:
    """Cost per namespace from the first of `now`'s month (UTC) to `now`, in one question (no settled days)."""
    return allocation(opencost_url, month_start(now), now, timeout_s)


def settled_until(now: dt.datetime) -> dt.datetime:
    """Days ending at or before this are settled: whole UTC days of this month that ended at least SETTLE_LAG ago."""
    cut = (now - SETTLE_LAG).astimezone(dt.timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return max(cut, month_start(now))


def days_between(start: dt.datetime, end: dt.datetime) -> list[dt.datetime]:
    out, day = [], start
    while day < end:
        out.append(day)
        day += dt.timedelta(days=1)
    return out


def _namespace_costs(body: Any, url: str) -> dict[str, float]:
    if not isinstance(body, dict) or body.get("code") != 200 or not isinstance(body.get("data"), list) or len(body["data"]) != 1:
        raise CostUnavailable(f"OpenCost's answer from {url} is not one accumulated allocation set (code {body.get('code') if isinstance(body, dict) else '?'})")
    (allocations,) = body["data"]
    costs: dict[str, float] = {}
    for name, allocation in (allocations or {}).items():
        total = allocation.get("totalCost") if isinstance(allocation, dict) else None
        if not isinstance(total, (int, float)) or total < 0:
            raise CostUnavailable(f"OpenCost's allocation for {name!r} has no usable totalCost ({total!r})")
        costs[name] = float(total)
    return costs


@dataclass(frozen=True)
class TeamBudget:
    """What the cluster says about one team: its budget and last recorded spend (the settings ConfigMap) and its
    ClusterQueue's hold."""

    team: str
    budget_usd: float
    spent_usd: float | None
    spent_month: str | None
    spent_as_of: str | None
    held: bool  # stopPolicy is Hold or HoldAndDrain, whoever set it
    held_for_budget: bool  # ... and it was this controller
    spent_days: dict[str, float] | None = None  # settled days of spent_month (SETTING_SPENT_DAYS)

    def settled(self, month: str) -> dict[str, float]:
        """The settled days recorded for `month` (none when the record is an earlier month's)."""
        return dict(self.spent_days or {}) if self.spent_month == month else {}

    @property
    def namespace(self) -> str:
        return contract.namespace_name(self.team)

    def spent_in(self, month: str) -> float:
        """The recorded spend if it is this month's; a figure from an earlier month says nothing about this one."""
        return self.spent_usd if self.spent_usd is not None and self.spent_month == month else 0.0


@dataclass(frozen=True)
class Decision:
    team: str
    action: Action
    reason: str
    spent_usd: float
    budget_usd: float
    month: str


def decide(team: TeamBudget, spent_usd: float, month: str) -> Decision:
    """Hold at the budget; release a hold of ours once under it (a new month, or a raised budget); else nothing."""
    over = spent_usd >= team.budget_usd
    figures = f"${spent_usd:,.2f} of ${team.budget_usd:,.2f} spent in {month}"
    if over and not team.held:
        return Decision(team.team, "hold", f"{figures}: the budget is reached; queued jobs wait, running ones finish",
                        spent_usd, team.budget_usd, month)
    if not over and team.held_for_budget:
        # In the same month a held team's spend does not fall, unless OpenCost revises it: so the budget rose.
        why = (f"a new month began ({month})" if team.spent_month not in (None, month)
               else "OpenCost revised the month's spend down" if team.spent_usd is not None and spent_usd < team.spent_usd
               else "the budget was raised")
        return Decision(team.team, "release", f"{figures}: {why}; queued jobs may start", spent_usd, team.budget_usd, month)
    return Decision(team.team, "none", figures, spent_usd, team.budget_usd, month)


class Metrics(Protocol):
    def observe(self, decision: Decision, held: bool) -> None: ...

    def pass_succeeded(self, at: dt.datetime) -> None: ...

    def cost_unavailable(self) -> None: ...


class BudgetController:
    """One pass over every team whose ClusterQueue carries the team label."""

    def __init__(self, cluster: Cluster, opencost_url: str = contract.OPENCOST_URL, metrics: Metrics | None = None):
        self.cluster, self.opencost_url, self.metrics = cluster, opencost_url, metrics

    def run_once(self, now: dt.datetime | None = None) -> list[Decision]:
        now = now or dt.datetime.now(dt.timezone.utc)
        month = month_of(now)
        teams = self.teams()
        try:
            settled, rest = self.costs(teams, now)
        except CostUnavailable as exc:
            log.warning("no budget changes this pass: %s", exc.problems[0])
            if self.metrics:
                self.metrics.cost_unavailable()
            raise
        decisions = []
        for team in teams:
            days = settled[team.team]
            decision = decide(team, round(sum(days.values()) + rest.get(team.namespace, 0.0), 2), month)
            self.apply(team, decision, now, days)
            decisions.append(decision)
        if self.metrics:
            self.metrics.pass_succeeded(now)
        return decisions

    def costs(self, teams: list[TeamBudget], now: dt.datetime) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
        """(each team's settled days this month, each namespace's cost since the last settled day). A day some team has
        not settled yet is asked for once, for all; a day already settled is never asked again."""
        month = month_of(now)
        cut = settled_until(now)
        settled = {team.team: team.settled(month) for team in teams}
        for day in days_between(month_start(now), cut):
            key = day.strftime("%Y-%m-%d")
            if all(key in days for days in settled.values()):
                continue
            costs = allocation(self.opencost_url, day, day + dt.timedelta(days=1))
            for team in teams:
                settled[team.team].setdefault(key, round(costs.get(team.namespace, 0.0), 4))
        rest = allocation(self.opencost_url, cut, now) if now > cut else {}
        return settled, rest

    def teams(self) -> list[TeamBudget]:
        found = []
        for queue in self.cluster.list_cluster_queues(label_selector=TEAM_LABEL):
            team = queue["metadata"]["labels"][TEAM_LABEL]
            settings = self.cluster.team_settings(team)
            if settings is None or contract.SETTING_BUDGET_USD not in settings:
                log.warning("team %s: no %s in namespace %s; skipped", team, contract.TEAM_SETTINGS_CONFIG_MAP, contract.namespace_name(team))
                continue
            found.append(team_budget(team, settings, queue))
        return found

    def apply(self, team: TeamBudget, decision: Decision, now: dt.datetime, settled_days: dict[str, float] | None = None) -> None:
        self.cluster.patch_team_settings(team.team, {contract.SETTING_SPENT_USD: f"{decision.spent_usd:.2f}",
                                                     contract.SETTING_SPENT_MONTH: decision.month,
                                                     contract.SETTING_SPENT_AS_OF: rfc3339(now),
                                                     contract.SETTING_SPENT_DAYS: json.dumps(dict(sorted((settled_days or {}).items())))})
        held = team.held
        if decision.action == "hold":
            self.cluster.set_queue_hold(team.team, hold=True, note=decision.reason)
            held = True
        elif decision.action == "release":
            self.cluster.set_queue_hold(team.team, hold=False)
            held = False
        if decision.action != "none":
            reason = "BudgetReached" if decision.action == "hold" else "BudgetReleased"
            self.cluster.record_event(team.team, reason=reason, message=f"ClusterQueue {contract.cluster_queue_name(team.team)} "
                                      f"{'held' if decision.action == 'hold' else 'released'}: {decision.reason}",
                                      warning=decision.action == "hold", at=now)
            log.info("team %s: %s (%s)", team.team, decision.action, decision.reason)
        if self.metrics:
            self.metrics.observe(decision, held)


def is_held(queue: dict[str, Any]) -> bool:
    """Kueue admits nothing new from a ClusterQueue whose stopPolicy is Hold or HoldAndDrain."""
    return queue.get("spec", {}).get("stopPolicy", "None") in ("Hold", "HoldAndDrain")


def team_budget(team: str, settings: dict[str, str], queue: dict[str, Any]) -> TeamBudget:
    def number(key: str) -> float | None:
        try:
            return float(settings[key]) if settings.get(key) not in (None, "") else None
        except ValueError:
            return None
    budget = number(contract.SETTING_BUDGET_USD)
    if budget is None:
        raise TrainforgeError("", [f"team {team}: {contract.SETTING_BUDGET_USD}={settings.get(contract.SETTING_BUDGET_USD)!r} in "
                                   f"{contract.TEAM_SETTINGS_CONFIG_MAP} is not a number. Fix: `pulumi up` rewrites it from the stack"])
    annotations = queue["metadata"].get("annotations") or {}
    held = is_held(queue)
    return TeamBudget(team, budget, number(contract.SETTING_SPENT_USD), settings.get(contract.SETTING_SPENT_MONTH),
                      settings.get(contract.SETTING_SPENT_AS_OF), held, held and contract.BUDGET_HOLD_ANNOTATION in annotations,
                      _settled_days(settings.get(contract.SETTING_SPENT_DAYS)))


def _settled_days(text: str | None) -> dict[str, float] | None:
    """The recorded settled days; a record that is not a {day: usd} map counts as none (those days are asked again)."""
    try:
        days = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(days, dict) or not all(isinstance(v, (int, float)) and v >= 0 for v in days.values()):
        return None
    return {str(k): float(v) for k, v in days.items()}


class PrometheusMetrics:
    """The controller's gauges and counters, served on /metrics for the platform's Prometheus (the budget alerts)."""

    def __init__(self, registry=None):
        from prometheus_client import CollectorRegistry, Counter, Gauge
        self.registry = registry or CollectorRegistry()
        self.budget = Gauge("trainforge_team_budget_usd", "The team's monthly budget", ["team"], registry=self.registry)
        self.spent = Gauge("trainforge_team_spent_usd", "Month-to-date cost of the team's namespace (OpenCost)", ["team"],
                           registry=self.registry)
        self.held = Gauge("trainforge_team_budget_held", "1 while the team's ClusterQueue is held", ["team"], registry=self.registry)
        self.changes = Counter("trainforge_budget_changes", "Holds and releases", ["team", "action"], registry=self.registry)
        self.last_pass = Gauge("trainforge_budget_last_pass_timestamp_seconds", "When the last complete pass ended", registry=self.registry)
        self.unavailable = Counter("trainforge_budget_cost_unavailable", "Passes skipped: OpenCost gave no usable data",
                                   registry=self.registry)

    def observe(self, decision: Decision, held: bool) -> None:
        self.budget.labels(decision.team).set(decision.budget_usd)
        self.spent.labels(decision.team).set(decision.spent_usd)
        self.held.labels(decision.team).set(1 if held else 0)
        if decision.action != "none":
            self.changes.labels(decision.team, decision.action).inc()

    def pass_succeeded(self, at: dt.datetime) -> None:
        self.last_pass.set(at.timestamp())

    def cost_unavailable(self) -> None:
        self.unavailable.inc()
