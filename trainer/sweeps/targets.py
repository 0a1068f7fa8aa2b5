"""Where a sweep lives, decided once: what `Backend` is for jobs (trainer/backends/), a `SweepTarget` is for sweeps.

A sweep runs either on this machine (`LocalSweep`: its controller is the `trainforge sweep` process, its study is in a
database this machine reaches) or in the cluster (`ClusterSweep`: its controller is a TrainJob in the team's namespace
and that TrainJob is its status object, which a member reads and writes requests to with a kubeconfig alone;
trainer/sweeps/cluster.py). `locate` picks one from a command's options and the sweep's record (sweep.json); `status`,
`report`, `best`, `cancel`, `resume` and `extend` then ask the target and never decide where the sweep lives again.
What a command has to say comes back as lines, for the CLI to print.
"""

from __future__ import annotations

import contextlib
import datetime
import sys
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Protocol, get_args

from trainforge import contract, paths
from trainforge.errors import EXIT_FAILED, TrainforgeError
from trainforge.trainer.backends import backend_for, cost_centre_of
from trainforge.trainer.render import Kind as JobKind
from trainforge.trainer.spec import JobSpec
from trainforge.trainer.sweeps.record import KUBERNETES, TRAINJOB, SweepRecord
from trainforge.trainer.sweeps.spec import Sweep
from trainforge.trainer.sweeps.keys import StudyKey, TrialFact, TrialKey, fact_key

if TYPE_CHECKING:  # optuna's import (study.py's rows) only where a command reads a study: `trainforge --help` stays light
    from trainforge.trainer.sweeps.status_document import StatusDocument

RunHere = Callable[[SweepRecord, float], None]  # runs a sweep on this machine from its record (the CLI's loop and views)


class SweepTarget(Protocol):
    name: str

    @property
    def team(self) -> Optional[str]: ...

    def study(self) -> Any:
        """The sweep's Optuna study as this member can read it (in the cluster: rebuilt from the status object)."""

    def facts(self) -> dict[str, Any]:
        """What `status` shows beside the trials: nothing more on this machine; in the cluster the controller's state,
        the plan, the spend and which trials the status object holds."""

    def checkpoint_of(self, job: Optional[str]) -> Optional[str]:
        """Where trial job `job` checkpoints (what `best` shows and `--promote` continues from)."""

    def base(self) -> Sweep:
        """The sweep as its controller runs it, base job resolved: what `best --write` and `--promote` build on."""

    def submit(self, spec: JobSpec, stack: Optional[Path]) -> str:
        """Submit a job (the promoted trial) where the sweep runs, admitted as `submit` admits; its summary."""

    def cancel(self) -> list[str]: ...

    def extend(self, *, trials: int, usd: float, wall_time_s: float) -> list[str]: ...

    def resume(self, poll: float, run_here: RunHere) -> list[str]: ...


def locate(name: str, where: Optional[str] = None, *, team: Optional[str] = None, context: Optional[str] = None,
           storage: Optional[str] = None) -> SweepTarget:
    """The sweep `name`: `where` (local or kubernetes) as the member asked, else where this machine started it.
    In the cluster its controller's TrainJob must exist (found in the team's namespace); on this machine the study is
    opened only when a command reads it."""
    record = SweepRecord.load(name)
    if (where or record.backend) != KUBERNETES:
        return LocalSweep(name, record, storage)
    team = team or record.team
    if team is None:
        raise TrainforgeError("", ["--team: a cluster sweep lives in its team's namespace. Fix: --team <team>"])
    from trainforge.trainer.sweeps.cluster import CONTROLLER_KIND
    backend = backend_for(KUBERNETES, team=team, kind=job_kind(record.kind), context=context or record.context)
    job = backend.cluster.get(CONTROLLER_KIND, team, contract.sweep_controller_job(name))
    if job is None:
        raise TrainforgeError("", [f"no sweep named {name!r} in namespace {contract.namespace_name(team)} (no TrainJob "
                                   f"{contract.sweep_controller_job(name)}). Fix: check the name and --team; `trainforge sweep "
                                   "SPEC.yaml --backend kubernetes --stack ...` starts one"])
    return ClusterSweep(name, backend, job)


def local_study_file(name: str) -> Path:
    return paths.sweep_dir(name) / paths.SWEEP_STUDY_FILE


def local_study_url(name: str) -> str:
    """The study of a sweep started on this machine without --storage: SQLite beside its record."""
    return f"sqlite:///{local_study_file(name).resolve()}"


