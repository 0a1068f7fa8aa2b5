"""The local backend: run a job spec on this machine under torchrun, supervised, recorded, resumable.

A job lives in `$TRAINFORGE_HOME/jobs/<name>/` (default ~/.trainforge; layout in trainforge.paths): the spec,
`state.json`, `job.log`, `run/` (the runtime's output) and `checkpoints/`. The supervisor starts the whole worker group with a fresh
rendezvous; when a worker dies or the job is preempted it restarts the whole group from the last committed
checkpoint (with backoff, up to `limits.max_restarts`); a user error (exit 1-127) is not retried.
Submitting a job whose name exists resumes it from its checkpoints.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

from trainforge import exits, paths
from trainforge.errors import TrainforgeError
from trainforge.paths import job_dir
from trainforge.trainer import ledger
from trainforge.trainer.admission import Admission
from trainforge.trainer.backends import JobPhase, JobReport, LocalRun, NoSuchJob, Progress, Started
from trainforge.trainer.launch import user_error_message
from trainforge.trainer import placement as placing
from trainforge.trainer.placement import Placement
from trainforge.trainer.render import command_env, rank_command, runtime_args
from trainforge.trainer.spec import JobSpec, parse_spec

ACTIVE = ("pending", "running", "restarting")
SUPERVISOR_START_S = 60.0  # a supervisor records itself within milliseconds of the record; a minute without one: never started
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)


@dataclass
class JobState:
    name: str
    team: str
    state: str = "pending"  # pending | running | restarting | succeeded | failed | cancelled
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
                                       "again resumes from them"], exit_code=1) from None

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
        if started is not None:
            return self.supervisor_started is None or started == self.supervisor_started
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
            return "lost"
        if self.state == "pending" and self.supervisor_pid is None and time.time() - self.submitted_at > SUPERVISOR_START_S:
            return "lost"
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
    if (directory / paths.JOB_STATE_FILE).exists():
        previous = JobState.load(spec.name)
        if previous.effective_state in ACTIVE:
            raise JobAlreadyActive(previous)
        keep_previous_spec(spec, directory)
        state = previous
        state.state, state.exit_code, state.reason, state.ended_at = "pending", None, "", None
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
        fix = "free space there, or set TRAINFORGE_HOME to a larger disk" if exc.errno == errno.ENOSPC else "set TRAINFORGE_HOME to a writable directory"
        raise TrainforgeError("", [f"cannot write the job's record in {directory}: {exc.strerror}. Fix: {fix} (now {paths.home()})"]) from None
    return state


def local_worker_limit() -> int:
    """Every worker of every node is a process here: beyond a few per core they only thrash (and 512 x 64 would fork
    32768 interpreters)."""
    return max(8, 2 * (os.cpu_count() or 1))


def refuse_more_workers_than_this_machine_runs(spec: JobSpec) -> None:
    processes = spec.workers.nodes * spec.workers.procs_per_node
    if processes > local_worker_limit():
        raise TrainforgeError(f"job spec {spec.name}", [
            f"workers: {spec.workers.nodes} nodes x {spec.workers.procs_per_node} procs_per_node = {processes} processes, "
            f"more than this machine runs locally ({local_worker_limit()}: 2 per core, at least 8). Fix: fewer workers for a "
            "local run, or --backend kubernetes"])


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


def worker_command(spec: JobSpec, exit_dir: Path) -> list[str]:
    """The node launcher (trainer/launch.py) around torchrun: the same command a cluster pod runs, on one node."""
    directory = job_dir(spec.name)
    processes = spec.workers.nodes * spec.workers.procs_per_node  # every worker of every node, on this machine
    launcher = [sys.executable, "-m", "trainforge.trainer.launch", f"--nproc-per-node={processes}", f"--exit-dir={exit_dir}",
                "--", "--standalone", "--nnodes=1"]
    if spec.entry.command:
        return [*launcher, *rank_command(spec.entry.command)]
    # The job's own grace class (spot: the EC2 notice's two minutes; on-demand: a cancel's minute), as on the cluster.
    grace = placing.decide(spec, None).termination_grace_s
    return [*launcher, "-m", "trainforge.trainer.runtime",
            *runtime_args(spec, output_dir=str(directory / paths.JOB_RUN_DIR), checkpoint_dir=str(directory / paths.JOB_CHECKPOINT_DIR),
                          tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"), metrics_port=_metrics_port(), termination_grace_s=grace)]


def _metrics_port() -> int | None:
    value = os.environ.get("TRAINFORGE_METRICS_PORT")
    return int(value) if value else None


def outcome_of(code: int) -> str:
    """The launcher's exit code says it all: 0 done, 1-127 a user error, >= 128 retry from the checkpoint."""
    if code == 0:
        return "ok"
    return "retry" if exits.is_retryable(code) else "user_error"


