"""A sweep on the cluster: its controller runs in the team's namespace, and a member follows it with a kubeconfig alone.

`trainforge sweep spec.yaml --backend kubernetes` submits the controller as a TrainJob of the team's (admitted by the
same rule as `submit`: quota, cost limit, the team's budget; Kueue admits it on the team's CPU flavour) and returns.
The TrainJob carries the sweep (its base resolved inline) and the stack's text as its hyperparameters; its pod runs
`trainforge sweep controller` under the team's `trainforge-sweep-controller` ServiceAccount (what a member may do with
jobs, nothing more) and reads the team's study database from its Secret, mounted as a file. The controller is the same
reconcile loop as on a laptop (controller.py), so a pod restarted after a node loss continues from the study and the
jobs alone.

The controller's own TrainJob is the sweep's status object: the study's state (trials, values, costs, the best, why it
ended) as gzip + base64 JSON in an annotation, written at most every STATUS_SAVE_S and when the sweep ends. `status`,
`best` and `report` rebuild an in-memory study from it, so they need no database access; `cancel` and `extend` are
requests a member writes as annotations of the same object, which the controller takes up at its next look.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import tempfile
import time
import uuid
from typing import Any

from trainforge import contract
from trainforge.errors import TrainforgeError
from trainforge.trainer.spec import JobSpec
from trainforge.trainer.sweeps.spec import Sweep, parse_sweep

CONTROLLER_COMMAND = ["python", "-m", "trainforge.trainer.cli", "sweep", "controller"]
CONTROLLER_KIND = "TrainJob"
STATUS_SAVE_S = 5.0
STATUS_MAX_CHARS = 200_000  # of the 256 KiB the API server allows for all of an object's annotations
NO_WALL_TIME_RUNTIME = "168h"  # a sweep without a wall time: its controller's TrainJob still ends within a week


# ---- the controller's job ----------------------------------------------------------------------------------------

def resolved(sweep: Sweep) -> dict[str, Any]:
    """The sweep spec with its base job inline, as validated: what the controller's pod parses again."""
    raw = sweep.spec.model_dump(mode="json")
    raw["base"] = sweep.base.model_dump(mode="json", exclude_none=True)
    return raw


def controller_spec(sweep: Sweep, *, stack: dict[str, str], trial_kind: str, resume: bool = False) -> JobSpec:
    """The controller as a job of the team's: on-demand CPU (it must outlive spot reclaims), a little of it, under
    the sweep's wall time (plus an hour to settle the last trials)."""
    wall = sweep.spec.budget.wall_time_s
    runtime = f"{int(wall // 3600) + 1}h" if wall is not None else NO_WALL_TIME_RUNTIME
    return JobSpec.model_validate({
        "name": contract.sweep_controller_job(sweep.name), "team": sweep.base.team, "image": sweep.base.image,
        "entry": {"command": CONTROLLER_COMMAND}, "resources": {"cpu": "1", "memory": "2Gi"}, "capacity": "on-demand",
        "tracking": sweep.base.tracking.model_dump(mode="json"), "priority": sweep.base.priority,
        "hyperparameters": {"sweep_spec": resolved(sweep), "stack": stack, "trial_kind": trial_kind, "resume": resume},
        "limits": {"max_runtime": runtime, "max_restarts": 20},
        "sweep": {"controller": sweep.name}})


def payload_of(job: dict[str, Any]) -> dict[str, Any]:
    """The controller TrainJob's hyperparameters (the sweep, the stack), as its pod reads them."""
    for variable in job["spec"]["trainer"].get("env", []):
        if variable["name"] == contract.HYPERPARAMETERS_ENV:
            return json.loads(variable["value"])
    raise TrainforgeError("", [f"{job['metadata']['name']} is not a sweep controller's TrainJob (no {contract.HYPERPARAMETERS_ENV})"])


def platform_of(payload: dict[str, Any]):
    """The stack the sweep was started with: its file's name (the environment) and text travel in the controller's
    TrainJob."""
    from trainforge.stackconfig import load_stack_file
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, os.path.basename(payload["stack"]["name"]))
        with open(path, "w") as out:
            out.write(payload["stack"]["text"])
        return load_stack_file(path)