def job_kind(kind: str) -> JobKind:
    """A recorded job kind as the backends take it (sweep.json is a file a person may edit)."""
    for known in get_args(JobKind):
        if kind == known:
            return known
    raise TrainforgeError("", [f"kind: {kind!r} is not a job kind (one of {', '.join(get_args(JobKind))}). Fix: the sweep's record "
                               "(sweep.json) was edited; start the sweep again from its spec (`trainforge sweep SPEC.yaml --resume`)"],
                          exit_code=EXIT_FAILED)



# ---- on this machine --------------------------------------------------------------------------------------------

@dataclass
class LocalSweep:
    """A sweep whose study this machine reaches: one it started (sweep.json says where its study is), or any sweep's
    study named by `--storage` (a cluster sweep's, read from the team's database: every trial, not a summary)."""
    name: str
    record: SweepRecord = field(default_factory=SweepRecord)
    storage_given: Optional[str] = None

    @property
    def team(self) -> Optional[str]:
        return self.record.team

    @property
    def storage(self) -> str:
        """Where the study lives: as given, else as recorded when this machine started the sweep, else the local default."""
        found = self.storage_given or self.record.storage
        if found:
            return found
        if not local_study_file(self.name).exists():
            raise TrainforgeError("", [f"no sweep named {self.name!r} was started on this machine ({paths.sweep_dir(self.name)} holds "
                                       "none). Fix: check the name, `trainforge sweep SPEC.yaml` to start it, or --storage URL for a "
                                       "sweep started elsewhere"])
        return local_study_url(self.name)

    def study(self) -> Any:
        from trainforge.trainer.sweeps.study import load_existing
        return load_existing(self.name, self.storage)

    def facts(self) -> dict[str, Any]:
        return {}

    def checkpoint_of(self, job: Optional[str]) -> Optional[str]:
        if job is None:  # a trial with no job of its own (warm-started from an earlier sweep) has no checkpoint
            return None
        if self.record.in_cluster:  # a cluster sweep's database read from here: its trials ran in the cluster
            return contract.fsx_job_paths(self.team, job)["checkpoint_dir"] if self.team else None
        return str(paths.job_dir(job) / paths.JOB_CHECKPOINT_DIR)

    def base(self) -> Sweep:
        from trainforge.trainer.sweeps.spec import load_sweep
        if self.record.source is None:
            raise TrainforgeError("", [f"--write/--promote: this machine did not start sweep {self.name!r}, so its base spec is unknown here. "
                                       "Fix: run it where the sweep was started, or --backend kubernetes --team T for a cluster sweep"])
        return load_sweep(self.record.source)

    def submit(self, spec: JobSpec, stack: Optional[Path]) -> str:
        """As `submit --stack` would: admitted against the stack given, else the one the sweep was started with (the
        team's month's spend, its budget, the quota); unchecked where the sweep had none, as `submit` without one."""
        from trainforge.stackconfig import load_stack_file
        from trainforge.trainer.admission import NotAdmitted, unchecked
        from trainforge.trainer.backends.local import LocalBackend
        from trainforge.trainer.spec import with_image
        from trainforge.trainer.submission import admit_now
        target = LocalBackend()
        stack = stack or (Path(self.record.stack) if self.record.stack else None)
        if stack is None:
            return target.submit(spec, unchecked(spec), detach=True).summary
        platform = load_stack_file(stack)
        spec = with_image(spec, platform, None)
        decision = admit_now(spec, platform, target)
        if not decision.admitted:
            raise NotAdmitted(spec.name, decision.problems, "started")
        return target.submit(spec, decision, detach=True).summary

    def cancel(self) -> list[str]:
        from optuna.trial import TrialState

        study = self.study()
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if study.user_attrs.get(StudyKey.CANCELLED):
            raise TrainforgeError("", [f"sweep {self.name!r} is already cancelled; nothing to cancel"], exit_code=EXIT_FAILED)
        if study.user_attrs.get(StudyKey.FINISHED_BECAUSE) and not running:
            raise TrainforgeError("", [f"sweep {self.name!r} already finished ({study.user_attrs[StudyKey.FINISHED_BECAUSE]}); nothing to cancel. "
                                       f"`trainforge sweep status {self.name}` shows its trials"], exit_code=EXIT_FAILED)
        study.set_user_attr(StudyKey.CANCELLED, True)  # a running controller stops launching and exits
        target = backend_for(self.record.backend, team=self.record.team, kind=job_kind(self.record.kind), context=self.record.context)
        said = []
        for trial in running:
            job = trial.user_attrs.get(TrialKey.JOB)
            if job:
                study.set_user_attr(fact_key(trial.number, TrialFact.STOPPED), "cancelled by `trainforge sweep cancel`")
                try:
                    said.append(target.cancel(job).summary)
                except TrainforgeError as exc:
                    said.append(f"{job}: {exc}")
        return [*said, f"sweep {self.name}: cancelled ({len(running)} running trial(s) stopped, each checkpointed first); "
                       f"`trainforge sweep status {self.name}` shows what finished"]

    def extend(self, *, trials: int, usd: float, wall_time_s: float) -> list[str]:
        from trainforge.trainer.sweeps.limits import ask, controller_running, recorded_limits, take_up_asked
        from trainforge.trainer.sweeps.spec import duration
        with _extension_lock(self.name):  # this machine's extends one at a time (each says what it raised from and to)
            study = self.study()
            before = recorded_limits(study)
            ask(study, trials=trials, usd=usd, wall_time_s=wall_time_s)  # its own key: kept whoever else writes
            take_up_asked(study)  # applied once, with any another machine asked meanwhile
            after = recorded_limits(study)

        def shown(limits) -> str:
            return (f"{limits.max_trials} trials, " + (f"${limits.usd:,.2f}" if limits.usd is not None else "no USD limit") + ", "
                    + (duration(limits.wall_time_s) if limits.wall_time_s is not None else "no wall time"))
        said = [f"sweep {self.name}: {shown(before)} -> {shown(after)}"]
        if usd and before.usd is None:
            said.append("  (--usd ignored: the sweep has no USD limit)")
        if wall_time_s and before.wall_time_s is None:
            said.append("  (--wall-time ignored: the sweep has no wall time)")
        if study.user_attrs.get(StudyKey.CANCELLED):
            said.append(f"it is cancelled: `trainforge sweep resume {self.name}` continues it")
        elif controller_running(study):
            said.append("its running controller takes it up at its next look")
        else:
            said.append(f"no controller is running it: `trainforge sweep resume {self.name}` continues it")
        return said

    def resume(self, poll: float, run_here: RunHere) -> list[str]:
        """Run the sweep again as it was started, on purpose (a cancelled sweep's stopped trials run again)."""
        if self.record.source is None:
            raise TrainforgeError("", [f"no sweep named {self.name!r} was started on this machine. Fix: check the name "
                                       "(`ls $TRAINFORGE_HOME/sweeps`), or `trainforge sweep SPEC.yaml --resume` with its spec"])
        if not Path(self.record.source).exists():
            raise TrainforgeError("", [f"sweep {self.name!r} was started from {self.record.source}, which is gone. Fix: "
                                       "`trainforge sweep SPEC.yaml --resume` with the same spec"])
        run_here(self.record, poll)
        return []


