"""`trainforge sweep` for a sweep whose controller runs in the cluster (trainer/sweeps/cluster.py): start it as a team
TrainJob, find it, read its status object, and ask it to cancel, extend or resume — with a kubeconfig alone."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trainforge.errors import EXIT_FAILED
from trainforge.trainer.cli.common import BackendName, Kind
from trainforge.trainer.sweeps.record import KUBERNETES, SweepRecord


def start_in_cluster(sweep, stack: Path, kind: Kind, context: Optional[str], resume: bool) -> None:
    """Submit the sweep's controller as a TrainJob of the team's, admitted like `submit`; return once it exists."""
    from trainforge import contract
    from trainforge.trainer.admission import NotAdmitted
    from trainforge.trainer.submission import admit_now
    from trainforge.trainer.cli.common import backend, cost_centre, load_platform
    from trainforge.trainer.spec import with_image
    from trainforge.trainer.sweeps.cluster import CONTROLLER_KIND, controller_spec, stack_payload
    platform = load_platform(stack)
    target = backend(BackendName.kubernetes, team=sweep.base.team, kind=Kind.trainjob, context=context,
                     cost_centre=cost_centre(sweep.base, platform))
    team, job = sweep.base.team, contract.sweep_controller_job(sweep.name)
    existing = target.cluster.get(CONTROLLER_KIND, team, job)
    if existing is not None:
        refuse_second_controller(sweep.name, team, existing, resume)
        target.cluster.cancel(CONTROLLER_KIND, team, job)  # a finished controller, replaced to continue the sweep
        wait_gone(target, team, job)
    live, deployed = target.live_queue(team), target.deployed_image(team)
    # Every trial has the base's shape: admitted now as a trial would be, so a sweep that could run nothing never starts.
    trial = admit_now(with_image(sweep.base, platform, deployed), platform, target, live_queue=live)
    if not trial.admitted:
        raise NotAdmitted(sweep.base.name, trial.problems)
    spec = with_image(controller_spec(sweep, stack=stack_payload(stack), trial_kind=kind.value, resume=resume), platform, deployed)
    report = target.submit(spec, admit_now(spec, platform, target, live_queue=live))
    SweepRecord(backend=KUBERNETES, kind=kind.value, team=team, context=context, source=str(Path(sweep.source).resolve()),
                stack=str(stack.resolve())).save(sweep.name)
    typer.echo(report.summary)
    typer.echo(f"sweep {sweep.name}: its controller runs in the cluster as TrainJob {contract.namespace_name(team)}/{job}; "
               f"`trainforge sweep status {sweep.name}` follows it (a kubeconfig is all it needs)")


def refuse_second_controller(name: str, team: str, existing: dict, resume: bool) -> None:
    from trainforge.errors import TrainforgeError
    from trainforge.trainer.backends import JobPhase
    from trainforge.trainer.backends.kubernetes import job_state
    from trainforge.trainer.sweeps.cluster import status_of
    state = job_state("trainjob", existing)
    document = status_of(existing) or {}
    if state not in (JobPhase.SUCCEEDED, JobPhase.FAILED):
        raise TrainforgeError("", [f"sweep {name!r} already has a controller in the cluster ({state}). Fix: `trainforge sweep "
                                   f"status {name} --backend kubernetes --team {team}` follows it; `extend` raises its limits"], exit_code=EXIT_FAILED)
    if document.get("finished_because") == "cancelled" and not resume:
        raise TrainforgeError("", [f"sweep {name!r} was cancelled by `trainforge sweep cancel`. Fix: `trainforge sweep resume {name}` "
                                   "continues it on purpose, or give a new sweep another name"], exit_code=EXIT_FAILED)


def wait_gone(target, team: str, job: str, timeout_s: float = 120.0) -> None:
    """Deletion is foreground (its pods go first): the name is free once the object is gone."""
    import time
    from trainforge.errors import TrainforgeError
    from trainforge.trainer.sweeps.cluster import CONTROLLER_KIND
    deadline = time.monotonic() + timeout_s
    while target.cluster.get(CONTROLLER_KIND, team, job) is not None:
        if time.monotonic() > deadline:
            raise TrainforgeError("", [f"the finished controller {job} is still being deleted. Fix: try again in a minute"], exit_code=EXIT_FAILED)
        time.sleep(1.0)


def in_cluster(name: str, backend_name: Optional[BackendName], team: Optional[str], context: Optional[str]):
    """(backend, the controller's TrainJob) for a sweep that runs in the cluster; None for one on this machine."""
    from trainforge import contract
    from trainforge.errors import TrainforgeError
    from trainforge.trainer.cli.common import backend
    from trainforge.trainer.sweeps.cluster import CONTROLLER_KIND
    record = SweepRecord.load(name)
    chosen = backend_name or BackendName(record.backend)
    if chosen is not BackendName.kubernetes:
        return None
    team = team or record.team
    if team is None:
        raise TrainforgeError("", ["--team: a cluster sweep lives in its team's namespace. Fix: --team <team>"])
    target = backend(BackendName.kubernetes, team=team, kind=Kind(record.kind), context=context or record.context)
    job = target.cluster.get(CONTROLLER_KIND, team, contract.sweep_controller_job(name))
    if job is None:
        raise TrainforgeError("", [f"no sweep named {name!r} in namespace {contract.namespace_name(team)} (no TrainJob "
                                   f"{contract.sweep_controller_job(name)}). Fix: check the name and --team; `trainforge sweep "
                                   "SPEC.yaml --backend kubernetes --stack ...` starts one"])
    return target, job


def cluster_study(name: str, job: dict):
    """The in-memory study the controller's status object describes; exits 1 saying why where there is none."""
    from trainforge.errors import TrainforgeError
    from trainforge.trainer.backends.kubernetes import job_state
    from trainforge.trainer.sweeps.cluster import status_of, study_from
    document = status_of(job)
    if document is None:
        raise TrainforgeError("", [f"sweep {name!r}: its controller has not reported yet (its TrainJob is "
                                   f"{job_state('trainjob', job)}). Fix: wait for Kueue to admit it, then ask again"], exit_code=EXIT_FAILED)
    if document.get("error"):
        raise TrainforgeError("", [f"sweep {name!r}: its controller could not start: {document['error']}"], exit_code=EXIT_FAILED)
    return study_from(document), document


def cancel_in_cluster(name: str, target, job: dict) -> None:
    """Asked through the controller's TrainJob; the controller stops its trials at its next look."""
    import datetime

    from trainforge import contract
    from trainforge.errors import TrainforgeError
    from trainforge.trainer.backends import JobPhase
    from trainforge.trainer.backends.kubernetes import job_state
    from trainforge.trainer.sweeps.cluster import CONTROLLER_KIND, status_of
    document = status_of(job) or {}
    if document.get("finished_because") or job_state("trainjob", job) in (JobPhase.SUCCEEDED, JobPhase.FAILED):
        raise TrainforgeError("", [f"sweep {name!r} already finished ({document.get('finished_because') or 'its controller ended'}); "
                                   f"nothing to cancel. `trainforge sweep status {name}` shows its trials"], exit_code=EXIT_FAILED)
    asked = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    target.cluster.patch(CONTROLLER_KIND, target.team, job["metadata"]["name"],
                         {"metadata": {"annotations": {contract.SWEEP_CANCEL_ANNOTATION: asked}}})
    typer.echo(f"sweep {name}: asked its controller to cancel (at {asked}); it stops launching and cancels running trials (each "
               f"checkpoints first) at its next look. `trainforge sweep status {name}` shows when it has")


def resume_in_cluster(name: str, target, job: dict) -> None:
    """A new controller TrainJob from the old one's sweep and stack (no file of this machine needed), resuming."""
    from trainforge import contract
    from trainforge.trainer.submission import admit_now
    from trainforge.trainer.backends.kubernetes import job_state
    from trainforge.trainer.spec import with_image
    from trainforge.trainer.sweeps.cluster import CONTROLLER_KIND, controller_spec, payload_of, platform_of, sweep_of
    refuse_second_controller(name, target.team, job, resume=True)
    payload = payload_of(job)
    sweep, platform = sweep_of(payload), platform_of(payload)
    spec = with_image(controller_spec(sweep, stack=payload["stack"], trial_kind=payload.get("trial_kind", "trainjob"), resume=True), platform,
                      target.deployed_image(target.team))
    decision = admit_now(spec, platform, target)
    was = job_state("trainjob", job)
    target.cluster.cancel(CONTROLLER_KIND, target.team, job["metadata"]["name"])
    wait_gone(target, target.team, job["metadata"]["name"])
    typer.echo(target.submit(spec, decision).summary)
    pending = (job["metadata"].get("annotations") or {}).get(contract.SWEEP_EXTEND_ANNOTATION)
    if pending:  # extensions asked of the old controller: the new one takes them up (each once)
        target.cluster.patch(CONTROLLER_KIND, target.team, spec.name, {"metadata": {"annotations": {contract.SWEEP_EXTEND_ANNOTATION: pending}}})
    typer.echo(f"sweep {name}: resumed (its last controller had {was}) as TrainJob {contract.namespace_name(target.team)}/"
               f"{spec.name}; `trainforge sweep status {name}` follows it")


def extend_in_cluster(name: str, target, job: dict, *, trials: int, usd: float, wall_time_s: float) -> None:
    """Asked through the controller's TrainJob (the member has no database access); a finished controller is resumed
    to take it up."""
    from trainforge.trainer.backends import JobPhase
    from trainforge.trainer.backends.kubernetes import job_state
    from trainforge.trainer.sweeps.cluster import ask_extension
    written = ask_extension(target.cluster, target.team, job, trials=trials, usd=usd, wall_time_s=wall_time_s)
    if job_state("trainjob", written) in (JobPhase.SUCCEEDED, JobPhase.FAILED):
        typer.echo(f"sweep {name}: its controller has ended; `trainforge sweep resume {name}` continues it with the extension")
    else:
        typer.echo(f"sweep {name}: asked its controller to extend it (+{trials} trials, +${usd:,.2f}, +{wall_time_s:.0f} s of wall time); "
                   "it takes it up at its next look")
