"""A cluster sweep's controller, in its pod: the sweep from its TrainJob, the study from the team's Secret, the same
reconcile loop as on a laptop (trainer/sweeps/controller.py), and the TrainJob as the sweep's status object — the
study's state published into an annotation, a member's cancel and extend taken up from annotations
(trainer/sweeps/cluster.py holds the format both sides share)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

from trainforge import contract
from trainforge.errors import TrainforgeError
from trainforge.trainer.sweeps.cluster import CONTROLLER_KIND, platform_of, sweep_of
from trainforge.trainer.sweeps.status_document import ControllerFailed, Selection, ShownTrial, StatusDocument, encode
from trainforge.trainer.sweeps.faults import kill_point
from trainforge.trainer.sweeps.outages import GIVE_UP_AFTER_S, ServicesDown, is_transient
from trainforge.trainer.sweeps.keys import StudyKey

STATUS_SAVE_S = 5.0
STATUS_MAX_CHARS = 200_000  # of the 256 KiB the API server allows for all of an object's annotations


STATUS_EVERY_TRIAL = 500  # up to this many trials the status object holds every one
STATUS_BEST = 20  # beyond: the best (single objective), or the Pareto front up to STATUS_FRONT
STATUS_FRONT = 200
STATUS_NEWEST = 200  # ... the running and waiting ones, and the newest


def status_document(controller) -> StatusDocument:
    """What `status`, `best` and `report` show without the database: the sweep's figures and its trials, each with its
    parameters and evaluations."""
    return document_of(controller.study, controller.sweep, running=len(controller.running), spent_usd=controller.spent_usd())


def document_of(study, sweep, *, running: int, spent_usd: float) -> StatusDocument:
    """The status document of a study. Up to STATUS_EVERY_TRIAL trials it holds every one; beyond, a bounded summary
    (the study database stays the record): every trial counted by state, and in full the best (or the Pareto front),
    the running and waiting ones and the newest, so `best` and `promote` always read the chosen trial's own
    parameters, at 10,000 trials as at 10."""
    from dataclasses import asdict

    from optuna.trial import TrialState

    from trainforge.trainer.sweeps.study import best_trials, counted, is_multi_objective, rows
    every = study.get_trials(deepcopy=False)  # read once: at 10,000 trials each read is a large query
    found = rows(study, every)
    counts: dict[str, int] = {}
    for r in found:
        counts[r.state] = counts.get(r.state, 0) + 1
    if is_multi_objective(study):
        best = [t.number for t in best_trials(study)[:STATUS_FRONT]]
    else:
        sign = -1.0 if sweep.direction == "maximize" else 1.0
        complete = sorted((t for t in every if t.state is TrialState.COMPLETE), key=lambda t: sign * t.values[0])
        best = [t.number for t in complete[:STATUS_BEST]]
    shown = None
    if len(found) > STATUS_EVERY_TRIAL:
        alive = [t.number for t in every if t.state in (TrialState.RUNNING, TrialState.WAITING)]
        newest = [t.number for t in every[-STATUS_NEWEST:]]
        keep = set(best) | set(alive) | set(newest)
        found = [r for r in found if r.number in keep]
        shown = Selection(best=len(best), alive=len(alive), newest=len(newest))
    curves = {t.number: t.intermediate_values for t in every}
    trials = [ShownTrial(**asdict(r), intermediate={str(k): v for k, v in curves.get(r.number, {}).items()}) for r in found]
    second = sweep.spec.second_objective
    return StatusDocument(
        sweep=sweep.name, direction=sweep.direction, metric=sweep.spec.objective.metric,
        directions=[d.name.lower() for d in study.directions], second_metric=second.metric if second else None,
        space={k: v.model_dump(mode="json") for k, v in sweep.spec.space.items()},
        planned=sweep.planned_trials, counted=counted(study, every), running=running,
        spent_usd=round(spent_usd, 6), budget_usd=sweep.spec.budget.usd,
        wall_time=sweep.spec.budget.wall_time, finished_because=study.user_attrs.get(StudyKey.FINISHED_BECAUSE),
        mlflow_run_id=study.user_attrs.get(StudyKey.MLFLOW_RUN_ID), updated_at=time.time(),
        trials_total=len(every), counts=counts, best=best, shown=shown, trials=trials)


def fitted(document: StatusDocument) -> str:
    """Encoded within the annotation's room. What gives way, in turn: the evaluation curves of all but the best
    trials, then the oldest of the newest trials (never the best, nor the running ones). No trial shown loses its
    parameters: `best` and `promote` run them."""
    text = encode(document)
    if len(text) <= STATUS_MAX_CHARS:
        return text
    best = set(document.best)
    trials = [t if t.number in best else dataclasses.replace(t, intermediate={}) for t in document.trials]
    document = dataclasses.replace(document, trials=trials, truncated="evaluation curves of all but the best trials")
    text = encode(document)
    while len(text) > STATUS_MAX_CHARS:
        expendable = [t for t in trials if t.number not in best and t.state not in ("running", "waiting")]
        if not expendable:
            break
        drop = {t.number for t in expendable[:max(1, len(expendable) // 2)]}  # the oldest half
        trials = [t for t in trials if t.number not in drop]
        document = dataclasses.replace(document, trials=trials, truncated="evaluation curves of all but the best trials; older trials")
        text = encode(document)
    return text


class StatusObject:
    """The controller's side of its TrainJob: publish the study's state; take up a member's cancel and extend."""

    def __init__(self, cluster: Any, team: str, job: str):
        self.cluster, self.team, self.job = cluster, team, job
        self._published = 0.0

    def publish(self, controller, *, force: bool = False) -> None:
        if not force and time.monotonic() - self._published < STATUS_SAVE_S:
            return
        self._annotate({contract.SWEEP_STATUS_ANNOTATION: fitted(status_document(controller))})
        self._published = time.monotonic()

    def failed(self, message: str) -> None:
        """The controller could not start (the study refused the spec): said where `status` looks."""
        self._annotate({contract.SWEEP_STATUS_ANNOTATION: encode(ControllerFailed(message, time.time()))})

    def _annotate(self, annotations: dict[str, str]) -> None:
        self.cluster.patch(CONTROLLER_KIND, self.team, self.job, {"metadata": {"annotations": annotations}})

    def look(self, controller) -> None:
        """Each look of the loop: a member's requests, then the status (when due)."""
        from trainforge.trainer.sweeps.limits import take_up
        job = self.cluster.get(CONTROLLER_KIND, self.team, self.job) or {}
        asked = (job.get("metadata") or {}).get("annotations") or {}
        study = controller.study
        if asked.get(contract.SWEEP_CANCEL_ANNOTATION) and not study.user_attrs.get(StudyKey.CANCELLED) \
                and not study.user_attrs.get(StudyKey.CANCEL_TAKEN) == asked[contract.SWEEP_CANCEL_ANNOTATION]:
            study.set_user_attr(StudyKey.CANCEL_TAKEN, asked[contract.SWEEP_CANCEL_ANNOTATION])  # a resumed sweep is not cancelled again
            study.set_user_attr(StudyKey.CANCELLED, True)
        for wanted in json.loads(asked.get(contract.SWEEP_EXTEND_ANNOTATION) or "[]"):
            if take_up(study, wanted["id"], trials=int(wanted.get("trials", 0)), usd=float(wanted.get("usd", 0.0)),
                       wall_time_s=float(wanted.get("wall_time_s", 0.0))):
                kill_point("extended")
        self.publish(controller)