def stack_payload(path) -> dict[str, str]:
    from pathlib import Path
    return {"name": Path(path).name, "text": Path(path).read_text()}


def sweep_of(payload: dict[str, Any]) -> Sweep:
    return parse_sweep(payload["sweep_spec"], f"sweep {payload['sweep_spec'].get('name')} (its controller's TrainJob)")


# ---- the status object ------------------------------------------------------------------------------------------

def encode(document: dict[str, Any]) -> str:
    return base64.b64encode(gzip.compress(json.dumps(document, separators=(",", ":"), default=str).encode(), mtime=0)).decode()


def decode(text: str) -> dict[str, Any]:
    return json.loads(gzip.decompress(base64.b64decode(text)))


def status_document(controller) -> dict[str, Any]:
    """What `status`, `best` and `report` show, from the study: every trial (with its evaluations while they fit)."""
    from dataclasses import asdict

    from trainforge.trainer.sweeps.study import counted, rows
    study, sweep = controller.study, controller.sweep
    curves = {t.number: t.intermediate_values for t in study.get_trials(deepcopy=False)}
    trials = [{**asdict(r), "intermediate": {str(k): v for k, v in curves.get(r.number, {}).items()}} for r in rows(study)]
    second = sweep.spec.second_objective
    return {"sweep": sweep.name, "direction": sweep.direction, "metric": sweep.spec.objective.metric,
            "directions": [d.name.lower() for d in study.directions], "second_metric": second.metric if second else None,
            "space": {k: v.model_dump(mode="json") for k, v in sweep.spec.space.items()},
            "planned": sweep.planned_trials, "counted": counted(study), "running": len(controller.running),
            "spent_usd": round(controller.spent_usd(), 6), "budget_usd": sweep.spec.budget.usd,
            "wall_time": sweep.spec.budget.wall_time, "finished_because": study.user_attrs.get("finished_because"),
            "mlflow_run_id": study.user_attrs.get("mlflow_run_id"), "updated_at": time.time(), "trials": trials}


def fitted(document: dict[str, Any]) -> str:
    """Encoded within the annotation's room: the evaluation curves go first, then the parameters of all but the
    newest trials (the table keeps every trial's state, value and cost)."""
    text = encode(document)
    if len(text) <= STATUS_MAX_CHARS:
        return text
    document = {**document, "trials": [{**t, "intermediate": {}} for t in document["trials"]], "truncated": "evaluation curves"}
    text = encode(document)
    keep = len(document["trials"])
    while len(text) > STATUS_MAX_CHARS and keep > 0:
        keep //= 2
        trials = [t if i >= len(document["trials"]) - keep else {**t, "params": {}} for i, t in enumerate(document["trials"])]
        text = encode({**document, "trials": trials, "truncated": f"parameters of all but the newest {keep} trials"})
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
        self._annotate({contract.SWEEP_STATUS_ANNOTATION: encode({"error": message, "updated_at": time.time()})})

    def _annotate(self, annotations: dict[str, str]) -> None:
        self.cluster.patch(CONTROLLER_KIND, self.team, self.job, {"metadata": {"annotations": annotations}})

    def look(self, controller) -> None:
        """Each look of the loop: a member's requests, then the status (when due)."""
        from trainforge.trainer.sweeps.limits import extend
        job = self.cluster.get(CONTROLLER_KIND, self.team, self.job) or {}
        asked = (job.get("metadata") or {}).get("annotations") or {}
        study = controller.study
        if asked.get(contract.SWEEP_CANCEL_ANNOTATION) and not study.user_attrs.get("cancelled") \
                and not study.user_attrs.get("cancel_taken") == asked[contract.SWEEP_CANCEL_ANNOTATION]:
            study.set_user_attr("cancel_taken", asked[contract.SWEEP_CANCEL_ANNOTATION])  # a resumed sweep is not cancelled again
            study.set_user_attr("cancelled", True)
        for wanted in json.loads(asked.get(contract.SWEEP_EXTEND_ANNOTATION) or "[]"):
            taken = study.user_attrs.get("extensions_taken", [])
            if wanted["id"] not in taken:
                extend(study, trials=int(wanted.get("trials", 0)), usd=float(wanted.get("usd", 0.0)),
                       wall_time_s=float(wanted.get("wall_time_s", 0.0)))
                study.set_user_attr("extensions_taken", [*taken, wanted["id"]])
        self.publish(controller)


