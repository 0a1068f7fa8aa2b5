"""Before anything starts: does the job fit the team's GPU quota, its cost limit and the team's budget?

A job that can never run is rejected with the numbers: when no node group's template node would take one of its pods
(trainforge.nodes: the autoscaler would never scale up for it), or when Kueue's rule (trainforge.kueue.assign) over
the rendered workload and the team's ClusterQueue says it can never be admitted. One that fits but not today's free
capacity is left to Kueue to queue. Queues come from the stack offline, or on a cluster the team's live ClusterQueue.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainforge import contract, kueue
from trainforge.contract import Flavour
from trainforge.errors import EXIT_NOT_ADMITTED, TrainforgeError
from trainforge.pricing import CostEstimate, PriceUnknown, estimate
from trainforge.stackconfig import PlatformConfig, TeamConfig
from trainforge.trainer import placement as placing
from trainforge.trainer.placement import Placement
from trainforge.trainer.render import render
from trainforge.trainer.spec import JobSpec


@dataclass
class Admission:
    placement: Placement
    flavour: Flavour | None  # the flavour whose quota the job is charged to (Kueue may pick another candidate with room)
    cost: CostEstimate | None
    problems: list[str] = field(default_factory=list)
    live_queue: dict | None = None  # the cluster's ClusterQueue it was decided over, if any

    @property
    def admitted(self) -> bool:
        return not self.problems

    @property
    def gpus(self) -> int:
        return self.placement.gpus


class NotAdmitted(TrainforgeError):
    """The job would break a rule (quota, cost limit, budget): nothing was created or started."""

    exit_code = EXIT_NOT_ADMITTED

    def __init__(self, name: str, problems: list[str], nothing_was: str = "created"):
        super().__init__(name, problems)
        self.nothing_was = nothing_was

    def _message(self) -> str:
        return f"job {self.source!r} not admitted; nothing was {getattr(self, 'nothing_was', 'created')}:\n" + \
            "\n".join(f"  - {p}" for p in self.problems)


def unchecked(spec: JobSpec) -> Admission:
    """A local job run without a stack: placed by the catalogue, no quota or budget to check."""
    where = placing.decide(spec, None)
    return Admission(where, where.preferred, None, [])


def team_of(spec: JobSpec, platform: PlatformConfig) -> TeamConfig | None:
    return next((t for t in platform.teams if t.name == spec.team), None)


def _team(spec: JobSpec, platform: PlatformConfig, problems: list[str]) -> TeamConfig | None:
    team = team_of(spec, platform)
    if team is None:
        problems.append(f"team: {spec.team!r} is not onboarded in the {platform.environment} stack "
                        f"(teams: {[t.name for t in platform.teams]}). Fix: use your team's name, or ask the platform team to add it")
    return team


def _never_placed(spec: JobSpec, platform: PlatformConfig, problems: list[str]) -> None:
    """No node group of any candidate flavour would take a pod of the job: Kueue might admit it, the pods would stay
    Pending for ever (the autoscaler grows only groups whose template node holds the pod)."""
    reasons = [f"{flavour.value}: {'; '.join(placing.group_problems(spec, platform, flavour))}"
               for flavour in placing.preferred_flavours(spec, platform)]
    problems.append("resources: no node group can run a pod of this job (the cluster-autoscaler sizes a group by its first "
                    "instance type): " + " | ".join(reasons) + ". Fix: a GPU model and cpu/memory per node that a group of the "
                    "stack offers (`trainforge check` lists the groups), another capacity, or a new node group from the platform team")


def _kueue_verdict(spec: JobSpec, platform: PlatformConfig, where: Placement, live_queue: dict | None,
                   problems: list[str]) -> Flavour | None:
    """Kueue's own rule (trainforge.kueue.assign) over the workload as rendered and the team's ClusterQueue: the live
    one when given (the cluster wins where it differs from the stack), in the stack's cohort."""
    cohort = kueue.stack_queues(platform)
    name = contract.cluster_queue_name(spec.team)
    own = live_queue or next(q for q in cohort if q["metadata"]["name"] == name)
    cohort = [own if q["metadata"]["name"] == name else q for q in cohort]
    flavors = {f["metadata"]["name"]: f for f in kueue.resource_flavors(platform)}
    verdict = kueue.assign(kueue.pod_sets(render(spec, where)), own, cohort=cohort, flavors=flavors)
    if verdict.admitted and verdict.flavours:
        return Flavour(next(iter(verdict.flavours.values())))
    if verdict.admitted:  # nothing Kueue counts was requested (the spec refuses zero cpu and memory; kept for any other way in)
        problems.append("resources: the job requests nothing Kueue's quota counts (cpu, memory, GPUs). Fix: give resources.cpu "
                        "and resources.memory")
        return None
    whose = "the cluster's" if live_queue is not None else "the stack's"
    problems.append(f"resources: Kueue can never admit this job into {whose} ClusterQueue {name} (quota plus what the cohort "
                    f"may lend): {'; '.join(verdict.problems)}. Fix: fewer nodes, GPUs, cpu or memory per node, another "
                    "capacity, or a larger quota from the platform team")
    return None


