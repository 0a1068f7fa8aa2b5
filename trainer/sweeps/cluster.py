"""A sweep on the cluster: its controller runs in the team's namespace, and a member follows it with a kubeconfig alone.

`trainforge sweep spec.yaml --backend kubernetes` submits the controller as a TrainJob of the team's (admitted by the
same rule as `submit`: quota, cost limit, the team's budget; Kueue admits it on the team's CPU flavour) and returns.
The TrainJob carries the sweep (its base resolved inline) and the stack's text as its hyperparameters; its pod runs
`trainforge sweep controller` under the team's `trainforge-sweep-controller` ServiceAccount (what a member may do with
jobs, nothing more) and reads the team's study database from its Secret, mounted as a file. The controller is the same
reconcile loop as on a laptop (controller.py), so a pod restarted after a node loss continues from the study and the
jobs alone.

The controller's own TrainJob is the sweep's status object: the study's state (trials, values, costs, the best, why it
ended; status_document.py) as gzip + base64 JSON in an annotation, written at most every STATUS_SAVE_S and when the sweep ends. `status`,
`best` and `report` rebuild an in-memory study from it, so they need no database access; `cancel` and `extend` are
requests a member writes as annotations of the same object, which the controller takes up at its next look.

This module is both sides' shared knowledge of the controller's job and the member's side (the status document is
status_document.py); what runs in the controller's pod is trainer/controllers/sweep.py.
"""

from __future__ import annotations

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
from trainforge.trainer.sweeps.status_document import StatusDocument
from trainforge.trainer.sweeps.keys import StudyKey, TrialFact, TrialKey, fact_key

CONTROLLER_COMMAND = ["python", "-m", "trainforge.trainer.cli", "sweep", "controller"]
CONTROLLER_KIND = "TrainJob"
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


# ---- a member's side ----------------------------------------------------------------------------------------------

def study_from(document: StatusDocument):
    """An in-memory Optuna study holding what the status object says: the views and the report run on it unchanged."""
    import optuna
    from optuna.study import StudyDirection
    from optuna.trial import TrialState, create_trial

    from trainforge.trainer.sweeps.study import quiet_optuna
    from trainforge.trainer.sweeps.spec import SweepSpec
    quiet_optuna()
    from trainforge.trainer.sweeps.study import distributions_of
    space = SweepSpec.model_validate({"name": document.sweep, "base": "-", "space": document.space,
                                      "objective": {"metric": document.metric}, "max_trials": 1}).space
    every = distributions_of(space)
    directions = [StudyDirection[d.upper()] for d in document.directions]
    study = optuna.create_study(study_name=document.sweep, directions=directions)
    # What the views and the report read of the spec: the metrics' names.
    study.set_user_attr(StudyKey.SPEC, json.dumps({"objective": {"metric": document.metric},
                                            "second_objective": {"metric": document.second_metric} if document.second_metric else None}))
    states = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "fail": TrialState.FAIL, "cancelled": TrialState.FAIL,
              "running": TrialState.RUNNING, "waiting": TrialState.WAITING}
    for row in document.trials:
        state = states[row.state]
        curve = {int(k): v for k, v in row.intermediate.items()}  # empty where it did not fit
        complete = state is TrialState.COMPLETE
        values = [v for v in (row.value, row.second)[:len(directions)] if v is not None] if complete else None
        study.add_trial(create_trial(state=state, values=values, params=row.params,
                                     distributions={k: every[k] for k in row.params}, intermediate_values=curve,
                                     user_attrs={k: v for k, v in ((TrialKey.JOB, row.job), (TrialKey.RETRY_OF, row.retry_of),
                                                                   (TrialKey.TRIAL_NUMBER, row.number),
                                                                   (TrialKey.TRANSFERRED_FROM, row.transferred_from)) if v is not None}))
        number = study.trials[-1].number
        if row.cost_usd is not None:
            study.set_user_attr(fact_key(number, TrialFact.COST_USD), row.cost_usd)
        if row.duration_s is not None:
            study.set_user_attr(fact_key(number, TrialFact.RUN_S), row.duration_s)
        if row.queued_s is not None:
            study.set_user_attr(fact_key(number, TrialFact.QUEUED_S), row.queued_s)
        if row.stopped:
            study.set_user_attr(fact_key(number, TrialFact.STOPPED), row.stopped)
    for key, value in ((StudyKey.FINISHED_BECAUSE, document.finished_because), (StudyKey.MLFLOW_RUN_ID, document.mlflow_run_id)):
        if value is not None:
            study.set_user_attr(key, value)
    study.set_user_attr(StudyKey.STATUS_HOLDS, document.holds())
    return study


CONFLICT_ATTEMPTS = 8  # members writing the same controller's requests at once: each retry follows another's landed write


def extend_request(job: dict[str, Any], request: dict[str, Any]) -> str:
    """The controller TrainJob's extension requests with this one added (each taken up once, by its id; a request
    already there, from an earlier attempt of the same ask, is not added twice)."""
    earlier = json.loads(((job.get("metadata") or {}).get("annotations") or {}).get(contract.SWEEP_EXTEND_ANNOTATION) or "[]")
    return json.dumps([*earlier, *([] if any(e.get("id") == request["id"] for e in earlier) else [request])])


def ask_extension(cluster: Any, team: str, job: dict[str, Any], *, trials: int, usd: float, wall_time_s: float) -> dict[str, Any]:
    """Add an extension request to the controller's TrainJob, exactly once whoever else writes it meanwhile: the patch
    names the resourceVersion it was computed from, so the API server refuses it (409) when another member's request
    (or the controller's status) landed in between; the object is read again and the same request (same id) added
    to what is there now. `job`: the object as last read. The object as written."""
    from trainforge.trainer.kube import ClusterError
    request = {"id": uuid.uuid4().hex, "trials": trials, "usd": usd, "wall_time_s": wall_time_s, "at": time.time()}
    name = job["metadata"]["name"]
    for _ in range(CONFLICT_ATTEMPTS):
        patch = {"metadata": {"resourceVersion": job["metadata"].get("resourceVersion"),
                              "annotations": {contract.SWEEP_EXTEND_ANNOTATION: extend_request(job, request)}}}
        try:
            written = cluster.patch(CONTROLLER_KIND, team, name, patch)
        except ClusterError as exc:
            if exc.status != 409:
                raise
            job = cluster.get(CONTROLLER_KIND, team, name) or job
            continue
        if written is None:
            raise TrainforgeError("", [f"the sweep's controller TrainJob {name} is gone. Fix: `trainforge sweep resume` starts it again"])
        return written
    raise TrainforgeError("", [f"{name} changed under each of {CONFLICT_ATTEMPTS} attempts to add the extension (others writing it at "
                               "once); nothing was added. Fix: run the same `trainforge sweep extend` again"])
