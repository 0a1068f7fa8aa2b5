"""Where a job runs. One protocol, two implementations: `local` (torchrun on this machine, supervised) and
`kubernetes` (a TrainJob or PyTorchJob in the team's namespace). The CLI picks one and presents what it returns;
neither backend prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, Iterator, Protocol

from trainforge.errors import EXIT_BAD_INPUT, TrainforgeError
from trainforge.trainer.admission import Admission
from trainforge.trainer.spec import JobSpec


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


@dataclass
class JobReport:
    name: str
    team: str
    state: JobPhase
    summary: str  # one line for a person
    details: dict[str, Any] = field(default_factory=dict)  # everything, for `-o json`


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