def _image_allowed(spec: JobSpec, platform: PlatformConfig, problems: list[str]) -> None:
    """The team pod policy admits images from the platform's registries only; said here, before anything is created,
    where the stack names its account (else its ECR registry is known only to the cluster, which still refuses)."""
    prefixes = platform.image_prefixes()
    if spec.image and platform.account_id and not any(spec.image.startswith(p) for p in prefixes):
        problems.append(f"image: {spec.image!r} is not from a registry this platform runs ({', '.join(prefixes)}). Fix: push it "
                        "to the account's ECR, or ask the platform team to add its registry to kubernetes.image_registries")


def admit(spec: JobSpec, platform: PlatformConfig, *, spent_this_month_usd: float = 0.0, budget_usd: float | None = None,
          live_queue: dict | None = None) -> Admission:
    """`budget_usd`: the cluster's figure for the team's monthly budget, `live_queue` its ClusterQueue; both win over the
    stack's where given."""
    problems: list[str] = []
    where = placing.decide(spec, platform)
    instance = where.instance
    team = _team(spec, platform, problems)
    _image_allowed(spec, platform, problems)
    if team is not None and spec.priority not in team.priorities:
        problems.append(f"priority: {spec.priority!r} is not one of team {team.name}'s priorities ({', '.join(team.priorities)}); the "
                        "cluster would refuse the job. Fix: one of those, or ask the platform team to grant it (teams[].priorities "
                        "in the stack config)")
    chosen = None
    if team is not None:
        if not where.flavours:
            _never_placed(spec, platform, problems)
        else:
            chosen = _kueue_verdict(spec, platform, where, live_queue, problems)

    cost = None
    if instance is not None:
        try:
            cost = estimate(instance.name, where.nodes, spec.limits.max_runtime_hours, spec.capacity, platform.region)
        except PriceUnknown as exc:
            problems.append(f"resources.instance_type: cannot estimate the cost: {exc}")
    elif where.gpus_per_node > 0:
        problems.append(f"resources.gpu_type: no catalogue instance has {where.gpus_per_node} x {spec.resources.gpu_type}. Fix: fewer GPUs per node")

    if cost is not None and instance is not None:
        expected = cost.expected_usd
        limit = spec.limits.max_cost_usd
        if limit is not None and expected > limit:
            problems.append(f"limits.max_cost_usd: the estimate is ${expected:,.2f} ({spec.workers.nodes} x {instance.name} x "
                            f"{spec.limits.max_runtime}), ${expected - limit:,.2f} over the limit of ${limit:,.2f}. "
                            "Fix: a shorter max_runtime, fewer nodes, spot capacity, or a higher limit")
        if team is not None:
            budget = team.monthly_budget_usd if budget_usd is None else budget_usd
            remaining = budget - spent_this_month_usd
            if expected > remaining:
                problems.append(f"team budget: the estimate is ${expected:,.2f} but team {team.name!r} has ${remaining:,.2f} left of "
                                f"${budget:,.2f} this month (${expected - remaining:,.2f} short). "
                                "Fix: a cheaper job, or a budget increase from the team's cost-centre owner")
    return Admission(where, chosen, cost, problems, live_queue)
