"""Before anything starts: does the job fit the team's GPU quota, its cost limit and the team's budget?

A job that can never fit (more GPUs than the team's quota for every flavour it could use) is rejected with
the numbers; one that fits the quota but not today's free capacity is left to Kueue to queue. Quotas come
from the stack config offline (this module) or, on a cluster, from the Kueue ClusterQueue.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainforge.contract import Flavour
from trainforge.infra.config import PlatformConfig, TeamConfig
from trainforge.trainer.pricing import CostEstimate, PriceUnknown, estimate
from trainforge.trainer.spec import JobSpec


@dataclass
class Admission:
    flavour: Flavour | None
    gpus: int
    cost: CostEstimate | None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def admitted(self) -> bool:
        return not self.problems


def candidate_flavours(spec: JobSpec, platform: PlatformConfig) -> list[Flavour]:
    """Flavours the job may run on, in order of preference."""
    if spec.resources.gpus() == 0:
        return [Flavour.SYSTEM]
    instance = spec.resources.instance()
    efa_groups = [g for g in platform.node_groups if g.efa and instance is not None and instance.name in g.instance_types]
    on_demand = Flavour.GPU_EFA if (efa_groups and spec.workers.nodes > 1) else Flavour.GPU_ONDEMAND
    return {"spot": [Flavour.GPU_SPOT], "on-demand": [on_demand], "spot-fallback": [Flavour.GPU_SPOT, on_demand]}[spec.capacity]


def _offered(platform: PlatformConfig, flavour: Flavour, instance_type: str | None) -> bool:
    groups = [g for g in platform.node_groups if g.flavour is flavour]
    return bool(groups) and (instance_type is None or any(instance_type in g.instance_types for g in groups))


def _team(spec: JobSpec, platform: PlatformConfig, problems: list[str]) -> TeamConfig | None:
    team = next((t for t in platform.teams if t.name == spec.team), None)
    if team is None:
        problems.append(f"team: {spec.team!r} is not onboarded in the {platform.environment} stack "
                        f"(teams: {[t.name for t in platform.teams]}). Fix: use your team's name, or ask the platform team to add it")
    return team


def admit(spec: JobSpec, platform: PlatformConfig, *, spent_this_month_usd: float = 0.0) -> Admission:
    problems: list[str] = []
    instance = spec.resources.instance()
    per_node = spec.resources.gpus()
    gpus = per_node * spec.workers.nodes
    team = _team(spec, platform, problems)

    chosen: Flavour | None = None
    if team is not None and per_node > 0:
        reasons = []
        for flavour in candidate_flavours(spec, platform):
            quota = team.gpu_quota.get(flavour, 0)
            if not _offered(platform, flavour, instance.name if instance else None):
                reasons.append(f"no {flavour.value} node group offers {instance.name if instance else 'GPUs'}")
            elif gpus > quota:
                reasons.append(f"{gpus} {flavour.value} GPUs needed ({spec.workers.nodes} nodes x {per_node}), team {team.name!r} may use at most {quota}")
            else:
                chosen = flavour
                break
        if chosen is None:
            problems.append("resources: the job can never be scheduled: " + "; ".join(reasons) +
                            ". Fix: fewer nodes or GPUs per node, another capacity, or a larger quota from the platform team")

    cost = None
    if instance is not None:
        try:
            cost = estimate(instance.name, spec.workers.nodes, spec.limits.max_runtime_hours, spec.capacity, platform.region)
        except PriceUnknown as exc:
            problems.append(f"resources.instance_type: cannot estimate the cost: {exc}")
    elif per_node > 0:
        problems.append(f"resources.gpu_type: no catalogue instance has {per_node} x {spec.resources.gpu_type}. Fix: fewer GPUs per node")

    if cost is not None:
        expected = cost.expected_usd
        limit = spec.limits.max_cost_usd
        if limit is not None and expected > limit:
            problems.append(f"limits.max_cost_usd: the estimate is ${expected:,.2f} ({spec.workers.nodes} x {instance.name} x "
                            f"{spec.limits.max_runtime}), ${expected - limit:,.2f} over the limit of ${limit:,.2f}. "
                            "Fix: a shorter max_runtime, fewer nodes, spot capacity, or a higher limit")
        if team is not None:
            remaining = team.monthly_budget_usd - spent_this_month_usd
            if expected > remaining:
                problems.append(f"team budget: the estimate is ${expected:,.2f} but team {team.name!r} has ${remaining:,.2f} left of "
                                f"${team.monthly_budget_usd:,.2f} this month (${expected - remaining:,.2f} short). "
                                "Fix: a cheaper job, or a budget increase from the team's cost-centre owner")
    return Admission(chosen, gpus, cost, problems)
