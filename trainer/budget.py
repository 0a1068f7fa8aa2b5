"""The monthly budget the cluster enforces: one pass of the budget controller.

Every few minutes: read each team's month-to-date cost from OpenCost's allocation API (aggregated by namespace,
the window from the first of the month, UTC, to now), write spent / month / as-of into the team's settings ConfigMap,
and hold the team's Kueue ClusterQueue (`stopPolicy: Hold`: queued jobs wait, running ones finish) once the spend
reaches the budget; lift the hold when the month rolls over or the budget is raised. Every hold and release is a
Kubernetes Event in the team's namespace and a Prometheus metric.

Missing data changes nothing: if OpenCost cannot be read, or answers something that is not an allocation set for
the window asked, the pass holds and releases nobody and says why (a stale figure must not lock a team out, nor a
blind controller let one overspend). Only holds this controller set (its annotation on the ClusterQueue) are lifted
by it; a hold a platform engineer set by hand stays.

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

if TYPE_CHECKING:
    from trainforge.trainer.backends.kubernetes import Cluster

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


def rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def month_to_date(opencost_url: str, now: dt.datetime, timeout_s: float = 20.0) -> dict[str, float]:
    """Cost per namespace from the first of `now`'s month (UTC) to `now`, as OpenCost allocates it.

    A namespace OpenCost does not list ran nothing in the window: it spent $0 (that is data, not missing data)."""
    window = f"{rfc3339(month_start(now))},{rfc3339(now)}"
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
        try:
            costs = month_to_date(self.opencost_url, now)
        except CostUnavailable as exc:
            log.warning("no budget changes this pass: %s", exc.problems[0])
            if self.metrics:
                self.metrics.cost_unavailable()
            raise
        decisions = []
        for team in self.teams():
            decision = decide(team, costs.get(team.namespace, 0.0), month)
            self.apply(team, decision, now)
            decisions.append(decision)
        if self.metrics:
            self.metrics.pass_succeeded(now)
        return decisions

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

    def apply(self, team: TeamBudget, decision: Decision, now: dt.datetime) -> None:
        self.cluster.patch_team_settings(team.team, {contract.SETTING_SPENT_USD: f"{decision.spent_usd:.2f}",
                                                     contract.SETTING_SPENT_MONTH: decision.month,
                                                     contract.SETTING_SPENT_AS_OF: rfc3339(now)})
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
                      settings.get(contract.SETTING_SPENT_AS_OF), held, held and contract.BUDGET_HOLD_ANNOTATION in annotations)


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
