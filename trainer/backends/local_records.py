"""A local job's record on disk: `$TRAINFORGE_HOME/jobs/<name>/` (layout in trainforge.paths) holds its spec, its
state (written atomically, with a reserve of disk given up for it when the disk fills), and the run's progress as the
runtime writes it. The supervisor, `status`, `list`, `cost` and the sweep controller read jobs through this module."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainforge import paths
from trainforge.errors import EXIT_FAILED, TrainforgeError
from trainforge.paths import job_dir
from trainforge.trainer.backends import JobPhase, NoSuchJob
from trainforge.trainer.placement import Placement
from trainforge.trainer.spec import JobSpec

ACTIVE = (JobPhase.PENDING, JobPhase.RUNNING, JobPhase.RESTARTING)
SUPERVISOR_START_S = 60.0  # a supervisor records itself within milliseconds of the record; a minute without one: never started
@dataclass
class JobState:
    name: str
    team: str
    state: str = JobPhase.PENDING  # pending, running, restarting, succeeded, failed or cancelled (JobPhase)
    supervisor_pid: int | None = None
    # The supervisor's start time as the kernel records it (/proc/<pid>/stat): a PID alone is reused by the OS after
    # the process ends, and signalling it then hits an unrelated process.
    supervisor_started: str | None = None
    attempts: int = 0
    restarts: int = 0
    exit_code: int | None = None
    reason: str = ""
    created_at: float = field(default_factory=time.time)
    submitted_at: float = field(default_factory=time.time)  # this submission's (a resubmitted name resumes)
    started_at: float | None = None
    ended_at: float | None = None
    run_seconds: float = 0.0  # wall time workers ran, over all attempts
    nodes: int = 1
    instance_type: str | None = None
    capacity: str = "spot"
    region: str | None = None  # the stack's region when admitted against one: where its cost is priced
    history: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, name: str) -> JobState:
        path = job_dir(name) / paths.JOB_STATE_FILE
        try:
            record = json.loads(path.read_text())
            state = cls(**record)
            if state.name != name:
                raise ValueError(f"it names job {state.name!r}")
            return state
        except (ValueError, TypeError) as exc:
            raise TrainforgeError("", [f"{path}: the job's record is damaged ({exc}). Fix: remove that file; the job's "
                                       f"checkpoints ({path.parent / paths.JOB_CHECKPOINT_DIR}) stay, and submitting its spec "
                                       "again resumes from them"], exit_code=EXIT_FAILED) from None

    def save(self) -> None:
        """Atomically (readers never see half a state). On a full disk the job's reserve is given up for it: the record
        of how a job ended must get written."""
        path = job_dir(self.name) / paths.JOB_STATE_FILE
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(asdict(self), indent=2))
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno != errno.ENOSPC or not release_reserve(self.name):
                raise
            tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)

    def record_supervisor(self, pid: int) -> None:
        self.supervisor_pid, self.supervisor_started = pid, process_start(pid)

    def supervisor_alive(self) -> bool:
        """The recorded supervisor is still running: its PID exists and is the same process (same start time)."""
        if self.supervisor_pid is None:
            return False
        started = process_start(self.supervisor_pid)
        if started is not None:  # without a recorded start time nothing proves the PID is still the supervisor's
            return self.supervisor_started is not None and started == self.supervisor_started
        try:  # no /proc (macOS): the PID is all there is
            os.kill(self.supervisor_pid, 0)
            return not Path("/proc/self").exists()
        except OSError:
            return False

    @property
    def effective_state(self) -> str:
        """`lost` when the record says active but its supervisor is gone (machine reboot, kill -9), or never came: a
        submitter killed between writing the record and starting the supervisor leaves a job that would wait for ever."""
        if self.state in ACTIVE and self.supervisor_pid is not None and not self.supervisor_alive():
            return JobPhase.LOST
        if self.state == JobPhase.PENDING and self.supervisor_pid is None and time.time() - self.submitted_at > SUPERVISOR_START_S:
            return JobPhase.LOST
        return self.state


def process_start(pid: int) -> str | None:
    """A live process's start time in clock ticks since boot, None if it is gone, a zombie, or /proc is absent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": comm may hold spaces and parentheses
    if fields[0] == "Z":  # ended, not yet reaped: answers kill(pid, 0) but runs nothing
        return None
    return fields[19]  # field 22 of stat(5), starttime


def all_jobs() -> list[JobState]:
    return sorted((JobState.load(name) for name in job_names()), key=lambda s: s.created_at)


def job_names() -> list[str]:
    """The jobs recorded here (directories named like a job that hold a state file)."""
    root = paths.jobs_dir()
    if not root.exists():
        return []
    return sorted(p.name for p in root.iterdir() if paths.NAME.fullmatch(p.name) and (p / paths.JOB_STATE_FILE).exists())


def load_state(name: str) -> JobState:
    if not (job_dir(name) / paths.JOB_STATE_FILE).exists():
        raise NoSuchJob(name, "on this machine", "`trainforge list` shows the jobs")
    return JobState.load(name)


class JobAlreadyActive(TrainforgeError):
    def __init__(self, previous: JobState):
        super().__init__("", [f"job {previous.name!r} is {previous.state} (supervisor pid {previous.supervisor_pid}). "
                              f"Fix: `trainforge cancel {previous.name}` first, or give the spec another name"])


RESERVE_BYTES = 256 * 1024  # a state record is ~1 KB, the last log lines a few more


