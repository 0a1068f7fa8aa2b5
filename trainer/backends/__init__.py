"""Where a job runs. One protocol, two implementations: `local` (torchrun on this machine, supervised) and
`kubernetes` (a TrainJob or PyTorchJob in the team's namespace). The CLI picks one and presents what it returns;
neither backend prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from trainforge.errors import EXIT_BAD_INPUT, TrainforgeError
from trainforge.trainer.admission import Admission
from trainforge.trainer.render import Kind
from trainforge.trainer.spec import JobSpec

if TYPE_CHECKING:
    from trainforge.stackconfig import PlatformConfig


class JobPhase(StrEnum):
    """Every state a job is reported in, by either backend: what the views, `check`, the sweep controller and the
    tests compare against (a StrEnum: it is its own string in JSON and in a record)."""

    PENDING = "pending"  # local: recorded, its supervisor starting
    QUEUED = "queued"  # cluster: suspended until Kueue admits it
    CREATED = "created"  # cluster: created, no conditions yet
    RUNNING = "running"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DELETED = "deleted"  # cluster: deleted on request
    LOST = "lost"  # local: the record says active, its supervisor is gone
    DAMAGED = "damaged"  # local: a record that cannot be read

    @property
    def ended(self) -> bool:
        """Nothing of the job runs any more, and nothing will unless it is submitted again."""
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED, JobPhase.DELETED, JobPhase.LOST)


@dataclass(frozen=True)
class LocalRun:
    """What the local backend knows of a job: its supervisor's record, the run's progress and its priced cost."""

    attempts: int
    restarts: int
    run_seconds: float  # wall time workers ran, over all attempts
    created_at: float
    reason: str  # why it ended, or why it restarted last
    instance_type: str | None  # what it was admitted on, where a stack was given: its price and the summary's AWS line
    region: str | None
    progress: dict[str, Any]  # the newest step record, the last eval, the committed checkpoints, result.json
    cost: dict[str, Any]  # the ledger's node-hours x price (trainforge.trainer.ledger.job_cost)
    record: dict[str, Any]  # the whole record, for `-o json`


@dataclass(frozen=True)
class ClusterObject:
    """What the cluster says of a job: its object's status as its controller wrote it (or the manifest just created)."""

    status: dict[str, Any] = field(default_factory=dict)
    manifest: dict[str, Any] | None = None


@dataclass(frozen=True)
class Started:
    """A detached local job: its supervisor is starting."""

    supervisor_pid: int


@dataclass
class JobReport:
    name: str
    team: str
    state: JobPhase
    summary: str  # one line for a person
    details: LocalRun | ClusterObject | Started | None = None  # what the backend knows besides, typed per backend

    def as_json(self) -> dict[str, Any]:
        """Everything, for `-o json` (the shapes users' scripts read: kept as they were)."""
        d = self.details
        if isinstance(d, LocalRun):
            return {**d.record, "state": self.state, "progress": d.progress, "cost": d.cost}
        if isinstance(d, ClusterObject):
            return {"manifest": d.manifest} if d.manifest is not None else d.status
        if isinstance(d, Started):
            return {"supervisor_pid": d.supervisor_pid}
        return {}


class NoSuchJob(TrainforgeError):
    exit_code = EXIT_BAD_INPUT

    def __init__(self, name: str, where: str, fix: str):
        super().__init__("", [f"no job named {name!r} {where}. Fix: {fix}"])


Progress = Callable[[dict[str, Any], str], None]  # (the newest step record, the job's state), every half second


class Backend(Protocol):
    def submit(self, spec: JobSpec, admission: Admission, *, detach: bool = False, on_progress: Progress | None = None) -> JobReport:
        """Start the job. Detached (the cluster always is): return once started. Else run it to the end."""

    def status(self, name: str) -> JobReport: ...

    def logs(self, name: str, *, follow: bool = False) -> Iterator[str]: ...

    def cancel(self, name: str) -> JobReport: ...

    def list(self) -> list[JobReport]: ...

    def deployed_image(self, team: str) -> str | None:
        """The runtime image the platform deployed for the team (what a job that names none runs), if the backend has one."""
        ...


LOCAL, KUBERNETES = "local", "kubernetes"  # where a job runs: cli.common.BackendName's values, which the CLI parses


def backend_for(where: str, *, team: str | None = None, kind: Kind = "trainjob", context: str | None = None,
                cost_centre: str | None = None) -> Any:
    """The backend that runs jobs `where` (local or kubernetes); on the cluster, for `team`'s namespace, its jobs of
    `kind`, through kubeconfig `context`, tagged with `cost_centre`."""
    if where == KUBERNETES:
        from trainforge.trainer.backends.kubernetes import KubernetesBackend
        return KubernetesBackend(team, kind, context, cost_centre)
    from trainforge.trainer.backends.local import LocalBackend
    return LocalBackend()


def cost_centre_of(spec: JobSpec, platform: PlatformConfig | None) -> str | None:
    """The cost centre the stack bills the job's team to (its jobs' cost tags); None without a stack or that team."""
    team = next((t for t in platform.teams if t.name == spec.team), None) if platform is not None else None
    return team.cost_centre if team else None