def run_in_cluster(storage: str, poll_s: float) -> int:
    """`trainforge sweep controller`, in the controller's pod: the sweep from its TrainJob, the study from the team's
    Secret; exit 0 however the sweep ends (the status object says how; a retried pod would only end it again), 2 if
    the study refuses the sweep (not retried)."""
    from trainforge.trainer.admission import admit
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
        controller = SweepController(
            sweep, backend, lambda spec: admit(with_image(spec, platform), platform, live_queue=backend.live_queue(team)),
            storage_url(storage), tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"), poll_s=poll_s,
            on_change=status.publish, trial_storage=contract.SWEEP_STORAGE_FROM_FILE, resume=bool(payload.get("resume")),
            on_look=status.look)
    except TrainforgeError as exc:
        status.failed(str(exc))
        raise
    why = controller.run()
    status.publish(controller, force=True)
    print(f"sweep {sweep.name}: {why}", flush=True)
    return 0


# ---- a member's side ----------------------------------------------------------------------------------------------

def status_of(job: dict[str, Any]) -> dict[str, Any] | None:
    text = ((job.get("metadata") or {}).get("annotations") or {}).get(contract.SWEEP_STATUS_ANNOTATION)
    return decode(text) if text else None


def study_from(document: dict[str, Any]):
    """An in-memory Optuna study holding what the status object says: the views and the report run on it unchanged."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from trainforge.trainer.sweeps.study import quiet_optuna
    from trainforge.trainer.sweeps.spec import SweepSpec
    quiet_optuna()
    from trainforge.trainer.sweeps.study import distributions_of
    space = SweepSpec.model_validate({"name": document["sweep"], "base": "-", "space": document["space"],
                                      "objective": {"metric": document["metric"]}, "max_trials": 1}).space
    every = distributions_of(space)
    directions = document.get("directions") or [document["direction"]]
    study = optuna.create_study(study_name=document["sweep"], directions=directions)
    # What the views and the report read of the spec: the metrics' names.
    study.set_user_attr("spec", json.dumps({"objective": {"metric": document["metric"]},
                                            "second_objective": {"metric": document["second_metric"]} if document.get("second_metric") else None}))
    states = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "fail": TrialState.FAIL, "cancelled": TrialState.FAIL,
              "running": TrialState.RUNNING, "waiting": TrialState.WAITING}
    for row in document["trials"]:
        state = states[row["state"]]
        params = row["params"]
        curve = {int(k): v for k, v in row.get("intermediate", {}).items()}  # empty where it did not fit
        complete = state is TrialState.COMPLETE
        values = ([row["value"], row.get("second")] if len(directions) > 1 else [row["value"]]) if complete else None
        study.add_trial(create_trial(state=state, values=values, params=params,
                                     distributions={k: every[k] for k in params}, intermediate_values=curve,
                                     user_attrs={k: v for k, v in (("job", row["job"]), ("retry_of", row["retry_of"])) if v is not None}))
        number = study.trials[-1].number
        if row.get("cost_usd") is not None:
            study.set_user_attr(f"trial.{number}.cost_usd", row["cost_usd"])
        if row.get("stopped"):
            study.set_user_attr(f"trial.{number}.stopped", row["stopped"])
    for key in ("finished_because", "mlflow_run_id"):
        if document.get(key) is not None:
            study.set_user_attr(key, document[key])
    return study


def extend_request(job: dict[str, Any], *, trials: int, usd: float, wall_time_s: float) -> str:
    """The controller TrainJob's extension requests with one more (each taken up once, by its id)."""
    earlier = json.loads(((job.get("metadata") or {}).get("annotations") or {}).get(contract.SWEEP_EXTEND_ANNOTATION) or "[]")
    return json.dumps([*earlier, {"id": uuid.uuid4().hex, "trials": trials, "usd": usd, "wall_time_s": wall_time_s, "at": time.time()}])