@contextlib.contextmanager
def _extension_lock(name: str) -> Iterator[None]:
    """This machine's extends of one sweep, one at a time (an advisory lock beside its record), so each says the limits
    it raised from and to. Exactly once does not rest on it (members on other machines share the study's database):
    limits.take_up_asked. A cluster sweep's requests are guarded by the API's resourceVersion (sweeps/cluster.ask_extension)."""
    import fcntl
    directory = paths.sweep_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "extend.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another `trainforge sweep extend {name}` to finish", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# ---- in the cluster ---------------------------------------------------------------------------------------------

@dataclass
class ClusterSweep:
    """A sweep whose controller runs in the team's namespace, as TrainJob `job`: what a member knows of it is that
    object (its status annotation), what a member asks of it is written there."""
    name: str
    backend: Any  # a KubernetesBackend for the sweep's team
    job: dict[str, Any]

    @property
    def team(self) -> str:
        return self.backend.team

    @staticmethod
    def start(sweep: Sweep, stack: Path, kind: str, context: Optional[str], resume: bool) -> list[str]:
        """Submit the sweep's controller as a TrainJob of the team's, admitted like `submit`; return once it exists."""
        from trainforge.stackconfig import load_stack_file
        from trainforge.trainer.admission import NotAdmitted
        from trainforge.trainer.spec import with_image
        from trainforge.trainer.submission import admit_now
        from trainforge.trainer.sweeps.cluster import CONTROLLER_KIND, controller_spec, stack_payload
        platform = load_stack_file(stack)
        target = backend_for(KUBERNETES, team=sweep.base.team, kind=TRAINJOB, context=context, cost_centre=cost_centre_of(sweep.base, platform))
        team, job = sweep.base.team, contract.sweep_controller_job(sweep.name)
        existing = target.cluster.get(CONTROLLER_KIND, team, job)
        if existing is not None:
            _refuse_second_controller(sweep.name, team, existing, resume)
            target.cluster.cancel(CONTROLLER_KIND, team, job)  # a finished controller, replaced to continue the sweep
            _wait_gone(target, team, job)
        live, deployed = target.live_queue(team), target.deployed_image(team)
        # Every trial has the base's shape: admitted now as a trial would be, so a sweep that could run nothing never starts.
        trial = admit_now(with_image(sweep.base, platform, deployed), platform, target, live_queue=live)
        if not trial.admitted:
            raise NotAdmitted(sweep.base.name, trial.problems)
        spec = with_image(controller_spec(sweep, stack=stack_payload(stack), trial_kind=kind, resume=resume), platform, deployed)
        report = target.submit(spec, admit_now(spec, platform, target, live_queue=live))
        SweepRecord(backend=KUBERNETES, kind=kind, team=team, context=context, source=str(Path(sweep.source).resolve()),
                    stack=str(stack.resolve())).save(sweep.name)
        return [report.summary,
                f"sweep {sweep.name}: its controller runs in the cluster as TrainJob {contract.namespace_name(team)}/{job}; "
                f"`trainforge sweep status {sweep.name}` follows it (a kubeconfig is all it needs)"]

    @cached_property
    def document(self) -> StatusDocument:
        """The controller's status document; exits 1 saying why where there is none."""
        from trainforge.trainer.backends.kubernetes import job_state
        from trainforge.trainer.sweeps.status_document import ControllerFailed, published
        document = published(self.job)
        if document is None:
            raise TrainforgeError("", [f"sweep {self.name!r}: its controller has not reported yet (its TrainJob is "
                                       f"{job_state('trainjob', self.job)}). Fix: wait for Kueue to admit it, then ask again"], exit_code=EXIT_FAILED)
        if isinstance(document, ControllerFailed):
            raise TrainforgeError("", [f"sweep {self.name!r}: its controller could not start: {document.error}"], exit_code=EXIT_FAILED)
        return document

    def study(self) -> Any:
        from trainforge.trainer.sweeps.cluster import study_from
        return study_from(self.document)

    def facts(self) -> dict[str, Any]:
        from trainforge.trainer.backends.kubernetes import job_state
        document = self.document
        return {"controller": job_state("trainjob", self.job), "spent_usd": document.spent_usd, "planned": document.planned,
                "trials_total": document.total, "counts": document.counts, "holds": document.holds()}

    def checkpoint_of(self, job: Optional[str]) -> Optional[str]:
        return contract.fsx_job_paths(self.backend.team, job)["checkpoint_dir"] if job is not None else None

    def base(self) -> Sweep:
        from trainforge.trainer.sweeps.cluster import payload_of, sweep_of
        return sweep_of(payload_of(self.job))  # the base as the controller ran it

    def submit(self, spec: JobSpec, stack: Optional[Path]) -> str:
        from trainforge.stackconfig import load_stack_file
        from trainforge.trainer.spec import with_image
        from trainforge.trainer.submission import admit_now
        from trainforge.trainer.sweeps.cluster import payload_of, platform_of
        platform = load_stack_file(stack) if stack is not None else platform_of(payload_of(self.job))
        spec = with_image(spec, platform, self.backend.deployed_image(self.backend.team))
        return self.backend.submit(spec, admit_now(spec, platform, self.backend)).summary

    def cancel(self) -> list[str]:
        """Asked through the controller's TrainJob; the controller stops its trials at its next look."""
        from trainforge.trainer.backends import JobPhase
        from trainforge.trainer.backends.kubernetes import job_state
        from trainforge.trainer.sweeps.cluster import CONTROLLER_KIND
        finished = _finished_because(self.job)
        if finished or job_state("trainjob", self.job) in (JobPhase.SUCCEEDED, JobPhase.FAILED):
            raise TrainforgeError("", [f"sweep {self.name!r} already finished ({finished or 'its controller ended'}); "
                                       f"nothing to cancel. `trainforge sweep status {self.name}` shows its trials"], exit_code=EXIT_FAILED)
        asked = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.backend.cluster.patch(CONTROLLER_KIND, self.team, self.job["metadata"]["name"],
                                   {"metadata": {"annotations": {contract.SWEEP_CANCEL_ANNOTATION: asked}}})
        return [f"sweep {self.name}: asked its controller to cancel (at {asked}); it stops launching and cancels running trials "
                f"(each checkpoints first) at its next look. `trainforge sweep status {self.name}` shows when it has"]

    def extend(self, *, trials: int, usd: float, wall_time_s: float) -> list[str]:
        """Asked through the controller's TrainJob (the member has no database access); a finished controller is
        resumed to take it up."""
        from trainforge.trainer.backends import JobPhase
        from trainforge.trainer.backends.kubernetes import job_state
        from trainforge.trainer.sweeps.cluster import ask_extension
        written = ask_extension(self.backend.cluster, self.team, self.job, trials=trials, usd=usd, wall_time_s=wall_time_s)
        if job_state("trainjob", written) in (JobPhase.SUCCEEDED, JobPhase.FAILED):
            return [f"sweep {self.name}: its controller has ended; `trainforge sweep resume {self.name}` continues it with the extension"]
        return [f"sweep {self.name}: asked its controller to extend it (+{trials} trials, +${usd:,.2f}, +{wall_time_s:.0f} s of wall "
                "time); it takes it up at its next look"]

    def resume(self, poll: float, run_here: RunHere) -> list[str]:
        """A new controller TrainJob from the old one's sweep and stack (no file of this machine needed), resuming."""
        from trainforge.trainer.backends.kubernetes import job_state
        from trainforge.trainer.spec import with_image
        from trainforge.trainer.submission import admit_now
        from trainforge.trainer.sweeps.cluster import CONTROLLER_KIND, controller_spec, payload_of, platform_of, sweep_of
        name, team = self.job["metadata"]["name"], self.team
        _refuse_second_controller(self.name, team, self.job, resume=True)
        payload = payload_of(self.job)
        sweep, platform = sweep_of(payload), platform_of(payload)
        spec = with_image(controller_spec(sweep, stack=payload["stack"], trial_kind=payload.get("trial_kind", TRAINJOB), resume=True),
                          platform, self.backend.deployed_image(team))
        decision = admit_now(spec, platform, self.backend)
        was = job_state("trainjob", self.job)
        self.backend.cluster.cancel(CONTROLLER_KIND, team, name)
        _wait_gone(self.backend, team, name)
        said = [self.backend.submit(spec, decision).summary]
        pending = (self.job["metadata"].get("annotations") or {}).get(contract.SWEEP_EXTEND_ANNOTATION)
        if pending:  # extensions asked of the old controller: the new one takes them up (each once)
            self.backend.cluster.patch(CONTROLLER_KIND, team, spec.name, {"metadata": {"annotations": {contract.SWEEP_EXTEND_ANNOTATION: pending}}})
        return [*said, f"sweep {self.name}: resumed (its last controller had {was}) as TrainJob {contract.namespace_name(team)}/"
                       f"{spec.name}; `trainforge sweep status {self.name}` follows it"]