def run_in_cluster(storage: str, poll_s: float, give_up_after_s: float = GIVE_UP_AFTER_S) -> int:
    """`trainforge sweep controller`, in the controller's pod: the sweep from its TrainJob, the study from the team's
    Secret; exit 0 however the sweep ends (the status object says how; a retried pod would only end it again), 2 if
    the study refuses the sweep (not retried), EXIT_SERVICES_DOWN (>= 128: the job restarts the pod, which continues
    from the study and the jobs) when the API server, the database or MLflow stays down past `give_up_after_s`, or
    does not answer at start."""
    from trainforge.trainer.submission import admit_now
    from trainforge.trainer.backends.kubernetes import KubernetesBackend
    from trainforge.trainer.runtime.pruning import storage_url
    from trainforge.trainer.spec import with_image
    from trainforge.trainer.sweeps.controller import SweepController

    payload = json.loads(os.environ[contract.HYPERPARAMETERS_ENV])
    job, team = os.environ["TRAINFORGE_JOB_ID"], os.environ["TRAINFORGE_TEAM"]
    platform = platform_of(payload)
    team_config = next((t for t in platform.teams if t.name == team), None)
    backend = KubernetesBackend(team, payload.get("trial_kind", "trainjob"), cost_centre=team_config.cost_centre if team_config else None)
    status = StatusObject(backend.cluster, team, job)
    try:
        sweep = sweep_of(payload)
        deployed = backend.deployed_image(team)
        controller = SweepController(
            sweep, backend, lambda spec: admit_now(with_image(spec, platform, deployed), platform, backend),
            storage_url(storage), tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"), poll_s=poll_s,
            on_change=status.publish, trial_storage=contract.SWEEP_STORAGE_FROM_FILE, resume=bool(payload.get("resume")),
            on_look=status.look, give_up_after_s=give_up_after_s)
    except Exception as exc:
        if is_transient(exc):  # nothing started yet: the pod's restart is the backoff
            print(f"sweep controller: a service it needs does not answer at start ({exc}); exiting {ServicesDown.exit_code} "
                  "so the job restarts it", flush=True)
            return ServicesDown.exit_code
        if isinstance(exc, TrainforgeError):
            status.failed(str(exc))
        raise
    try:
        why = controller.run()
    except ServicesDown as exc:
        print(f"sweep {sweep.name}: {exc}", flush=True)
        return exc.exit_code
    status.publish(controller, force=True)
    print(f"sweep {sweep.name}: {why}", flush=True)
    return 0
