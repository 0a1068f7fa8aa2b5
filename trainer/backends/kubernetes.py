"""The Kubernetes backend: create, read, follow and cancel rendered jobs with the official client.

Imported only by commands that talk to a cluster (the client is slow to import). Credentials come from the
kubeconfig (`pulumi stack output kubeconfig`), so every call runs as the researcher, in their team namespace.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Iterator

from trainforge import contract
from trainforge.errors import EXIT_BAD_INPUT, TrainforgeError
from trainforge.trainer.admission import Admission, NotAdmitted
from trainforge.trainer.backends import ClusterObject, JobPhase, JobReport, NoSuchJob, Progress
from trainforge.trainer.controllers.budget import TeamBudget, is_held, month_of, team_budget
from trainforge.trainer.kube import KIND_NAMES, Cluster, ClusterError
from trainforge.trainer.render import Kind, render
from trainforge.trainer.spec import JobSpec

class KubernetesBackend:
    """The Backend protocol on the kubeconfig's cluster: one job kind, in one team's namespace."""

    def __init__(self, team: str | None, kind: Kind = "trainjob", context: str | None = None, cost_centre: str | None = None):
        self.team, self.kind, self.cost_centre = team, kind, cost_centre
        self.cluster = Cluster(context)

    def _namespace_team(self) -> str:
        if self.team is None:
            raise TrainforgeError("", ["the kubernetes backend needs the job's team (its namespace). Fix: --team <team>"])
        return self.team

    def budget(self, team: str, now: datetime.datetime | None = None, queue: dict[str, Any] | None = None) -> TeamSpend:
        """The team's budget and month-to-date spend as the cluster's budget controller last wrote them (`queue`: the
        team's ClusterQueue when the caller has just read it)."""
        now = now or datetime.datetime.now(datetime.timezone.utc)
        settings = self.cluster.team_settings(team)
        if settings is None:
            raise ClusterError(f"team {team!r} has no {contract.TEAM_SETTINGS_CONFIG_MAP} ConfigMap in namespace "
                               f"{contract.namespace_name(team)}. Fix: check the team name; the platform's `pulumi up` creates it",
                               EXIT_BAD_INPUT)
        return TeamSpend.of(team_budget(team, settings, queue or self.cluster.cluster_queue(team)), month_of(now))

    def submit(self, spec: JobSpec, admission: Admission, *, detach: bool = True, on_progress: Progress | None = None) -> JobReport:
        """Create the job once the live ClusterQueue agrees: quota from it (the cluster wins if it differs from the stack),
        and a queue held for budget refuses the job before it is created (Kueue would leave it queued all month)."""
        problems = list(admission.problems) or self._queue_problems(spec, admission)
        if problems:
            raise NotAdmitted(spec.name, problems)
        manifest = render(spec, admission.placement, self.kind, self.cost_centre)
        self.cluster.create(manifest)
        cost = admission.cost
        where = admission.flavour.value if admission.flavour else "cpu"
        line = (f"created {manifest['kind']} {manifest['metadata']['namespace']}/{spec.name} on {where}"
                + (f"; estimate ${cost.expected_usd:,.2f} for {spec.limits.max_runtime}" if cost else "")
                + ". Kueue admits it when the team's quota has room.")
        return JobReport(spec.name, spec.team, JobPhase.CREATED, line, ClusterObject(manifest=manifest))

    def deployed_image(self, team: str) -> str | None:
        """The image the platform's last `up` deployed, by digest, from the team's settings (None from a platform
        older than this setting: the stack's release tag is used then)."""
        return (self.cluster.team_settings(team) or {}).get(contract.SETTING_DEFAULT_IMAGE) or None

    def live_queue(self, team: str) -> dict[str, Any]:
        """The team's ClusterQueue as the cluster has it: admission decides over it (trainforge.kueue.assign)."""
        return self.cluster.cluster_queue(team)

    def _queue_problems(self, spec: JobSpec, admission: Admission) -> list[str]:
        """Quota was decided by admission over the live queue; what is left is whether the queue admits anything now
        (read from the queue admission decided over, not read again)."""
        queue = admission.live_queue or self.cluster.cluster_queue(spec.team)
        if is_held(queue):
            note = (queue["metadata"].get("annotations") or {}).get(contract.BUDGET_HOLD_ANNOTATION)
            if note is not None:
                return [f"team budget: team {spec.team!r} is over its monthly budget ({note}); its queue is held until the month "
                        "rolls over or the budget is raised. Fix: a budget increase from the team's cost-centre owner "
                        "(`trainforge cost --backend kubernetes --team " + spec.team + "` shows the figures)"]
            return [f"queue: the platform team has stopped ClusterQueue {contract.cluster_queue_name(spec.team)} (stopPolicy "
                    f"{queue['spec']['stopPolicy']}). Fix: ask them when it reopens"]
        return []

    def _get(self, name: str) -> tuple[str, dict[str, Any]]:
        team = self._namespace_team()
        obj = self.cluster.get(KIND_NAMES[self.kind], team, name)
        if obj is None:
            raise NoSuchJob(name, f"({KIND_NAMES[self.kind]}) in namespace {contract.namespace_name(team)}",
                            f"`trainforge list --backend kubernetes --team {team} --kind {self.kind}`")
        return team, obj

    def status(self, name: str) -> JobReport:
        team, obj = self._get(name)
        state = job_state(self.kind, obj)
        return JobReport(name, team, state, f"{name}: {state} ({conditions(obj)})", ClusterObject(obj.get("status", {})))

    def logs(self, name: str, *, follow: bool = False) -> Iterator[str]:
        team, _ = self._get(name)
        found = self.cluster.logs(KIND_NAMES[self.kind], team, name)
        if not found:
            yield f"{name}: no pods yet (queued, or still starting)\n"
        for pod, text in found.items():
            yield f"==> {pod} <==\n{text}\n"

    def cancel(self, name: str) -> JobReport:
        team = self._namespace_team()
        if not self.cluster.cancel(KIND_NAMES[self.kind], team, name):
            raise NoSuchJob(name, f"({KIND_NAMES[self.kind]}) in namespace {contract.namespace_name(team)}",
                            f"`trainforge list --backend kubernetes --team {team} --kind {self.kind}`")
        return JobReport(name, team, JobPhase.DELETED, f"{name}: deleted; its pods checkpoint within their grace period")

    def list(self) -> list[JobReport]:
        team = self._namespace_team()
        found = self.cluster.list(KIND_NAMES[self.kind], team)
        return [JobReport(o["metadata"]["name"], team, job_state(self.kind, o), f"{o['metadata']['name']}: {conditions(o)}",
                          ClusterObject(o.get("status", {}))) for o in found]


@dataclass(frozen=True)
class TeamSpend:
    """A team's budget this month, as the cluster's budget controller last recorded it."""

    team: str
    budget_usd: float
    spent_usd: float  # this month's; 0 when the controller's last figure is from an earlier month
    as_of: str | None
    month: str
    held_for_budget: bool
    held: bool

    @property
    def left_usd(self) -> float:
        return self.budget_usd - self.spent_usd

    @classmethod
    def of(cls, recorded: TeamBudget, month: str) -> TeamSpend:
        current = recorded.spent_month == month
        return cls(recorded.team, recorded.budget_usd, recorded.spent_in(month), recorded.spent_as_of if current else None, month,
                   recorded.held_for_budget, recorded.held)


def job_state(kind: Kind, obj: dict[str, Any]) -> JobPhase:
    """queued (suspended: Kueue has not admitted it) -> running -> succeeded | failed, from the job's conditions."""
    status = obj.get("status", {})
    true = {c["type"] for c in status.get("conditions", []) if c.get("status") == "True"}
    if true & {"Complete", "Succeeded"}:
        return JobPhase.SUCCEEDED
    if "Failed" in true:
        return JobPhase.FAILED
    if "Suspended" in true or obj.get("spec", {}).get("suspend") is True and not true & {"Running"}:
        return JobPhase.QUEUED
    if "Running" in true or any(j.get("active", 0) > 0 for j in status.get("jobsStatus", [])):
        return JobPhase.RUNNING
    if "Restarting" in true:
        return JobPhase.RESTARTING
    return JobPhase.CREATED


def conditions(obj: dict[str, Any]) -> str:
    found = obj.get("status", {}).get("conditions", [])
    return ", ".join(f"{c['type']}={c['status']}" for c in found) or "no conditions yet"