def _refuse_second_controller(name: str, team: str, existing: dict[str, Any], resume: bool) -> None:
    from trainforge.trainer.backends import JobPhase
    from trainforge.trainer.backends.kubernetes import job_state
    state = job_state("trainjob", existing)
    if state not in (JobPhase.SUCCEEDED, JobPhase.FAILED):
        raise TrainforgeError("", [f"sweep {name!r} already has a controller in the cluster ({state}). Fix: `trainforge sweep "
                                   f"status {name} --backend kubernetes --team {team}` follows it; `extend` raises its limits"], exit_code=EXIT_FAILED)
    if _finished_because(existing) == "cancelled" and not resume:
        raise TrainforgeError("", [f"sweep {name!r} was cancelled by `trainforge sweep cancel`. Fix: `trainforge sweep resume {name}` "
                                   "continues it on purpose, or give a new sweep another name"], exit_code=EXIT_FAILED)


def _finished_because(job: dict[str, Any]) -> Optional[str]:
    """Why the sweep ended, as its controller last reported; None while it runs, before it reported, or where its
    report is damaged (cancel and resume must still work: a resumed controller writes it anew)."""
    from trainforge.trainer.sweeps.status_document import StatusDocument, published
    try:
        document = published(job)
    except TrainforgeError:
        return None
    return document.finished_because if isinstance(document, StatusDocument) else None


def _wait_gone(target: Any, team: str, job: str, timeout_s: float = 120.0) -> None:
    """Deletion is foreground (its pods go first): the name is free once the object is gone."""
    from trainforge.trainer.sweeps.cluster import CONTROLLER_KIND
    deadline = time.monotonic() + timeout_s
    while target.cluster.get(CONTROLLER_KIND, team, job) is not None:
        if time.monotonic() > deadline:
            raise TrainforgeError("", [f"the finished controller {job} is still being deleted. Fix: try again in a minute"], exit_code=EXIT_FAILED)
        time.sleep(1.0)

