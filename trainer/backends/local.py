"""The local backend: run a job spec on this machine under torchrun, supervised, recorded, resumable.

A job lives in `$TRAINFORGE_HOME/jobs/<name>/` (default ~/.trainforge; layout in trainforge.paths): the spec,
`state.json`, `job.log`, `run/` (the runtime's output) and `checkpoints/`. The supervisor starts the whole worker group with a fresh
rendezvous; when a worker dies or the job is preempted it restarts the whole group from the last committed
checkpoint (with backoff, up to `limits.max_restarts`); a user error (exit 1-127) is not retried.
Submitting a job whose name exists resumes it from its checkpoints. The record on disk and its readers: local_records.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

import yaml

from trainforge import contract, paths
from trainforge.exits import Outcome, outcome_of
from trainforge.errors import EXIT_FAILED, TrainforgeError
from trainforge.paths import job_dir
from trainforge.trainer import ledger
from trainforge.trainer.admission import Admission
from trainforge.trainer.backends import JobPhase, JobReport, LocalRun, Progress, Started
from trainforge.trainer.backends.local_records import (ACTIVE, JobState, disk_full, job_names, load_state, prepare, progress,
                                                      release_reserve)
from trainforge.trainer.launch import user_error_message
from trainforge.trainer import placement as placing
from trainforge.trainer.render import command_env, rank_command, runtime_args
from trainforge.trainer.spec import JobSpec, parse_spec

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)


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


def worker_command(spec: JobSpec, exit_dir: Path) -> list[str]:
    """The node launcher (trainer/launch.py) around torchrun: the same command a cluster pod runs, on one node."""
    directory = job_dir(spec.name)
    processes = spec.workers.nodes * spec.workers.procs_per_node  # every worker of every node, on this machine
    launcher = [sys.executable, "-m", "trainforge.trainer.launch", f"--nproc-per-node={processes}", f"--exit-dir={exit_dir}",
                "--", "--standalone", "--nnodes=1"]
    if spec.entry.command:
        return [*launcher, *rank_command(spec.entry.command)]
    grace = termination_grace_s(spec)
    return [*launcher, "-m", "trainforge.trainer.runtime",
            *runtime_args(spec, output_dir=str(directory / paths.JOB_RUN_DIR), checkpoint_dir=str(directory / paths.JOB_CHECKPOINT_DIR),
                          tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"), metrics_port=_metrics_port(), termination_grace_s=grace)]


def termination_grace_s(spec: JobSpec) -> int:
    """The job's own grace class (spot: the EC2 notice's two minutes; on-demand: a cancel's minute), as on the cluster."""
    return placing.decide(spec, None).termination_grace_s


def worker_environment(spec: JobSpec) -> dict[str, str]:
    """The node launcher's environment: this one, with what the cluster's pods get of the spec (hyperparameters for a
    command, torchrun's wait for the emergency checkpoint: a variable already set here wins)."""
    return {**contract.torchrun_environment(termination_grace_s(spec)), **os.environ, "PYTHONUNBUFFERED": "1", **command_env(spec)}


def _metrics_port() -> int | None:
    value = os.environ.get("TRAINFORGE_METRICS_PORT")
    return int(value) if value else None


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
                return self._finish(JobPhase.CANCELLED, code, "cancelled by user; checkpoint kept for resume")
            if outcome is Outcome.OK:
                return self._finish(JobPhase.SUCCEEDED, 0, "")
            full = disk_full(self.directory) if outcome is not Outcome.OK else None
            if full:  # a restart would fill it again at once
                return self._finish(JobPhase.FAILED, code, f"worker exited {code}: {full}")
            if outcome is Outcome.USER_ERROR:
                why = user_error_message(exit_dir) or "see job.log"
                return self._finish(JobPhase.FAILED, code, f"worker exited {code}, a user error (not retried): {why}")
            if state.restarts >= max_restarts:
                return self._finish(JobPhase.FAILED, code, f"still failing after {state.restarts} restarts (limits.max_restarts)")
            delay = BACKOFF_S[min(state.restarts, len(BACKOFF_S) - 1)]
            state.restarts += 1
            state.state, state.reason = JobPhase.RESTARTING, f"worker exited {code}; restart {state.restarts}/{max_restarts} in {delay:.0f} s"
            state.save()
            self._log(f"--- trainforge: {state.reason}\n")
            deadline = time.time() + delay
            while time.time() < deadline and not self.cancelled:
                time.sleep(0.1)
            if self.cancelled:
                return self._finish(JobPhase.CANCELLED, code, "cancelled while waiting to restart")

    def _log(self, text: str) -> None:
        try:
            with open(self.directory / paths.JOB_LOG_FILE, "a") as log:
                log.write(text)
        except OSError:
            pass  # the log is for people; the state record (saved first) is what counts, and a full disk must not lose it

    def _attempt(self) -> tuple[Outcome, int, Path]:
        state = self.state
        state.attempts += 1
        exit_dir = self.directory / paths.JOB_EXIT_DIR / f"attempt-{state.attempts}"
        env = worker_environment(self.spec)
        self._log(f"--- trainforge: attempt {state.attempts} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        started = time.time()
        with open(self.directory / paths.JOB_LOG_FILE, "a") as log:
            self.child = subprocess.Popen(worker_command(self.spec, exit_dir), stdout=log, stderr=subprocess.STDOUT, env=env,
                                          cwd=self.directory, start_new_session=True)
        state.state, state.reason = JobPhase.RUNNING, ""
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
    return 0 if state.state == JobPhase.SUCCEEDED else 1


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


def cancel(name: str, wait_s: float = max(contract.TRAINING_RUNTIME_GRACE_S.values()) + 10.0) -> JobState:
    """SIGTERM to the job's supervisor, then wait (at most its longest grace class and a little) for it to end."""
    state = JobState.load(name)
    if state.effective_state not in ACTIVE or state.supervisor_pid is None:
        return state  # a PID whose process is gone or was reused is never signalled
    os.kill(state.supervisor_pid, signal.SIGTERM)
    deadline = time.time() + wait_s
    while time.time() < deadline:
        state = JobState.load(name)
        if state.state not in ACTIVE:
            break
        if state.effective_state == JobPhase.LOST:
            # The signal reached a supervisor still starting, before its handler was set (a cancel right after
            # `submit --detach`): it ended without recording anything, and it starts workers only once the handler is
            # set. The job is cancelled; waiting for a record would take the whole wait_s.
            state.state, state.reason, state.ended_at = JobPhase.CANCELLED, "cancelled while its supervisor was starting", time.time()
            state.save()
            release_reserve(name)
            break
        time.sleep(0.2)
    return state


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
            raise TrainforgeError("", [f"job {name!r} is {state.effective_state}; nothing to cancel"], exit_code=EXIT_FAILED)
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

    def deployed_image(self, team: str) -> str | None:
        return None  # a local job runs this checkout, not an image


if __name__ == "__main__":
    raise SystemExit(supervise(sys.argv[1]))