class Supervisor:
    """Runs attempts of one job until it succeeds, fails for good, runs out of restarts or is cancelled."""

    def __init__(self, spec: JobSpec, state: JobState, on_attempt=None):
        self.spec, self.state, self.on_attempt = spec, state, on_attempt
        self.directory = job_dir(spec.name)
        self.cancelled = False
        self.child: subprocess.Popen | None = None

    def cancel(self, *_: Any) -> None:
        """SIGTERM to the workers (via torchrun): they checkpoint and exit; no restart follows."""
        self.cancelled = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)

    def run(self) -> JobState:
        state = self.state
        state.record_supervisor(os.getpid())
        state.started_at = state.started_at or time.time()
        state.save()
        max_restarts = self.spec.limits.max_restarts
        while True:
            outcome, code, exit_dir = self._attempt()
            state.history.append({"attempt": state.attempts, "outcome": outcome, "exit_code": code, "ended_at": time.time()})
            if self.cancelled:
                return self._finish("cancelled", code, "cancelled by user; checkpoint kept for resume")
            if outcome == "ok":
                return self._finish("succeeded", 0, "")
            full = disk_full(self.directory) if outcome != "ok" else None
            if full:  # a restart would fill it again at once
                return self._finish("failed", code, f"worker exited {code}: {full}")
            if outcome == "user_error":
                why = user_error_message(exit_dir) or "see job.log"
                return self._finish("failed", code, f"worker exited {code}, a user error (not retried): {why}")
            if state.restarts >= max_restarts:
                return self._finish("failed", code, f"still failing after {state.restarts} restarts (limits.max_restarts)")
            delay = BACKOFF_S[min(state.restarts, len(BACKOFF_S) - 1)]
            state.restarts += 1
            state.state, state.reason = "restarting", f"worker exited {code}; restart {state.restarts}/{max_restarts} in {delay:.0f} s"
            state.save()
            self._log(f"--- trainforge: {state.reason}\n")
            deadline = time.time() + delay
            while time.time() < deadline and not self.cancelled:
                time.sleep(0.1)
            if self.cancelled:
                return self._finish("cancelled", code, "cancelled while waiting to restart")

    def _log(self, text: str) -> None:
        try:
            with open(self.directory / paths.JOB_LOG_FILE, "a") as log:
                log.write(text)
        except OSError:
            pass  # the log is for people; the state record (saved first) is what counts, and a full disk must not lose it

    def _attempt(self) -> tuple[str, int, Path]:
        state = self.state
        state.attempts += 1
        exit_dir = self.directory / paths.JOB_EXIT_DIR / f"attempt-{state.attempts}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **command_env(self.spec)}
        self._log(f"--- trainforge: attempt {state.attempts} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        started = time.time()
        with open(self.directory / paths.JOB_LOG_FILE, "a") as log:
            self.child = subprocess.Popen(worker_command(self.spec, exit_dir), stdout=log, stderr=subprocess.STDOUT, env=env,
                                          cwd=self.directory, start_new_session=True)
        state.state, state.reason = "running", ""
        state.save()
        if self.on_attempt:
            self.on_attempt(state)
        returncode = self.child.wait()
        state.run_seconds += time.time() - started
        return outcome_of(returncode), returncode, exit_dir

    def _finish(self, final: str, code: int, reason: str) -> JobState:
        state = self.state
        state.state, state.exit_code, state.reason, state.ended_at = final, code, reason, time.time()
        state.save()
        self._log(f"--- trainforge: {final}{': ' + reason if reason else ''}\n")
        release_reserve(self.spec.name)
        return state


def supervise(name: str) -> int:
    """Entry of a detached supervisor: `python -m trainforge.trainer.backends.local <name>`."""
    spec = parse_spec(yaml.safe_load((job_dir(name) / paths.JOB_SPEC_FILE).read_text()), f"{name}/{paths.JOB_SPEC_FILE}")
    supervisor = Supervisor(spec, JobState.load(name))
    signal.signal(signal.SIGTERM, supervisor.cancel)
    state = supervisor.run()
    return 0 if state.state == "succeeded" else 1


def start_detached(spec: JobSpec, state: JobState) -> int:
    """Start the supervisor in its own session so the job outlives the shell that submitted it."""
    with open(job_dir(spec.name) / paths.SUPERVISOR_LOG_FILE, "a") as log:
        process = subprocess.Popen([sys.executable, "-m", "trainforge.trainer.backends.local", spec.name], stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, env={**os.environ})
    # Reap it when it ends: a long-lived caller (a sweep controller) would otherwise keep it as a zombie, which
    # still answers kill(pid, 0) and so reads as a supervisor alive.
    threading.Thread(target=process.wait, name=f"reap-{spec.name}", daemon=True).start()
    state.record_supervisor(process.pid)
    state.save()
    return process.pid


def cancel(name: str, wait_s: float = 60.0) -> JobState:
    state = JobState.load(name)
    if state.effective_state not in ACTIVE or state.supervisor_pid is None:
        return state  # a PID whose process is gone or was reused is never signalled
    os.kill(state.supervisor_pid, signal.SIGTERM)
    deadline = time.time() + wait_s
    while time.time() < deadline:
        state = JobState.load(name)
        if state.state not in ACTIVE:
            break
        time.sleep(0.2)
    return state


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


class LocalBackend:
    """The Backend protocol on this machine: a supervisor per job, records under $TRAINFORGE_HOME/jobs."""

    def submit(self, spec: JobSpec, admission: Admission, *, detach: bool = False, on_progress: Progress | None = None) -> JobReport:
        refuse_more_workers_than_this_machine_runs(spec)
        state = prepare(spec, admission.placement)
        if detach:
            pid = start_detached(spec, state)
            return JobReport(spec.name, spec.team, JobPhase.PENDING, f"submitted {spec.name} (supervisor pid {pid}); "
                             f"`trainforge status {spec.name}`, `trainforge logs -f {spec.name}`", Started(pid))
        supervisor = Supervisor(spec, state)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, supervisor.cancel)
        runner = threading.Thread(target=supervisor.run, daemon=True)
        runner.start()
        while runner.is_alive():
            runner.join(0.5)
            if on_progress is not None:
                on_progress(progress(spec.name), supervisor.state.state)
        return self.status(spec.name)

    def status(self, name: str) -> JobReport:
        state = load_state(name)
        info = progress(name)
        details = LocalRun(state.attempts, state.restarts, state.run_seconds, state.created_at, state.reason, state.instance_type,
                           state.region, info, ledger.job_cost(state), asdict(state))
        line = (f"{name}: {state.effective_state}  attempts {state.attempts}, restarts {state.restarts}"
                f"{', step ' + str(info['step']) if info.get('step') else ''}"
                f"{', exit ' + str(state.exit_code) if state.exit_code is not None else ''}"
                f"{'  (' + state.reason + ')' if state.reason else ''}")
        return JobReport(name, state.team, JobPhase(state.effective_state), line, details)

    def logs(self, name: str, *, follow: bool = False) -> Iterator[str]:
        load_state(name)
        path = job_dir(name) / paths.JOB_LOG_FILE
        position = 0
        while True:
            if path.exists():
                with open(path) as f:
                    f.seek(position)
                    chunk = f.read()
                    position = f.tell()
                if chunk:
                    yield chunk
            if not follow or load_state(name).effective_state not in ACTIVE:
                return
            time.sleep(0.5)

    def cancel(self, name: str) -> JobReport:
        state = load_state(name)
        if state.effective_state not in ACTIVE:
            raise TrainforgeError("", [f"job {name!r} is {state.effective_state}; nothing to cancel"], exit_code=1)
        state = cancel(name)
        return JobReport(name, state.team, JobPhase(state.state), f"{name}: {state.state}{' (' + state.reason + ')' if state.reason else ''}")

    def list(self) -> list[JobReport]:
        reports = []
        for name in job_names():
            try:
                reports.append(self.status(name))
            except TrainforgeError as damaged:  # shown, not hidden: a damaged record is the user's to clear
                reports.append(JobReport(name, "?", JobPhase.DAMAGED, str(damaged)))
        return sorted(reports, key=lambda r: r.details.created_at if isinstance(r.details, LocalRun) else float("inf"))


if __name__ == "__main__":
    raise SystemExit(supervise(sys.argv[1]))