def hold_reserve(name: str) -> None:
    """Written, not just sized: a sparse file would hold no blocks to give back."""
    with open(job_dir(name) / paths.JOB_RESERVE_FILE, "wb") as f:
        f.write(b"\0" * RESERVE_BYTES)
        f.flush()
        os.fsync(f.fileno())


def release_reserve(name: str) -> bool:
    try:
        (job_dir(name) / paths.JOB_RESERVE_FILE).unlink()
        return True
    except OSError:  # none held, or no directory to hold it in (an unwritable home)
        return False


def disk_full(directory: Path) -> str | None:
    """Why a failed attempt may not be the job's fault: the disk holding TRAINFORGE_HOME is (nearly) full."""
    try:
        usage = shutil.disk_usage(directory)
    except OSError:
        return None
    if usage.free >= RESERVE_BYTES:
        return None
    return (f"the disk holding {paths.home()} is full ({usage.free // 1024} KiB free of {usage.total // 2**20} MiB): checkpoints, "
            f"metrics and logs could not be written. Fix: free space there, or set TRAINFORGE_HOME to a larger disk; "
            f"resubmitting the spec resumes from the last committed checkpoint")


def prepare(spec: JobSpec, where: Placement) -> JobState:
    """Create or reopen the job's record. A finished job of the same name is resumed from its checkpoints."""
    directory = job_dir(spec.name)
    new_job = not directory.exists()
    before = (directory / paths.JOB_STATE_FILE).read_bytes() if (directory / paths.JOB_STATE_FILE).exists() else None
    if before is not None:
        previous = JobState.load(spec.name)
        if previous.effective_state in ACTIVE:
            raise JobAlreadyActive(previous)
        keep_previous_spec(spec, directory)
        state = previous
        state.state, state.exit_code, state.reason, state.ended_at = JobPhase.PENDING, None, "", None
        state.supervisor_pid, state.supervisor_started, state.submitted_at = None, None, time.time()
        state.region = where.region or state.region
    else:
        state = JobState(spec.name, spec.team, nodes=where.nodes, instance_type=where.instance_type, capacity=spec.capacity,
                         region=where.region)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / paths.JOB_SPEC_FILE).write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
        state.save()
        hold_reserve(spec.name)
    except OSError as exc:
        release_reserve(spec.name)
        _undo_prepare(directory, new_job, before)
        fix = "free space there, or set TRAINFORGE_HOME to a larger disk" if exc.errno == errno.ENOSPC else "set TRAINFORGE_HOME to a writable directory"
        raise TrainforgeError("", [f"cannot write the job's record in {directory}: {exc.strerror}. Fix: {fix} (now {paths.home()})"]) from None
    return state


def _undo_prepare(directory: Path, new_job: bool, before: bytes | None) -> None:
    """A submit that could not write everything leaves nothing half-written: a new job's directory goes, a resubmitted
    job's record is as it was (never `pending` with no supervisor to run it)."""
    if new_job:
        shutil.rmtree(directory, ignore_errors=True)
    elif before is not None:
        try:
            (directory / paths.JOB_STATE_FILE).write_bytes(before)  # the same size as what it replaces
        except OSError:
            pass


def keep_previous_spec(spec: JobSpec, directory: Path) -> None:
    """A resubmitted name resumes from its checkpoints, so what produced them is never overwritten: a changed entry
    (another model) is refused; any other change keeps the previous spec as spec.<n>.yaml beside the new one."""
    path = directory / paths.JOB_SPEC_FILE
    try:
        before = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return  # nothing readable to keep
    after = spec.model_dump(mode="json")
    if before == after:
        return
    if isinstance(before, dict) and before.get("entry") != after["entry"]:
        raise TrainforgeError(f"job spec {spec.name}", [
            f"entry: job {spec.name!r} exists here with entry {before.get('entry')} and its checkpoints are of that model; "
            f"this spec has entry {after['entry']}. Fix: give this spec another name, or remove {directory} to start over"])
    version = 1 + sum(1 for _ in directory.glob("spec.*.yaml"))
    os.replace(path, directory / f"spec.{version}.yaml")


def progress(name: str) -> dict[str, Any]:
    """The newest step record, the last eval and the committed checkpoints of a job."""
    directory = job_dir(name)
    last: dict[str, Any] = {}
    metrics = directory / paths.JOB_RUN_DIR / paths.METRICS_FILE
    if metrics.exists():
        with open(metrics, "rb") as f:
            offset = max(0, metrics.stat().st_size - 8192)
            f.seek(offset)
            lines = f.read().decode(errors="replace").splitlines()
            for line in lines[1:] if offset else lines:  # a read from mid-file starts with a partial line
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                last.setdefault("eval", None)
                if "loss" in record:
                    last.update(step=record["step"], loss=record["loss"], step_s=record["step_s"], samples=record["samples"])
                elif "eval" in record:
                    last["eval"] = record["eval"]
    checkpoint_dir = directory / paths.JOB_CHECKPOINT_DIR
    checkpoints = sorted(p.name for p in checkpoint_dir.glob(f"{paths.CHECKPOINT_STEP_PREFIX}*") if (p / paths.CHECKPOINT_COMMIT_MARKER).exists()) if checkpoint_dir.exists() else []
    result = directory / paths.JOB_RUN_DIR / paths.RESULT_FILE
    return {**last, "checkpoints": checkpoints, "result": json.loads(result.read_text()) if result.exists() else None}


