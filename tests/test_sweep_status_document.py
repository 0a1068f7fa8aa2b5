"""A cluster sweep's status document (trainer/sweeps/status_document.py): what the controller publishes reads back as
it was written, through the annotation's encoding; an earlier controller's document still reads; a damaged annotation
is refused with the fix; the member's study rebuilt from it holds the trials' own values, parameters and costs."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from trainforge.errors import EXIT_FAILED, TrainforgeError
from trainforge.trainer.controllers.sweep import STATUS_EVERY_TRIAL, document_of
from trainforge.trainer.sweeps.cluster import study_from
from trainforge.trainer.sweeps.spec import load_sweep
from trainforge.trainer.sweeps.status_document import ControllerFailed, StatusDocument, decode, encode, published
from trainforge.trainer.sweeps.study import rows

REPO = Path(__file__).resolve().parents[1]
SPACE = {"lr": FloatDistribution(1e-4, 0.3, log=True), "warmup_steps": IntDistribution(0, 40, step=10),
         "task_args.width": CategoricalDistribution([32, 64, 128])}


def a_study(trials: int) -> optuna.Study:
    """The controller's study after `trials` trials of examples/sweeps/classifier-lr.yaml: every state, costs, curves."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="clf-lr", direction="maximize")
    states = [TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.COMPLETE]
    for number in range(trials):
        state = TrialState.RUNNING if number == trials - 1 else states[number % len(states)]
        study.add_trial(create_trial(state=state, value=0.5 + number / (10 * trials) if state is TrialState.COMPLETE else None,
                                     params={"lr": 1e-3 * (1 + number % 100), "warmup_steps": 10 * (number % 5), "task_args.width": 64},
                                     distributions=SPACE, intermediate_values={20: 0.4, 40: 0.45},
                                     user_attrs={"job": f"clf-lr-t{number:03d}"}))
        study.set_user_attr(f"trial.{number}.cost_usd", 0.001 * number)
    study.set_user_attr("trial.2.stopped", "cancelled by `trainforge sweep cancel`")
    return study


def published_on_a_job(document) -> dict:
    from trainforge import contract
    return {"metadata": {"name": "sweep-clf-lr", "annotations": {contract.SWEEP_STATUS_ANNOTATION: encode(document)}}}


def test_what_the_controller_publishes_reads_back_as_written_and_rebuilds_the_trials():
    sweep = load_sweep(REPO / "examples" / "sweeps" / "classifier-lr.yaml")
    study = a_study(12)
    document = document_of(study, sweep, running=1, spent_usd=0.066)
    read = published(published_on_a_job(document))
    assert read == document, "every field, through gzip + base64 JSON"
    assert read.holds() is None and read.total == 12 and read.counts == {"complete": 5, "pruned": 3, "cancelled": 1, "fail": 2, "running": 1}
    member = study_from(read)
    assert [(r.number, r.state, r.value, r.params, r.cost_usd, r.job, r.stopped) for r in rows(member)] == \
        [(r.number, r.state, r.value, r.params, r.cost_usd, r.job, r.stopped) for r in rows(study)]
    assert member.trials[0].intermediate_values == {20: 0.4, 40: 0.45}


def test_beyond_the_trials_it_holds_whole_it_says_which_it_shows():
    sweep = load_sweep(REPO / "examples" / "sweeps" / "classifier-lr.yaml")
    document = document_of(a_study(STATUS_EVERY_TRIAL + 100), sweep, running=1, spent_usd=1.0)
    read = decode(encode(document))
    assert read.total == STATUS_EVERY_TRIAL + 100 and len(read.trials) < read.total
    assert read.shown is not None and read.holds().startswith(f"{len(read.trials)} of {read.total} trials")
    assert set(read.best) <= {t.number for t in read.trials}, "the best are always shown"


def test_a_document_an_earlier_controller_wrote_still_reads():
    earlier = {"sweep": "clf-lr", "direction": "maximize", "metric": "accuracy", "space": {"lr": {"type": "float", "low": 1e-4, "high": 0.3, "log": True}},
               "planned": 8, "counted": 1, "running": 0, "spent_usd": 0.01, "budget_usd": 5, "wall_time": "30m",
               "finished_because": "max_trials", "mlflow_run_id": None, "updated_at": 1.0, "a_key_from_a_later_version": [1, 2],
               "trials": [{"number": 0, "state": "complete", "value": 0.9, "params": {"lr": 0.01}, "cost_usd": 0.01, "duration_s": 3.0,
                           "job": "clf-lr-t000", "retry_of": None, "last_step": 40, "stopped": None, "intermediate": {"40": 0.9}}]}
    read = decode(base64.b64encode(gzip.compress(json.dumps(earlier).encode())).decode())
    assert isinstance(read, StatusDocument)
    assert read.directions == ["maximize"] and read.total == 1 and read.shown is None and read.trials[0].queued_s is None
    assert study_from(read).best_trial.params == {"lr": 0.01}


def test_a_controller_that_could_not_start_says_why():
    read = decode(encode(ControllerFailed("the study clf-lr exists with another search space", 1.0)))
    assert read == ControllerFailed("the study clf-lr exists with another search space", 1.0)


@pytest.mark.parametrize("text", [
    "not base64 !",
    base64.b64encode(b"not gzip").decode(),
    base64.b64encode(gzip.compress(b"[1, 2]", mtime=0)).decode(),
    base64.b64encode(gzip.compress(json.dumps({"direction": "maximize", "trials": []}).encode(), mtime=0)).decode(),  # no sweep, metric, space
    base64.b64encode(gzip.compress(json.dumps({"sweep": "s", "direction": "maximize", "metric": "m", "space": {},
                                               "trials": [{"number": 0}]}).encode(), mtime=0)).decode(),  # a trial without its row
], ids=["not-base64", "not-gzip", "not-an-object", "no-sweep-metric-space", "a-trial-without-its-row"])
def test_a_damaged_status_annotation_is_refused_with_the_fix(text):
    with pytest.raises(TrainforgeError) as refused:
        decode(text)
    assert refused.value.exit_code == EXIT_FAILED
    message = str(refused.value)
    assert "trainforge.io/sweep-status" in message or "status annotation" in message
    assert "Fix:" in message


def test_a_damaged_report_does_not_stand_in_the_way_of_cancel_and_resume():
    """`cancel` and `resume` ask why the sweep ended before they act; a damaged report says nothing (a resumed
    controller writes it anew), where it used to refuse them with the very fix they are."""
    from trainforge import contract
    from trainforge.trainer.sweeps.targets import _finished_because
    damaged = {"metadata": {"name": "sweep-clf-lr", "annotations": {contract.SWEEP_STATUS_ANNOTATION: "not base64 !"}}}
    assert _finished_because(damaged) is None
    sweep = load_sweep(REPO / "examples" / "sweeps" / "classifier-lr.yaml")
    study = a_study(3)
    study.set_user_attr("finished_because", "cancelled")
    assert _finished_because(published_on_a_job(document_of(study, sweep, running=0, spent_usd=0.0))) == "cancelled"
