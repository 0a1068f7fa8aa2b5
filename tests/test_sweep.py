"""`trainforge sweep`: real sweeps of the bundled classifier on this machine (trials are local jobs under torchrun),
a real MLflow server on loopback, the controller killed and restarted, and bad specs refused before anything exists."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from support.cli import run_cli, start_cli
from support.lanes import ITSELF, TRAINING, full
from support.repo import REPO
from support import studies
from optuna.trial import TrialState
from support.waiting import wait_until

from trainforge import contract, k8s_schema
from trainforge.errors import TrainforgeError
from trainforge.platform.training.runtime import cluster_training_runtimes
from trainforge.trainer.sweeps.study import counted, load_existing

BASE = yaml.safe_load((REPO / "examples" / "sweep-base.yaml").read_text())
SWEEP = yaml.safe_load((REPO / "examples" / "sweeps" / "classifier-lr.yaml").read_text())


def write_sweep(tmp: Path, **changes) -> Path:
    sweep = {**SWEEP, "base": str(REPO / "examples" / "sweep-base.yaml"), **changes}
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def cli(home: Path, *argv: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    if argv[:1] == ("sweep",) and (argv[1].endswith(".yaml") or argv[1] == "resume"):
        argv = (*argv, "--poll", "0.2")  # the controller looks at its trials five times a second, not once: a test waits less
    return run_cli(*argv, home=home, env=env, timeout=timeout)


def study_of(home: Path, name: str) -> optuna.Study:
    return studies.study(name, f"sqlite:///{home / 'sweeps' / name / 'study.db'}")


# ---- bad specs: refused whole, nothing created --------------------------------------------------------------

BAD = {
    "empty space": ({"space": {}}, "space: empty"),
    "not a run-config field": ({"space": {"learning_rate": {"type": "float", "low": 0.001, "high": 0.1}}},
                               "space.learning_rate: not a run-config field a sweep can set"),
    "a field the submitter sets": ({"space": {"output_dir": {"type": "categorical", "choices": ["a"]}}}, "space.output_dir: not a run-config field"),
    "a task argument the task lacks": ({"space": {"task_args.heads": {"type": "int", "low": 1, "high": 4}}},
                                       "space.task_args.heads: 'heads' is not an argument of the bundled task 'classifier'"),
    "a value the run config refuses": ({"space": {"lr": {"type": "float", "low": -1.0, "high": 0.1}}}, "space.lr: the value -1.0 is refused"),
    "a metric the task never reports": ({"objective": {"metric": "perplexity"}},
                                        "objective.metric: the task 'classifier' never reports 'perplexity'. Fix: one of ['loss', 'accuracy']"),
    "unknown sampler": ({"sampler": "bayes"}, "sampler: Input should be 'tpe', 'random', 'grid' or 'cmaes'"),
    "unknown pruner": ({"pruner": {"type": "asha"}}, "pruner.type: Input should be 'median', 'hyperband', 'successive_halving' or 'none'"),
    "budget of zero": ({"budget": {"usd": 0}}, "budget.usd: Input should be greater than 0"),
    "a wall time that is no duration": ({"budget": {"wall_time": "soon"}}, "wall_time: 'soon' is not a duration"),
    "grid over a continuous range": ({"sampler": "grid"}, "space.lr: the grid sampler needs a finite set of values"),
    "log scale from zero": ({"space": {"lr": {"type": "float", "low": 0.0, "high": 0.1, "log": True}}}, "a log scale needs low > 0"),
    "too many parallel trials for the cores": ({"max_parallel": 64}, "max_parallel: 64 trials x 1 worker processes need 64 cores"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_sweep_is_refused_before_any_trial_starts(tmp_path, case):
    changes, message = BAD[case]
    home = tmp_path / "home"
    result = cli(home, "sweep", str(write_sweep(tmp_path, **changes)))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not home.exists(), "nothing created for a refused sweep"


def test_a_missing_base_is_named(tmp_path):
    result = cli(tmp_path / "home", "sweep", str(write_sweep(tmp_path, base="nowhere.yaml")))
    assert result.returncode == 2 and "base: 'nowhere.yaml' does not exist" in result.stderr


# ---- a real sweep ---------------------------------------------------------------------------------------------

@pytest.mark.slow
@TRAINING  # the run's one MLflow server is the training group's (conftest)
def test_a_real_sweep_prunes_runs_in_parallel_beats_the_base_and_is_tracked(tmp_path, mlflow_tracking):
    from mlflow.tracking import MlflowClient
    home = tmp_path / "home"
    env = {"MLFLOW_TRACKING_URI": mlflow_tracking}
    result = cli(home, "sweep", str(write_sweep(tmp_path)), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all planned trials done" in result.stdout

    study = study_of(home, "clf-lr")
    trials = study.get_trials()
    assert counted(study) == len(trials) == 8, "the planned trials, each run once"
    states = [t.state for t in trials]
    assert TrialState.PRUNED in states and TrialState.COMPLETE in states, states
    spans = sorted((t.datetime_start, t.datetime_complete) for t in trials)
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), "two trials ran at the same time"
    pruned = [t for t in trials if t.state is TrialState.PRUNED]
    for t in pruned:  # stopped cleanly at a step before the end, its checkpoint kept
        job = home / "jobs" / t.user_attrs["job"]
        stopped_at = json.loads((job / "run" / "result.json").read_text())
        assert stopped_at["stopped_because"] == "pruned" and stopped_at["step"] < 120
        assert (job / "checkpoints" / f"step-{stopped_at['step']:08d}" / "COMMITTED").exists()
        assert json.loads((job / "state.json").read_text())["state"] == "succeeded"

    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(BASE))
    assert cli(home, "submit", str(base), env=env).returncode == 0
    base_accuracy = json.loads((home / "jobs" / "clf-base" / "run" / "result.json").read_text())["last_eval"]["accuracy"]
    assert study.best_value > base_accuracy + 0.1, (study.best_value, base_accuracy)

    client = MlflowClient(mlflow_tracking)
    parent = client.get_run(study.user_attrs["mlflow_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["trainforge.sweep.best_trial"] == str(study.best_trial.number)
    children = client.search_runs([parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(r.data.tags["trainforge.job_id"] for r in children) == sorted(t.user_attrs["job"] for t in trials)
    for run in children:
        trial = next(t for t in trials if t.user_attrs["job"] == run.data.tags["trainforge.job_id"])
        assert run.data.tags["trainforge.trial.state"] == trial.state.name.lower()
        assert run.data.tags["trainforge.trial"] == str(trial.number), "the trial's number, as status shows it (issue 25, item 9)"
        assert float(run.data.tags["trainforge.trial.cost_usd"]) > 0
        assert run.data.params["lr"] == str(trial.params["lr"])
        assert client.get_metric_history(run.info.run_id, "eval_accuracy"), "intermediate values in the trial's run"

    shown = cli(home, "sweep", "status", "clf-lr", "-o", "json")
    assert [r["state"] for r in json.loads(shown.stdout)["trials"]] == [t.state.name.lower() for t in trials]
    best = cli(home, "sweep", "best", "clf-lr", "--write", str(tmp_path / "best.yaml"), "-o", "json")
    found = json.loads(best.stdout)
    assert found["value"] == study.best_value and Path(found["checkpoint"]).exists()
    assert client.get_run(found["mlflow_run"]).data.tags["trainforge.job_id"] == study.best_trial.user_attrs["job"]
    assert yaml.safe_load((tmp_path / "best.yaml").read_text())["hyperparameters"]["lr"] == study.best_params["lr"]
    report = cli(home, "sweep", "report", "clf-lr", "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    for plot in ("optimization_history", "param_importances", "parallel_coordinate", "intermediate_values"):
        assert (tmp_path / "report" / f"{plot}.png").stat().st_size > 10_000
        assert (tmp_path / "report" / f"{plot}.html").exists()
    assert (tmp_path / "report" / "cost_and_time.png").stat().st_size > 10_000  # what the search cost, pruned trials too
    history = (tmp_path / "report" / "optimization_history.html").read_text()
    assert "accuracy" in history and "Objective Value" not in history, "the axis names the objective's metric"


@pytest.mark.slow
def test_a_killed_controller_continues_the_same_study(tmp_path):
    """SIGKILL the controller with trials running; kill one trial's job too (gone). The same command again: the
    running trial is adopted (its job is not started twice), the gone one failed and retried once with the same
    parameters, and the sweep ends with exactly the planned trials."""
    home = tmp_path / "home"
    # Trials slowed to ~5 s of training (the runtime's test hook), so two are surely running at once to be caught.
    slow_base = {**BASE, "hyperparameters": {**BASE["hyperparameters"], "max_steps": 80, "step_sleep_s": 0.06}}
    sweep = write_sweep(tmp_path, name="resume", pruner={"type": "none"}, max_trials=4, base=slow_base)
    env = {**os.environ, "TRAINFORGE_HOME": str(home)}
    first = start_cli("sweep", str(sweep), "--poll", "0.2", env=env, output=tmp_path / "first-controller.log")

    def two_running_after_one_done():
        if not (home / "jobs" / "resume-t000").exists():  # the study exists before its first trial's job (no race on its schema)
            return None
        trials = study_of(home, "resume").get_trials()
        running = [t for t in trials if t.state is TrialState.RUNNING and "job" in t.user_attrs
                   and (home / "jobs" / t.user_attrs["job"] / "run" / "metrics.jsonl").exists()]
        done = [t for t in trials if t.state is TrialState.COMPLETE]
        return running if len(running) == 2 and done else None
    try:
        running = wait_until(two_running_after_one_done, 600)
    except TimeoutError:
        first.kill()
        raise AssertionError("never saw two trials running after one finished; the controller said:\n"
                             + (tmp_path / "first-controller.log").read_text()[-3000:]) from None
    first.send_signal(signal.SIGKILL)
    first.wait()
    adopted, gone = running
    gone_dir = home / "jobs" / gone.user_attrs["job"]
    gone_state = json.loads((gone_dir / "state.json").read_text())
    # The job dies too (its node lost, say): its supervisor and its workers, each in its own process group.
    groups = {os.getpgid(gone_state["supervisor_pid"])} | {os.getpgid(int(p.read_text())) for p in (gone_dir / "run" / "pids").glob("*.pid")}
    for group in groups:
        os.killpg(group, signal.SIGKILL)

    second = cli(home, "sweep", str(sweep))
    assert second.returncode == 0, second.stdout + second.stderr

    study = study_of(home, "resume")
    trials = study.get_trials()
    assert counted(study) == 4 and all(t.state in (TrialState.COMPLETE, TrialState.FAIL) for t in trials)
    jobs = [t.user_attrs["job"] for t in trials]
    assert len(jobs) == len(set(jobs)), "one job per trial"
    assert next(t for t in trials if t.number == adopted.number).state is TrialState.COMPLETE
    assert json.loads((home / "jobs" / adopted.user_attrs["job"] / "state.json").read_text())["attempts"] == 1, "adopted, not restarted"
    assert next(t for t in trials if t.number == gone.number).state is TrialState.FAIL
    (retry,) = [t for t in trials if t.user_attrs.get("retry_of") == gone.number]
    assert retry.params == gone.params and retry.state is TrialState.COMPLETE
    complete_params = [json.dumps(t.params, sort_keys=True) for t in trials if t.state is TrialState.COMPLETE]
    assert len(complete_params) == len(set(complete_params)) == 4, "no parameters run to completion twice"


@pytest.mark.slow
def test_no_trial_starts_that_could_pass_the_usd_budget(tmp_path):
    from trainforge.pricing import estimate
    from trainforge.pricing import price_table
    per_trial = estimate("g6.xlarge", 1, 10 / 60, "spot", price_table().regions[0]).expected_usd
    home = tmp_path / "home"
    # Room for one trial's estimate at a time: never two running at once, though max_parallel is 2. The estimate comes
    # from the base job's limits, not its steps: short trials prove the same.
    short = {**BASE, "hyperparameters": {**BASE["hyperparameters"], "max_steps": 50, "eval_every": 25}}
    result = cli(home, "sweep", str(write_sweep(tmp_path, name="capped", max_trials=3, pruner={"type": "none"}, base=short,
                                                 budget={"usd": round(per_trial * 1.5, 4)})))
    assert result.returncode == 0, result.stdout + result.stderr
    trials = study_of(home, "capped").get_trials()
    assert len(trials) == 3
    spans = sorted((t.datetime_start, t.datetime_complete) for t in trials)
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), "one at a time within the budget"
    refused = cli(home, "sweep", str(write_sweep(tmp_path, name="broke", budget={"usd": round(per_trial / 2, 4)})))
    assert refused.returncode == 3 and "the USD budget" in refused.stdout
    assert not (home / "jobs" / "broke-t000").exists(), "no trial started"


@pytest.mark.slow
def test_a_pruned_trial_stops_every_rank_at_the_same_step_and_keeps_its_checkpoint(tmp_path):
    """Two ranks; the study already holds a strong finished trial, so the median pruner prunes this weak one at its
    first evaluation: rank 0 asks, the decision rides the step agreement, both ranks stop and save together."""
    from trainforge.trainer.runtime.pruning import make_pruner
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    pruner = {"type": "median", "startup_trials": 1, "warmup_steps": 0}
    study = optuna.create_study(study_name="pruning", storage=storage, direction="maximize", pruner=make_pruner(pruner))
    study.set_user_attr("pruner", pruner)
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=0.99, intermediate_values={20: 0.95, 40: 0.99}))
    trial = study.ask()
    spec = {**BASE, "name": "weak-trial", "workers": {"nodes": 1, "procs_per_node": 2},
            "hyperparameters": {**BASE["hyperparameters"], "lr": 1e-5},
            "sweep": {"storage": storage, "study": "pruning", "trial_id": trial._trial_id, "metric": "accuracy", "heartbeat_s": 1}}
    path = tmp_path / "trial.yaml"
    path.write_text(yaml.safe_dump(spec))
    home = tmp_path / "home"
    result = cli(home, "submit", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    job = home / "jobs" / "weak-trial"
    stopped = json.loads((job / "run" / "result.json").read_text())
    assert (stopped["exit_code"], stopped["stopped_because"], stopped["step"]) == (0, "pruned", 20)
    assert (job / "checkpoints" / "step-00000020" / "COMMITTED").exists(), "the checkpoint of the step both ranks stopped at"
    finished = study.trials[trial.number]
    assert finished.state is TrialState.PRUNED and list(finished.intermediate_values) == [20]


def test_the_example_sweep_is_valid_as_shipped():
    from trainforge.trainer.sweeps.spec import load_sweep
    sweep = load_sweep(REPO / "examples" / "sweeps" / "classifier-lr.yaml")
    assert sweep.base.name == "clf-base" and sweep.direction == "maximize" and sweep.planned_trials == 8


# ---- on the cluster: one TrainJob per trial, through the Kubernetes API ----------------------------------------

def test_a_cluster_sweep_runs_a_trainjob_per_trial_in_the_teams_queue(tmp_path, monkeypatch):
    """The real controller and Kubernetes backend against the API stand-in (tests/support/kubeapi.py). The test plays the
    Trainer and the trial pods: it reports each trial to the study and marks its TrainJob complete."""
    import threading

    from support.kubeapi import serve
    from support.cluster import VISION, queue, seeded

    from trainforge import contract
    from trainforge.stackconfig import load_stack_file
    from trainforge.trainer.admission import admit
    from trainforge.trainer.backends.kubernetes import KubernetesBackend
    from trainforge.trainer.spec import with_image
    from trainforge.trainer.sweeps.controller import SweepController
    from trainforge.trainer.sweeps.spec import parse_sweep

    platform = load_stack_file(REPO / "stacks" / "Pulumi.dev.yaml")
    raw = {**SWEEP, "name": "on-cluster", "base": str(REPO / "examples" / "sweep-base.yaml"), "max_trials": 4, "pruner": {"type": "none"},
           "budget": {"usd": 50}}
    sweep = parse_sweep(raw, "on-cluster.yaml")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    with serve(seeded()) as kube:
        monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig(tmp_path / "kubeconfig", "vision-token")))
        backend = KubernetesBackend("vision", "trainjob")
        controller = SweepController(sweep, backend, lambda spec: admit(with_image(spec, platform), platform,
                                                                       live_queue=backend.live_queue("vision")), storage, poll_s=0.2,
                                     trial_storage=contract.SWEEP_STORAGE_FROM_FILE)
        outcome: list[str] = []
        runner = threading.Thread(target=lambda: outcome.append(controller.run()), daemon=True)
        runner.start()
        seen: set[str] = set()
        study = optuna.load_study(study_name="on-cluster", storage=storage)

        def played_until_the_controller_ends() -> bool:  # the test is the Trainer and the trial pods
            for job in kube.api.of_kind("trainjobs", VISION):
                name = job["metadata"]["name"]
                if name in seen:
                    continue
                seen.add(name)
                assert "sqlite" not in json.dumps(job), "no URL in the job: not in args, not in the environment"
                args = " ".join(job["spec"]["trainer"]["args"])
                assert f"sweep.storage={contract.SWEEP_STORAGE_FROM_FILE}" in args
                (runtime,) = [r for r in cluster_training_runtimes("img") if r["metadata"]["name"] == job["spec"]["runtimeRef"]["name"]]
                (pod,) = k8s_schema.pod_templates(job, runtime).values()
                mounted = {v["name"]: v for v in pod["spec"]["volumes"]}
                (mount,) = [m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == contract.SWEEP_STORAGE_DIR]
                assert mount["readOnly"] and mounted[mount["name"]]["secret"]["secretName"] == contract.SWEEP_STORAGE_SECRET
                assert job["metadata"]["labels"][contract.KUEUE_QUEUE_LABEL] == contract.queue_name("vision")
                trial_id = int(next(a.split("=", 1)[1] for a in job["spec"]["trainer"]["args"] if a.startswith("sweep.trial_id=")))
                trial = optuna.trial.Trial(study, trial_id)  # the pod's rank 0: report, finish
                trial.report(0.5, 20)
                study.tell(trial, 0.9 - 0.01 * trial.number)
                job["status"] = {"conditions": [{"type": "Complete", "status": "True", "reason": "Done", "message": "",
                                                 "lastTransitionTime": "2026-11-22T00:00:00Z"}]}
            return not runner.is_alive()
        wait_until(played_until_the_controller_ends, 120, interval=0.1, what="the controller to finish its sweep")
        runner.join(5)
        assert outcome == ["all planned trials done"]
        assert len(seen) == 4 and counted(controller.study) == 4
        assert all(t.state is TrialState.COMPLETE for t in controller.study.get_trials())

        # The team's budget is spent: its ClusterQueue is held, and the next sweep's first trial is refused by the cluster.
        held = queue(kube)
        held["spec"]["stopPolicy"] = "Hold"
        held["metadata"]["annotations"] = {contract.BUDGET_HOLD_ANNOTATION: "$1,500.00 of $1,500.00 spent in 2026-11"}
        refused = SweepController(parse_sweep({**raw, "name": "after-budget"}, "after.yaml"), backend,
                                  lambda spec: admit(with_image(spec, platform), platform), storage, poll_s=0.2,
                                  trial_storage=contract.SWEEP_STORAGE_FROM_FILE)
        assert refused.run().startswith("a trial was not admitted by the cluster: team budget: team 'vision' is over its monthly "
                                        "budget ($1,500.00 of $1,500.00 spent in 2026-11); its queue is held until the month rolls "
                                        "over or the budget is raised. Fix: a budget increase from the team's cost-centre owner")
        assert len(kube.api.of_kind("trainjobs", VISION)) == 4, "no TrainJob created for the refused trial"


@pytest.mark.slow
def test_a_trial_reads_its_study_database_from_the_mounted_file(tmp_path):
    """As on the cluster: the URL is a file (the team's Secret, mounted), not an argument nor a variable. A real run of
    the runtime reports its evaluations to the study it names."""
    from support.training import run
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="mounted", storage=storage, direction="minimize")
    trial = study.ask()
    url = tmp_path / "sweep-database" / contract.SWEEP_STORAGE_KEY
    url.parent.mkdir()
    url.write_text(storage + "\n")
    result = run(tmp_path / "trial", "job_id=mounted-0", "max_steps=40", f"sweep.storage=file:{url}", "sweep.study=mounted",
                 f"sweep.trial_id={trial._trial_id}", "sweep.metric=accuracy", nproc=1)
    assert storage not in result.stdout + result.stderr, "the URL (a password on the cluster) is never printed"
    (done,) = optuna.load_study(study_name="mounted", storage=storage).get_trials()
    assert sorted(done.intermediate_values) == [20, 40]


@pytest.mark.parametrize("content, says", [(None, "cannot read"), ("", "is empty")])
def test_a_missing_or_empty_study_database_file_names_the_secret(tmp_path, content, says):
    from trainforge.trainer.runtime.config import UserError
    from trainforge.trainer.runtime.pruning import storage_url
    path = tmp_path / contract.SWEEP_STORAGE_KEY
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError) as refused:
        storage_url(f"file:{path}")
    assert says in str(refused.value) and contract.SWEEP_STORAGE_SECRET in str(refused.value)


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_restarted_controller_never_asks_the_parameters_it_asked_before(tmp_path, sampler):
    """Issue 25, item 2: each start of the controller opens the study again; a sampler seeded afresh replayed trial
    0's parameters (random search) and TPE's start-up trials."""
    from trainforge.trainer.sweeps.study import distributions, open_study
    from trainforge.trainer.sweeps.spec import parse_sweep
    sweep = parse_sweep({**SWEEP, "base": str(REPO / "examples" / "sweep-base.yaml"), "sampler": sampler}, "s.yaml")
    url = f"sqlite:///{tmp_path / 'study.db'}"
    asked = []
    for _start in range(4):  # four controller starts, one trial each (TPE is still in its start-up trials)
        study = open_study(sweep, url)
        trial = study.ask(distributions(sweep))
        asked.append(tuple(sorted(trial.params.items())))
        study.tell(trial, 0.5 + 0.01 * len(asked))
    assert len(set(asked)) == len(asked), asked
    # Still reproducible: the same history gives the same next parameters.
    import shutil
    shutil.copy(tmp_path / "study.db", tmp_path / "copy.db")
    assert open_study(sweep, url).ask(distributions(sweep)).params == \
        open_study(sweep, f"sqlite:///{tmp_path / 'copy.db'}").ask(distributions(sweep)).params


CHAR_LM_BASE = {"name": "b", "team": "vision", "entry": {"task": "char_lm"}, "hyperparameters": {"max_steps": 100, "eval_every": 20}}
LR = {"lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}


@pytest.mark.parametrize("space, pruner, says", [
    ({"task_args.context": {"type": "float", "low": 64.0, "high": 128.0}}, None, "space.task_args.context: the task's 'context' is int"),
    ({"task_args.dim": {"type": "categorical", "choices": [64, 96.5]}}, None, "int choices only"),
    ({"warmup_steps": {"type": "int", "low": 10, "high": 90}, "max_steps": {"type": "int", "low": 50, "high": 200}}, None,
     "a trial could draw {'warmup_steps': 90, 'max_steps': 50}"),
    (LR, {"type": "hyperband", "min_resource": 500}, "pruner.min_resource: 500 steps is not below the shortest trial's max_steps (100)"),
    (LR, {"type": "median", "warmup_steps": 100}, "pruner.warmup_steps: 100 is not below"),
    ({"max_steps": {"type": "int", "low": 40, "high": 400}}, {"type": "successive_halving", "min_resource": 60}, "max_steps (40)"),
])
def test_a_sweep_that_would_break_or_never_prune_at_run_time_is_refused_up_front(space, pruner, says):
    """Issue 25, item 8: each accepted once and then crashed every trial, or silently never pruned."""
    from trainforge.trainer.sweeps.spec import SweepSpecError, parse_sweep
    raw = {"name": "s", "base": CHAR_LM_BASE, "objective": {"metric": "loss"}, "space": space, "max_trials": 4,
           **({"pruner": pruner} if pruner else {})}
    with pytest.raises(SweepSpecError) as refused:
        parse_sweep(raw, "s.yaml")
    message = str(refused.value)
    assert message.startswith("invalid sweep spec s.yaml") and says in message, message


def test_ranges_whose_every_combination_is_valid_are_accepted():
    from trainforge.trainer.sweeps.spec import parse_sweep
    parse_sweep({"name": "s", "base": CHAR_LM_BASE, "objective": {"metric": "loss"}, "max_trials": 4, "pruner": {"type": "median", "warmup_steps": 30},
                 "space": {"warmup_steps": {"type": "int", "low": 10, "high": 40}, "max_steps": {"type": "int", "low": 50, "high": 200},
                           "task_args.context": {"type": "int", "low": 32, "high": 64}, **LR}}, "s.yaml")


@pytest.mark.slow
def test_a_cancelled_sweep_says_so_everywhere(tmp_path):
    """Issue 25, item 7: a cancelled trial shows `cancelled` and why, the cancelled controller exits 1 (not 0 like a
    finished sweep), and a second cancel says there is nothing to cancel."""
    home = tmp_path / "home"
    base = {**BASE, "hyperparameters": {**BASE["hyperparameters"], "max_steps": 100000, "eval_every": 1000}}
    spec = write_sweep(tmp_path, name="to-cancel", base=base, max_trials=2, max_parallel=1, pruner={"type": "none"})
    controller = start_cli("sweep", str(spec), "--poll", "0.2", env={**os.environ, "TRAINFORGE_HOME": str(home)})
    try:
        def a_trial_runs() -> bool:
            try:  # the database file appears before the study is in it
                return any(t.user_attrs.get("job") for t in study_of(home, "to-cancel").get_trials(states=(TrialState.RUNNING,)))
            except TrainforgeError:
                return False
        wait_until(a_trial_runs, 120)
        cancelled = cli(home, "sweep", "cancel", "to-cancel")
        assert cancelled.returncode == 0 and "1 running trial(s) stopped" in cancelled.stdout, cancelled.stdout + cancelled.stderr
        output, _ = controller.communicate(timeout=180)
    finally:
        if controller.poll() is None:
            controller.kill()
    assert controller.returncode == 1 and "cancelled" in output, output[-2000:]
    # Not a terminal: whole progress lines, one per change (issue 25, item 9: the bar was cut at 80 columns).
    assert "to-cancel: 0/2 trials, 1 running, 0 pruned, $0.00 spent" in output.splitlines(), output[-2000:]
    status = json.loads(cli(home, "sweep", "status", "to-cancel", "-o", "json").stdout)
    assert status["finished_because"] == "cancelled"
    (trial,) = status["trials"]
    assert trial["state"] == "cancelled" and "trainforge sweep cancel" in trial["stopped"]
    again = cli(home, "sweep", "cancel", "to-cancel")
    assert again.returncode == 1 and "already cancelled" in again.stderr and "Traceback" not in again.stderr


def test_cancelling_a_finished_sweep_says_it_finished(tmp_path):
    from trainforge.trainer.sweeps.study import open_study
    from trainforge.trainer.sweeps.spec import load_sweep
    home = tmp_path / "home"
    (home / "sweeps" / "done").mkdir(parents=True)
    sweep = load_sweep(write_sweep(tmp_path, name="done"))
    study = open_study(sweep, f"sqlite:///{home / 'sweeps' / 'done' / 'study.db'}")
    study.set_user_attr("finished_because", "all planned trials done")
    result = cli(home, "sweep", "cancel", "done")
    assert result.returncode == 1 and "already finished (all planned trials done); nothing to cancel" in result.stderr, result.stderr
    assert not load_existing("done", f"sqlite:///{home / 'sweeps' / 'done' / 'study.db'}").user_attrs.get("cancelled")


def test_the_wall_time_counts_only_the_time_a_controller_ran(tmp_path):
    """Issue 25, item 4: a late restart said 'wall time reached' and cancelled healthy trials, counting the hours no
    controller was up."""
    import time as clock

    from trainforge.trainer.backends.local import LocalBackend
    from trainforge.trainer.sweeps.controller import SweepController
    from trainforge.trainer.sweeps.spec import load_sweep
    sweep = load_sweep(write_sweep(tmp_path, name="clock", budget={"usd": 5, "wall_time": "1m"}))
    url = f"sqlite:///{tmp_path / 'study.db'}"
    first = SweepController(sweep, LocalBackend(), lambda spec: None, url)
    first.ran_s = 50.0  # it ran 50 s, then crashed; nobody restarted it for an hour
    first.finish("killed")
    first.study.set_user_attr("started_at", clock.time() - 3600)
    second = SweepController(sweep, LocalBackend(), lambda spec: None, url)
    assert second.ran_s == pytest.approx(50.0, abs=1.0) and not second.out_of_time()
    clock.sleep(0.3)
    second.account_time()
    assert 50.2 < second.ran_s < 52
    second.ran_s = 61.0
    assert second.out_of_time()


class ControllerKilled(BaseException):
    """Stands for a SIGKILL of the controller at a chosen point (a BaseException: nothing in the controller catches it)."""


def killed_controller_backend(after_record: bool):
    """The real local backend, its submit cut short where a kill would cut it: before the job's record exists, or
    after the record and before its supervisor starts."""
    from trainforge.trainer.backends.local import LocalBackend, prepare

    class KilledDuringSubmit(LocalBackend):
        def submit(self, spec, admission, *, detach=False, on_progress=None):
            if after_record:
                prepare(spec, admission.placement)
            raise ControllerKilled()
    return KilledDuringSubmit()


@pytest.mark.slow
@pytest.mark.parametrize("after_record", [pytest.param(False, marks=full("the other of two kill points in the same launch", kept_by=ITSELF)), True],
                         ids=["before the job exists", "before its supervisor starts"])
def test_a_controller_killed_while_launching_loses_and_strands_no_trial(tmp_path, monkeypatch, after_record):
    """Issue 25, item 5: killed between ask() and the job, the trial was failed, counted and never retried (3 planned,
    2 ran); killed between the job's record and its supervisor, the restarted controller adopted a job that never
    starts and waited for ever. Now the planned trials all run, with the asked parameters."""
    from trainforge.trainer.admission import unchecked
    from trainforge.trainer.backends import local_records
    from trainforge.trainer.backends.local import LocalBackend
    from trainforge.trainer.sweeps.controller import SweepController
    from trainforge.trainer.sweeps.spec import load_sweep
    monkeypatch.setenv("TRAINFORGE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(local_records, "SUPERVISOR_START_S", 0.0)  # a minute, shortened: the record is already older
    base = {**BASE, "hyperparameters": {**BASE["hyperparameters"], "max_steps": 60, "eval_every": 20}}
    sweep = load_sweep(write_sweep(tmp_path, name="windows", base=base, max_trials=2, max_parallel=1, pruner={"type": "none"}))
    url = f"sqlite:///{tmp_path / 'study.db'}"
    with pytest.raises(ControllerKilled):
        SweepController(sweep, killed_controller_backend(after_record), unchecked, url, poll_s=0.2).run()
    asked = load_existing("windows", url).get_trials()[0].params
    assert SweepController(sweep, LocalBackend(), unchecked, url, poll_s=0.2).run() == "all planned trials done"
    study = load_existing("windows", url)
    assert counted(study) == 2, [(t.number, t.state, t.user_attrs) for t in study.get_trials()]
    ran = [t for t in study.get_trials() if t.state is TrialState.COMPLETE]
    assert len(ran) == 2 and asked in [t.params for t in ran], "the interrupted trial's parameters ran"
    assert all(study.user_attrs.get(f"trial.{t.number}.settled") for t in study.get_trials())


@pytest.mark.slow
def test_a_trial_that_finished_while_no_controller_was_up_is_settled_by_the_next(tmp_path):
    """Issue 25, item 1: a trial whose job ended while the controller was down kept no cost, no settled state, and the
    restarted controller could start more trials on top. Killed with SIGKILL mid-trial; the job runs on and ends;
    the next start settles it and ends the sweep without another trial."""
    home = tmp_path / "home"
    # ~3 s of training (step_sleep_s), so the kill surely lands mid-trial: on a fast machine the 60 steps alone took
    # under a second, ended before the kill, and the first controller settled the trial itself.
    base = {**BASE, "hyperparameters": {**BASE["hyperparameters"], "max_steps": 60, "eval_every": 20, "step_sleep_s": 0.05}}
    spec = write_sweep(tmp_path, name="downtime", base=base, max_trials=1, max_parallel=1, pruner={"type": "none"})
    env = {**os.environ, "TRAINFORGE_HOME": str(home)}
    log = tmp_path / "first-controller.log"  # what it said, shown if it never launches (once seen under load on CI)
    first = start_cli("sweep", str(spec), "--poll", "0.2", env=env, output=log)

    def launched() -> str | None:
        try:
            trials = study_of(home, "downtime").get_trials()
        except TrainforgeError:
            return None
        return next((t.user_attrs["job"] for t in trials if t.user_attrs.get("launch") == "submitted"), None)
    try:
        wait_until(lambda: launched() is not None or first.poll() is not None, 120)
        assert launched() is not None, f"the controller launched nothing (exit {first.poll()}): {log.read_text()[-3000:]}"
    finally:
        first.kill()
        first.wait(30)
    job = launched()
    wait_until(lambda: json.loads((home / "jobs" / job / "state.json").read_text())["state"] == "succeeded", 240)
    study = study_of(home, "downtime")
    (trial,) = study.get_trials()
    assert trial.state is TrialState.COMPLETE and not study.user_attrs.get("trial.0.settled"), "ended unseen"
    again = cli(home, "sweep", str(spec))
    assert again.returncode == 0 and "all planned trials done" in again.stdout, again.stdout[-2000:] + again.stderr[-2000:]
    study = study_of(home, "downtime")
    assert len(study.get_trials()) == 1, "no trial beyond the plan"
    assert study.user_attrs["trial.0.settled"] and study.user_attrs["trial.0.cost_usd"] > 0


def test_a_sweep_can_be_extended_but_not_changed(tmp_path):
    """Issue 25, item 3: more trials, a larger budget or wall time, or the same base spelled inline, continue the
    study; an edited base job, or another space, objective, sampler, pruner or seed, is another sweep."""
    from trainforge.trainer.sweeps.study import open_study, SweepError
    from trainforge.trainer.sweeps.spec import load_sweep
    url = f"sqlite:///{tmp_path / 'study.db'}"
    first = load_sweep(write_sweep(tmp_path, name="grow", max_trials=4))
    open_study(first, url)
    for change in ({"max_trials": 12}, {"budget": {"usd": 50, "wall_time": "2h"}}, {"max_parallel": 1}, {"base": BASE}):
        study = open_study(load_sweep(write_sweep(tmp_path, name="grow", **change)), url)
    assert study.user_attrs["planned_trials"] == 8, "the limits as given on the latest start"
    edited = {**BASE, "hyperparameters": {**BASE["hyperparameters"], "max_steps": 80}}
    for change, named in (({"base": edited}, "base"), ({"seed": 1}, "seed"), ({"sampler": "random"}, "sampler"),
                          ({"space": {"lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}}}, "space")):
        with pytest.raises(SweepError) as refused:
            open_study(load_sweep(write_sweep(tmp_path, name="grow", **change)), url)
        assert f"changed: {named}" in str(refused.value) and "another name" in str(refused.value)


def test_the_median_pruner_waits_three_quarters_of_a_trial_unless_the_spec_says_otherwise(tmp_path):
    """bench_search.py: with no warm-up the median pruner stopped the configurations that end best, and half its
    searches never reached the target; the default is now 3/4 of the base's max_steps (120 here: 90)."""
    from trainforge.trainer.sweeps.spec import load_sweep
    from trainforge.trainer.sweeps.study import pruner_config
    by_default = load_sweep(write_sweep(tmp_path, name="late", pruner={"type": "median"}))
    assert pruner_config(by_default)["warmup_steps"] == 90
    assert pruner_config(load_sweep(write_sweep(tmp_path, name="early", pruner={"type": "median", "warmup_steps": 0})))["warmup_steps"] == 0


def test_a_sweep_begun_under_the_old_median_default_extends_with_its_own_file_and_prunes_as_before(tmp_path):
    """A study recorded before the default changed holds `warmup_steps: 0` in its search (the old default, dumped
    whole). Its unchanged file, which leaves the field out, extends it and keeps pruning from step 0; a file that now
    sets another warm-up is another search, refused as before."""
    from trainforge.trainer.sweeps.spec import load_sweep
    from trainforge.trainer.sweeps.study import SweepError, open_study
    url = f"sqlite:///{tmp_path / 'study.db'}"
    open_study(load_sweep(write_sweep(tmp_path, name="old", pruner={"type": "median", "startup_trials": 3, "warmup_steps": 0})), url)
    again = open_study(load_sweep(write_sweep(tmp_path, name="old", max_trials=12, pruner={"type": "median"})), url)
    assert again.user_attrs["planned_trials"] == 12 and again.user_attrs["pruner"]["warmup_steps"] == 0
    assert json.loads(again.user_attrs["spec"])["pruner"]["warmup_steps"] == 0, "the spec recorded is the one it runs"
    assert again.pruner._n_warmup_steps == 0
    with pytest.raises(SweepError) as refused:
        open_study(load_sweep(write_sweep(tmp_path, name="old", pruner={"type": "median", "warmup_steps": 50})), url)
    assert "changed: pruner" in str(refused.value)


def test_two_local_extends_at_once_are_both_applied(tmp_path):
    """Issue 40, item 5, on this machine: extend reads the limits, raises them and writes them back. Extend A is held
    between its read and its write (a pause point); extend B runs meanwhile. Unguarded, B wrote 4+5 and A then 4+3,
    losing B's; with the lock B waits for A (and says so), and the sweep ends with both."""
    from trainforge.trainer.sweeps.faults import PAUSE_AT_ENV
    from trainforge.trainer.sweeps.limits import recorded_limits
    from trainforge.trainer.sweeps.study import open_study
    from trainforge.trainer.sweeps.spec import load_sweep
    home = tmp_path / "home"
    (home / "sweeps" / "both").mkdir(parents=True)
    url = f"sqlite:///{home / 'sweeps' / 'both' / 'study.db'}"
    open_study(load_sweep(write_sweep(tmp_path, name="both", max_trials=4)), url)
    gate = tmp_path / "gate"
    env = {**os.environ, "TRAINFORGE_HOME": str(home)}

    def extend(trials: int, **extra) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "trainforge.trainer.cli", "sweep", "extend", "both", "--trials", str(trials)],
                                env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = extend(3, **{PAUSE_AT_ENV: f"extend-read:{gate}"})
    wait_until(lambda: Path(f"{gate}.reached").exists() or first.poll() is not None, 120, what="extend A to read the limits")
    assert first.poll() is None, first.communicate()
    second = extend(5)
    said = ""
    for line in second.stderr:  # B says it waits for A (the lock), or it ends having written over A's read (no lock)
        said += line
        if "waiting for another" in line:
            break
    gate.write_text("go")
    assert first.wait(timeout=120) == 0 and second.wait(timeout=120) == 0, (first.communicate(), said)
    from trainforge.trainer.sweeps.study import load_existing
    assert recorded_limits(load_existing("both", url)).max_trials == 4 + 3 + 5, said


def test_two_machines_extending_one_shared_study_at_once_are_both_applied_exactly_once(tmp_path):
    """Issue 40, item 5, across machines: two members whose machines share the study's database (each with its own
    $TRAINFORGE_HOME, so no lock between them) extend at once. Extend A is held between its read of the limits and its
    write; B runs to its end meanwhile; then A writes over B's limits from its stale read, as a lost update would.
    Each request is a key of its own, so B's is pending again, and A's look after its write applies it: both, once."""
    from trainforge.trainer.sweeps.faults import PAUSE_AT_ENV
    from trainforge.trainer.sweeps.keys import StudyKey, extension_of
    from trainforge.trainer.sweeps.limits import recorded_limits
    from trainforge.trainer.sweeps.spec import load_sweep
    from trainforge.trainer.sweeps.study import load_existing, open_study
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    open_study(load_sweep(write_sweep(tmp_path, name="shared", max_trials=4)), url)
    gate = tmp_path / "gate"

    def extend(machine: str, trials: int, **extra) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "trainforge.trainer.cli", "sweep", "extend", "shared", "--trials", str(trials),
                                 "--storage", url], env={**os.environ, "TRAINFORGE_HOME": str(tmp_path / machine), **extra},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = extend("a", 3, **{PAUSE_AT_ENV: f"extend-read:{gate}"})
    wait_until(lambda: Path(f"{gate}.reached").exists() or first.poll() is not None, 120, what="extend A to read the limits")
    assert first.poll() is None, first.communicate()
    second = extend("b", 5)
    assert second.wait(timeout=120) == 0, second.communicate()
    assert recorded_limits(load_existing("shared", url)).max_trials == 4 + 3 + 5, "B applied its own and A's pending one"
    gate.write_text("go")
    assert first.wait(timeout=120) == 0, first.communicate()
    study = load_existing("shared", url)
    asked = sorted(r for k in study.user_attrs if (r := extension_of(k)) is not None)
    assert recorded_limits(study).max_trials == 4 + 3 + 5, "A's stale write lost B's, and A's second look applied it again"
    assert sorted(study.user_attrs[StudyKey.EXTENDED]["taken"]) == asked and len(asked) == 2, "each request taken once"


def test_extension_limits_are_floors_over_the_spec(tmp_path):
    """`extend` raises the limits of the latest start; a later spec asking for more raises them further, one asking
    for less keeps the extension; a limit the sweep never had stays unlimited."""
    from trainforge.trainer.sweeps.limits import extend, in_effect, Limits
    from trainforge.trainer.sweeps.study import open_study
    from trainforge.trainer.sweeps.spec import load_sweep
    url = f"sqlite:///{tmp_path / 'study.db'}"
    sweep = load_sweep(write_sweep(tmp_path, name="floors", max_trials=4, budget={"usd": 5, "wall_time": "30m"}))
    study = open_study(sweep, url)
    before, after = extend(study, trials=16, usd=50, wall_time_s=7200)
    assert (before, after) == (Limits(4, 5.0, 1800), Limits(20, 55.0, 9000))
    assert Limits.of(in_effect(sweep, study)) == after and in_effect(sweep, study).spec.budget.wall_time == "2h30m"
    more = load_sweep(write_sweep(tmp_path, name="floors", max_trials=30, budget={"usd": 5, "wall_time": "30m"}))
    assert Limits.of(in_effect(more, open_study(more, url))) == Limits(30, 55.0, 9000)
    unlimited = load_sweep(write_sweep(tmp_path, name="floors", max_trials=4, budget={}))
    study = open_study(unlimited, url)
    assert Limits.of(in_effect(unlimited, study)) == Limits(20, None, None), "no limit given: none raised into being"
    assert extend(study, usd=10)[1].usd is None


def test_extend_and_resume_refuse_what_they_cannot_do(tmp_path):
    home = tmp_path / "home"
    nothing = cli(home, "sweep", "extend", "nope", "--trials", "+2")
    assert nothing.returncode == 2 and "no sweep named 'nope'" in nothing.stderr and "Traceback" not in nothing.stderr
    unknown = cli(home, "sweep", "resume", "nope")
    assert unknown.returncode == 2 and "no sweep named 'nope' was started on this machine" in unknown.stderr
    bad = cli(home, "sweep", "extend", "nope", "--wall-time", "+soon")
    assert bad.returncode == 2 and "'soon' is not a duration" in bad.stderr and "Fix:" in bad.stderr
    empty = cli(home, "sweep", "extend", "nope")
    assert empty.returncode == 2 and "nothing to extend" in empty.stderr


@pytest.mark.slow
def test_a_cancelled_sweep_is_resumed_only_on_purpose_and_an_extended_one_runs_on(tmp_path):
    """Issue 25: cancel was final. Now a cancelled sweep refuses to continue by accident, `resume` continues it (the
    trial the cancel stopped runs again with its parameters, uncounted), and `extend` adds trials a resume then runs."""
    home = tmp_path / "home"
    # Trials of ~2 s of training (step_sleep_s), so the cancel surely meets one running. max_steps stays above the
    # space's warm-up.
    base = {**BASE, "hyperparameters": {**BASE["hyperparameters"], "max_steps": 50, "eval_every": 25, "step_sleep_s": 0.04}}
    spec = write_sweep(tmp_path, name="again", base=base, max_trials=2, max_parallel=1, pruner={"type": "none"})
    controller = start_cli("sweep", str(spec), "--poll", "0.2", env={**os.environ, "TRAINFORGE_HOME": str(home)})
    try:
        def a_trial_runs() -> bool:
            try:
                return any(t.user_attrs.get("launch") == "submitted" for t in study_of(home, "again").get_trials(states=(TrialState.RUNNING,)))
            except TrainforgeError:
                return False
        wait_until(a_trial_runs, 120)
        assert cli(home, "sweep", "cancel", "again").returncode == 0
        output, _ = controller.communicate(timeout=180)
    finally:
        if controller.poll() is None:
            controller.kill()
    assert controller.returncode == 1, output[-2000:]
    (stopped,) = [t for t in study_of(home, "again").get_trials() if t.state is TrialState.FAIL]

    by_accident = cli(home, "sweep", str(spec))
    assert by_accident.returncode == 1 and "was cancelled" in by_accident.stderr and "sweep resume again" in by_accident.stderr
    extended = cli(home, "sweep", "extend", "again", "--trials", "+1")
    assert extended.returncode == 0 and "2 trials" in extended.stdout and "3 trials" in extended.stdout
    assert "it is cancelled: `trainforge sweep resume again`" in extended.stdout, extended.stdout
    resumed = cli(home, "sweep", "resume", "again")
    assert resumed.returncode == 0 and "all planned trials done" in resumed.stdout, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    study = study_of(home, "again")
    assert counted(study) == 3 and not study.user_attrs["cancelled"] and study.user_attrs["resumed"]
    complete = [t for t in study.get_trials() if t.state is TrialState.COMPLETE]
    assert len(complete) == 3 and stopped.params in [t.params for t in complete], "the stopped trial's parameters ran again"
    assert len({json.dumps(t.params, sort_keys=True) for t in complete}) == 3, "no parameters repeated beyond the stopped trial's"
    status = json.loads(cli(home, "sweep", "status", "again", "-o", "json").stdout)
    assert [r["state"] for r in status["trials"]].count("cancelled") == 1


@pytest.mark.slow
def test_a_running_controller_takes_up_an_extension(tmp_path, monkeypatch):
    """Raised while the sweep runs, the limits are in effect at the controller's next look: one trial planned, one
    more added while it runs, two run."""
    import threading

    from trainforge.trainer.admission import unchecked
    from trainforge.trainer.backends.local import LocalBackend
    from trainforge.trainer.sweeps.controller import SweepController
    from trainforge.trainer.sweeps.limits import controller_running, extend
    from trainforge.trainer.sweeps.spec import load_sweep
    monkeypatch.setenv("TRAINFORGE_HOME", str(tmp_path / "home"))
    base = {**BASE, "hyperparameters": {**BASE["hyperparameters"], "max_steps": 50, "eval_every": 25, "step_sleep_s": 0.05}}
    sweep = load_sweep(write_sweep(tmp_path, name="live", base=base, max_trials=1, max_parallel=1, pruner={"type": "none"}))
    url = f"sqlite:///{tmp_path / 'study.db'}"
    controller = SweepController(sweep, LocalBackend(), unchecked, url, poll_s=0.2)
    outcome: list[str] = []
    runner = threading.Thread(target=lambda: outcome.append(controller.run()), daemon=True)
    runner.start()
    study = load_existing("live", url)
    wait_until(lambda: any(t.state is TrialState.RUNNING for t in study.get_trials()), 120)
    assert controller_running(study)
    extend(study, trials=1)
    runner.join(300)
    assert outcome == ["all planned trials done"] and counted(load_existing("live", url)) == 2
    assert not controller_running(load_existing("live", url)), "a finished sweep has no controller"


def overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals alive at one moment."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals], key=lambda e: (e[0], e[1]))
    alive = most = 0
    for _, change in events:
        alive += change
        most = max(most, alive)
    return most


@pytest.mark.slow
@full("every launch step killed in turn (a minute and a half on two busy cores); the default lane kills the real "
      "controller with trials running, and the in-process launch kill, and both continue",
      kept_by="test_a_killed_controller_continues_the_same_study")
def test_a_controller_sigkilled_at_every_step_of_the_launch_path_in_turn_ends_with_the_plan(tmp_path):
    """Issue 25, 'what must be shown', in one study: the real controller is started again and again, each start killing
    itself with SIGKILL (TRAINFORGE_SWEEP_KILL_AT) the second time it reaches the next step of the launch path; its
    trials run on and finish while it is down; a last start runs without a kill. The study ends with exactly max_trials
    trials counted, every trial settled once and every run trial's cost recorded, no parameters run twice, never more
    than max_parallel trial jobs alive. Each start also meets what the previous kill left behind."""
    from trainforge.trainer.sweeps.faults import KILL_AT_ENV, LAUNCH_STEPS
    home = tmp_path / "home"
    # Each killed start uses up at most two counted trials: the plan outlasts every kill point.
    planned = 2 * len(LAUNCH_STEPS) + 2
    spec = killed_sweep(tmp_path, planned)
    for step in LAUNCH_STEPS:
        killed = cli(home, "sweep", str(spec), env={KILL_AT_ENV: f"{step}:2"})
        assert killed.returncode == -signal.SIGKILL, (step, killed.stdout[-2000:] + killed.stderr[-2000:])
        wait_until(lambda: all_trial_jobs_ended(home), 240, what=f"the trials to end while the controller is down ({step})")
    assert_the_plan_ran_once(home, cli(home, "sweep", str(spec)), planned)


def killed_sweep(tmp: Path, planned: int) -> Path:
    # Trials as small as a real trial gets (20 steps over the learning rate alone): what is under test is the
    # controller's launch path, and a kill at the second launch meets the first trial's job starting or running.
    base = {**BASE, "hyperparameters": {**BASE["hyperparameters"], "max_steps": 20, "eval_every": 10, "warmup_steps": 2}}
    return write_sweep(tmp, name="killed", base=base, max_trials=planned, max_parallel=2, pruner={"type": "none"},
                       space={"lr": SWEEP["space"]["lr"]})


def trial_jobs(home: Path) -> dict[str, dict]:
    return {d.name: json.loads((d / "state.json").read_text()) for d in (home / "jobs").glob("killed-t*") if (d / "state.json").exists()}


def all_trial_jobs_ended(home: Path) -> bool:
    return all(j["state"] in ("succeeded", "failed", "cancelled", "lost") for j in trial_jobs(home).values())


def assert_the_plan_ran_once(home: Path, last: subprocess.CompletedProcess, planned: int) -> None:
    assert last.returncode == 0 and "all planned trials done" in last.stdout, last.stdout[-3000:] + last.stderr[-3000:]
    study = study_of(home, "killed")
    trials = study.get_trials()
    assert counted(study) == planned, [(t.number, t.state, t.user_attrs) for t in trials]
    complete = [t for t in trials if t.state is TrialState.COMPLETE]
    assert len(complete) == planned and len({json.dumps(t.params, sort_keys=True) for t in complete}) == planned, "no parameters run twice"
    assert all(study.user_attrs.get(f"trial.{t.number}.settled") for t in trials), "every trial settled"
    ran = trial_jobs(home)
    assert all(study.user_attrs.get(f"trial.{t.number}.cost_usd", 0) > 0 for t in trials if t.user_attrs.get("job") in ran), \
        "every trial whose job ran has its cost"
    assert overlap([(j["started_at"], j["ended_at"]) for j in ran.values() if j.get("started_at")]) <= 2, "at most max_parallel alive"


# ---- cost as a dimension ----------------------------------------------------------------------------------------

COST_BAD = {
    "a range of instance types": ({"instance_type": {"type": "float", "low": 1.0, "high": 2.0}}, "space.instance_type: where a trial runs is a choice"),
    "an unknown instance type": ({"instance_type": {"type": "categorical", "choices": ["g6.xlarge", "g9.huge"]}},
                                 "space.instance_type: the choice 'g9.huge' is refused"),
    "an unknown capacity": ({"capacity": {"type": "categorical", "choices": ["spot", "cheap"]}}, "space.capacity: the choice 'cheap' is refused"),
}


@pytest.mark.parametrize("case", sorted(COST_BAD))
def test_a_searched_placement_that_cannot_run_is_refused(tmp_path, case):
    space, says = COST_BAD[case]
    result = cli(tmp_path / "home", "sweep", str(write_sweep(tmp_path, space={**SWEEP["space"], **space})))
    assert result.returncode == 2 and says in result.stderr and "invalid sweep spec" in result.stderr, result.stderr
    assert not (tmp_path / "home" / "sweeps").exists()


@pytest.mark.parametrize("change, says", [
    ({"pruner": {"type": "hyperband"}}, "pruner: a sweep with a second objective cannot prune"),
    ({"sampler": "cmaes", "pruner": {"type": "none"}}, "sampler: cmaes searches one objective"),
    ({"second_objective": {"metric": "accuracy"}}, "second_objective.metric: Input should be 'cost_usd' or 'run_s'"),
])
def test_a_second_objective_that_cannot_work_is_refused(tmp_path, change, says):
    raw = yaml.safe_load((REPO / "examples" / "sweeps" / "classifier-cost.yaml").read_text())
    raw = {**raw, "base": str(REPO / "examples" / "sweep-base.yaml"), **change}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    result = cli(tmp_path / "home", "sweep", str(tmp_path / "s.yaml"))
    assert result.returncode == 2 and says in result.stderr, result.stderr


@pytest.mark.slow
def test_a_sweep_searches_accuracy_against_cost_and_shows_the_pareto_front(tmp_path):
    """Issue 25, 'cost as a dimension': the instance type and capacity are searched; each trial's second value is the
    cost its job recorded; best shows the non-dominated trials; the report draws the front; the budget holds a trial
    to its dearest possible placement."""
    home = tmp_path / "home"
    raw = yaml.safe_load((REPO / "examples" / "sweeps" / "classifier-cost.yaml").read_text())
    base = {**BASE, "hyperparameters": {**BASE["hyperparameters"], "max_steps": 60}}
    (tmp_path / "cost.yaml").write_text(yaml.safe_dump({**raw, "base": base, "max_trials": 4}))
    result = cli(home, "sweep", str(tmp_path / "cost.yaml"))
    assert result.returncode == 0 and "Pareto front (accuracy vs cost_usd)" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    study = study_of(home, "clf-cost")
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    complete = [t for t in study.get_trials() if t.state is TrialState.COMPLETE]
    assert len(complete) == 4
    for t in complete:
        assert t.values[1] == pytest.approx(study.user_attrs[f"trial.{t.number}.cost_usd"]), "the second value is the trial's cost"
        ran = json.loads((home / "jobs" / t.user_attrs["job"] / "state.json").read_text())
        assert (ran["instance_type"], ran["capacity"]) == (t.params["instance_type"], t.params["capacity"]), "priced as it drew"
    best = json.loads(cli(home, "sweep", "best", "clf-cost", "-o", "json").stdout)
    front = best["pareto_front"]
    assert front and all(not any(o.values[0] >= f["value"] and o.values[1] <= f["cost_usd"] and (o.values[0], o.values[1]) != (f["value"], f["cost_usd"])
                                 for o in complete) for f in front), "no trial beats a front member on both"
    assert best["trial"] == front[0]["trial"] and front[0]["value"] == max(f["value"] for f in front)
    picked = cli(home, "sweep", "best", "clf-cost", "--trial", str(front[-1]["trial"]), "--write", str(tmp_path / "cheap.yaml"))
    assert picked.returncode == 0, picked.stderr
    written = yaml.safe_load((tmp_path / "cheap.yaml").read_text())
    assert written["resources"]["instance_type"] == front[-1]["params"]["instance_type"]
    off_front = [t.number for t in complete if t.number not in {f["trial"] for f in front}]
    if off_front:
        refused = cli(home, "sweep", "best", "clf-cost", "--trial", str(off_front[0]))
        assert refused.returncode == 2 and "not on the Pareto front" in refused.stderr
    report = cli(home, "sweep", "report", "clf-cost")
    assert report.returncode == 0 and (home / "sweeps" / "clf-cost" / "report" / "pareto_front.png").exists(), report.stdout + report.stderr
    status = json.loads(cli(home, "sweep", "status", "clf-cost", "-o", "json").stdout)
    assert status["directions"] == ["maximize", "minimize"] and all(r["second"] is not None for r in status["trials"])


def test_best_names_what_it_picks_by_and_offers_the_pareto_fronts_knee(tmp_path):
    """Issue 40, item 7: on a Pareto front `best` says it picked the best primary value, and `--knee` picks the best
    trade-off: the front's trial farthest from the line between its ends (here a trial that gives up 0.05 of accuracy
    to cost a third of the most accurate one). `--knee` on one objective, or with --trial, is refused."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    from trainforge.trainer.sweeps.study import open_study
    from trainforge.trainer.sweeps.spec import load_sweep
    cost = yaml.safe_load((REPO / "examples" / "sweeps" / "classifier-cost.yaml").read_text())
    path = tmp_path / "cost.yaml"
    path.write_text(yaml.safe_dump({**cost, "base": str(REPO / "examples" / "sweep-base.yaml")}))
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = open_study(load_sweep(path), url)
    space = {"lr": FloatDistribution(1e-3, 0.3, log=True)}
    for accuracy, usd, lr in ((0.90, 10.0, 0.1), (0.85, 3.0, 0.05), (0.80, 2.5, 0.02), (0.60, 2.0, 0.01), (0.70, 9.0, 0.2)):
        study.add_trial(create_trial(values=[accuracy, usd], params={"lr": lr}, distributions=space))
    home = tmp_path / "home"
    primary = json.loads(cli(home, "sweep", "best", "clf-cost", "--storage", url, "-o", "json").stdout)
    assert primary["trial"] == 0 and primary["picked_by"] == "the best accuracy on the Pareto front"
    assert sorted(t["trial"] for t in primary["pareto_front"]) == [0, 1, 2, 3], "trial 4 is beaten on both"
    knee = json.loads(cli(home, "sweep", "best", "clf-cost", "--storage", url, "--knee", "-o", "json").stdout)
    assert knee["trial"] == 1 and knee["params"] == {"lr": 0.05} and "knee" in knee["picked_by"]
    both = cli(home, "sweep", "best", "clf-cost", "--storage", url, "--knee", "--trial", "2")
    assert both.returncode == 2 and "--knee and --trial each choose the trial" in both.stderr


def test_the_budget_holds_a_trial_to_its_dearest_possible_placement(tmp_path):
    from trainforge.trainer.admission import unchecked
    from trainforge.trainer.backends.local import LocalBackend
    from trainforge.trainer.sweeps.controller import SweepController
    from trainforge.trainer.sweeps.costs import trial_estimate
    from trainforge.trainer.sweeps.spec import load_sweep
    from trainforge.trainer.sweeps.trials import placed_as
    sweep = load_sweep(REPO / "examples" / "sweeps" / "classifier-cost.yaml")
    controller = SweepController(sweep, LocalBackend(), unchecked, f"sqlite:///{tmp_path / 'study.db'}")
    dearest = trial_estimate(*(lambda s: (s, unchecked(s)))(placed_as(sweep.base, {"instance_type": "g6e.xlarge", "capacity": "on-demand"})))
    cheapest = trial_estimate(*(lambda s: (s, unchecked(s)))(placed_as(sweep.base, {"instance_type": "g6.xlarge", "capacity": "spot"})))
    assert controller.per_trial_usd() == pytest.approx(dearest) and dearest > cheapest > 0


# ---- warm start and promotion -----------------------------------------------------------------------------------

def test_a_sweep_warm_starts_from_the_best_trials_of_earlier_ones(tmp_path):
    """Issue 25, 'warm start': the earlier sweep's best three complete trials that fit this space run first (a value
    outside its ranges leaves a trial out; a field it does not search is dropped); an unknown earlier sweep is refused
    before this one's study exists."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    from optuna.trial import create_trial

    from trainforge.trainer.sweeps.study import open_study, SweepError
    from trainforge.trainer.sweeps.spec import load_sweep
    url = f"sqlite:///{tmp_path / 'study.db'}"
    earlier = open_study(load_sweep(write_sweep(tmp_path, name="earlier")), url)
    space = {"lr": FloatDistribution(1e-4, 0.3, log=True), "warmup_steps": IntDistribution(0, 40, step=10),
             "task_args.width": CategoricalDistribution([32, 64, 128])}
    for value, lr, width in ((0.91, 0.01, 64), (0.95, 0.02, 128), (0.97, 0.2, 32), (0.80, 0.001, 64), (0.99, 0.03, 128)):
        earlier.add_trial(create_trial(value=value, params={"lr": lr, "warmup_steps": 10, "task_args.width": width}, distributions=space))
    narrower = {"lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True}, "task_args.width": {"type": "categorical", "choices": [64, 128]}}
    later = open_study(load_sweep(write_sweep(tmp_path, name="later", space=narrower, warm_start=["earlier"])), url)
    waiting = later.get_trials(states=(TrialState.WAITING,))
    assert [t.user_attrs["warm_start"] for t in waiting] == ["earlier#4", "earlier#1"], "the best three, less the one out of range"
    assert waiting[0].system_attrs["fixed_params"] == {"lr": 0.03, "task_args.width": 128}, "warmup_steps is not searched here: dropped"
    with pytest.raises(SweepError) as refused:
        open_study(load_sweep(write_sweep(tmp_path, name="third", warm_start=["nope"])), url)
    assert "warm_start: no sweep named 'nope'" in str(refused.value)
    assert "third" not in optuna.get_all_study_names(url), "nothing created"
    assert open_study(load_sweep(write_sweep(tmp_path, name="later", space=narrower, warm_start=["earlier"])), url) \
        .get_trials(states=(TrialState.WAITING,)) == waiting, "opened again: not enqueued twice"


def test_a_warm_start_over_the_same_space_tells_the_earlier_trials_to_the_sampler_and_runs_none_again(tmp_path):
    """Issue 40, item 7: where this sweep searches every field the earlier one did, its complete trials are told to the
    new study with their values and evaluations (Optuna's add_trial), not run again; they do not count towards this
    sweep's trials, TPE models them from its first trial on, and a best trial that never ran here is not promoted."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    from optuna.trial import create_trial

    from trainforge.errors import TrainforgeError
    from trainforge.trainer.sweeps.promotion import promoted
    from trainforge.trainer.sweeps.spec import load_sweep
    from trainforge.trainer.sweeps.study import counted, distributions, open_study, transferred
    url = f"sqlite:///{tmp_path / 'study.db'}"
    earlier = open_study(load_sweep(write_sweep(tmp_path, name="earlier")), url)
    space = {"lr": FloatDistribution(1e-4, 0.3, log=True), "warmup_steps": IntDistribution(0, 40, step=10),
             "task_args.width": CategoricalDistribution([32, 64, 128])}
    told = ((0.91, 0.01, 64), (0.95, 0.02, 128), (0.97, 0.2, 32), (0.80, 0.001, 64), (0.99, 0.03, 128))
    for value, lr, width in told:
        earlier.add_trial(create_trial(value=value, params={"lr": lr, "warmup_steps": 10, "task_args.width": width}, distributions=space,
                                       intermediate_values={20: value - 0.1, 40: value}))
    later_sweep = load_sweep(write_sweep(tmp_path, name="later", warm_start=["earlier"]))
    later = open_study(later_sweep, url)
    trials = later.get_trials()
    assert not later.get_trials(states=(TrialState.WAITING,)), "nothing runs again"
    assert [(t.state, t.value, transferred(t)) for t in trials] == [(TrialState.COMPLETE, v, f"earlier#{n}") for n, (v, _, _) in
                                                                    sorted(enumerate(told), key=lambda nt: -nt[1][0])]
    assert trials[0].intermediate_values == {20: 0.99 - 0.1, 40: 0.99} and trials[0].params["lr"] == 0.03
    assert counted(later) == 0, "this sweep's own trials are all still to run"
    fresh = open_study(load_sweep(write_sweep(tmp_path, name="fresh")), url)
    asked = distributions(later_sweep)
    assert later.ask(asked).params != fresh.ask(asked).params, "TPE models the told trials at once; a fresh study's first is random"
    with pytest.raises(TrainforgeError) as refused:
        promoted(None, later_sweep, later.best_trial, 400, later, "later")
    assert "told to this sweep from earlier#4" in str(refused.value) and "trainforge sweep best earlier --promote" in str(refused.value)


def test_a_warm_start_from_a_sweep_that_scored_otherwise_is_refused_naming_what_differs(tmp_path):
    """Issue 40, item 7: an earlier sweep of another objective, or whose trials trained on another base (a step budget,
    a batch size, a task argument this sweep does not search), would seed this one with values that do not compare: it
    is refused with the difference named and nothing created. One that differs only in what this sweep searches, or in
    how often it was measured, seeds it."""
    from trainforge.trainer.sweeps.study import open_study, SweepError
    from trainforge.trainer.sweeps.spec import load_sweep
    url = f"sqlite:///{tmp_path / 'study.db'}"

    def sweep(name: str, base_changes: dict | None = None, **changes):
        base = {**BASE, **(base_changes or {})}
        (tmp_path / f"{name}-base.yaml").write_text(yaml.safe_dump(base))
        return load_sweep(write_sweep(tmp_path, name=name, base=str(tmp_path / f"{name}-base.yaml"), **changes))
    hyper = BASE["hyperparameters"]
    open_study(sweep("on-loss", objective={"metric": "loss", "direction": "minimize"}), url)
    open_study(sweep("shorter", {"hyperparameters": {**hyper, "max_steps": 60}}), url)
    open_study(sweep("wider", {"entry": {**BASE["entry"], "args": {"width": 64, "depth": 3}}}), url)
    open_study(sweep("comparable", {"hyperparameters": {**hyper, "lr": 0.05, "eval_every": 40}}), url)
    for earlier, says in (("on-loss", "warm_start: sweep 'on-loss' optimised loss (minimize), this sweep accuracy (maximize)"),
                          ("shorter", "hyperparameters.max_steps 60 vs 120"),
                          ("wider", "entry.args.depth 3 vs 2")):
        with pytest.raises(SweepError) as refused:
            open_study(sweep(f"after-{earlier}", warm_start=[earlier]), url)
        assert says in str(refused.value) and "Fix: " in str(refused.value), str(refused.value)
        assert f"after-{earlier}" not in optuna.get_all_study_names(url), "nothing created"
    open_study(sweep("after-comparable", warm_start=["comparable"]), url)  # lr is searched; eval_every only measures
    refused = cli(tmp_path / "home", "sweep", str(write_sweep(tmp_path, name="cli-after", warm_start=["shorter"])), "--storage", url)
    assert refused.returncode == 2 and "hyperparameters.max_steps 60 vs 120" in refused.stderr, refused.stderr


def over_budget_stack(tmp_path: Path, team: str) -> Path:
    """The dev stack with `team`'s monthly budget at a millionth of a dollar, as stacks/Pulumi.dev.yaml is named."""
    from trainforge.stackconfig import CONFIG_KEY
    raw = yaml.safe_load((REPO / "stacks" / "Pulumi.dev.yaml").read_text())
    for entry in raw["config"][CONFIG_KEY]["teams"]:
        if entry["name"] == team:
            entry["monthly_budget_usd"] = 0.000001
    path = tmp_path / "over-budget" / "Pulumi.dev.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.slow
@TRAINING  # the run's one MLflow server is the training group's (conftest)
def test_a_sweeps_best_trial_is_promoted_to_a_full_job_from_its_checkpoint(tmp_path, mlflow_tracking):
    """Issue 25, 'promotion': `sweep best --promote --steps N` submits the best trial's job trained on to N steps
    from the trial's newest checkpoint (weights, optimizer, step), limits scaled, its MLflow run nested under the
    sweep's and tagged with the trial it continues; the trial's own checkpoints are untouched."""
    from mlflow.tracking import MlflowClient
    home = tmp_path / "home"
    env = {"MLFLOW_TRACKING_URI": mlflow_tracking}
    base = {**BASE, "hyperparameters": {**BASE["hyperparameters"], "max_steps": 60, "eval_every": 20}}
    spec = write_sweep(tmp_path, name="promo", base=base, max_trials=2, max_parallel=2, pruner={"type": "none"})
    assert cli(home, "sweep", str(spec), env=env).returncode == 0
    too_short = cli(home, "sweep", "best", "promo", "--promote", "--steps", "60")
    assert too_short.returncode == 2 and "not beyond the trial's own 60 steps" in too_short.stderr
    spent = over_budget_stack(tmp_path, BASE["team"])  # the trials' cost this month is over it
    refused = cli(home, "sweep", "best", "promo", "--promote", "--steps", "100", "--stack", str(spent))
    assert refused.returncode == 3 and "budget" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    assert not (home / "jobs" / "promo-best").exists(), "admitted as `submit --stack` admits: nothing started"
    promoted = cli(home, "sweep", "best", "promo", "--promote", "--steps", "100", "-o", "json", env=env)
    assert promoted.returncode == 0, promoted.stdout + promoted.stderr
    found = json.loads(promoted.stdout)
    trial_job = found["job"]
    assert found["promoted"]["job"] == "promo-best" and found["promoted"]["starts_from"] == trial_job
    wait_until(lambda: json.loads((home / "jobs" / "promo-best" / "state.json").read_text())["state"] in ("succeeded", "failed"), 240)
    state = json.loads((home / "jobs" / "promo-best" / "state.json").read_text())
    result = json.loads((home / "jobs" / "promo-best" / "run" / "result.json").read_text())
    assert state["state"] == "succeeded" and result["step"] == 100, (state, result)
    log = (home / "jobs" / "promo-best" / "supervisor.log").read_text() if (home / "jobs" / "promo-best" / "supervisor.log").exists() else ""
    trial_checkpoints = sorted(p.name for p in (home / "jobs" / trial_job / "checkpoints").iterdir())
    assert trial_checkpoints == ["step-00000060"], "the trial's own checkpoints untouched"
    assert (home / "jobs" / "promo-best" / "checkpoints" / "step-00000100" / "COMMITTED").exists()
    client = MlflowClient(mlflow_tracking)
    study = study_of(home, "promo")
    (run,) = client.search_runs([client.get_run(study.user_attrs["mlflow_run_id"]).info.experiment_id],
                                filter_string="tags.`trainforge.job_id` = 'promo-best'")
    assert run.data.tags["mlflow.parentRunId"] == study.user_attrs["mlflow_run_id"]
    assert run.data.tags["trainforge.lineage.trial_job"] == trial_job and run.data.tags["trainforge.lineage.sweep"] == "promo"
    history = client.get_metric_history(run.info.run_id, "eval_accuracy")
    assert history and min(m.step for m in history) > 60, "it went on from the trial's step 60, not from scratch" + log[-500:]


def test_a_promoted_job_climbs_back_to_its_schedule_from_where_the_trial_ended():
    """Issue 40, item 7: the promoted job resumes at the trial's last step under a longer schedule, whose factor there
    is several times where the trial's had decayed to (it used to jump there at once, straight after convergence).
    It now climbs, step by step over its warmup, from the trial's last factor to its own schedule, then follows it."""
    from trainforge.trainer.runtime.build import lr_lambda
    from trainforge.trainer.runtime.config import RunConfig
    from trainforge.trainer.sweeps.promotion import rewarm_for
    hyper = {"max_steps": 60, "warmup_steps": 10, "lr": 0.01}
    trial = lr_lambda(RunConfig(**hyper))
    rewarm = rewarm_for(hyper, 60, 600)
    assert rewarm == {"from_step": 60, "from_factor": pytest.approx(trial(60)), "steps": 10}
    plain = lr_lambda(RunConfig(**{**hyper, "max_steps": 600}))
    promoted = lr_lambda(RunConfig(**{**hyper, "max_steps": 600, "rewarm": rewarm}))
    ended = trial(59)  # the trial's last step's factor
    assert plain(60) / ended > 5, "the longer schedule's factor at the trial's step: a jump without the climb"
    climb = [promoted(step) for step in range(60, 70)]
    assert climb == sorted(climb) and climb[0] < ended + (plain(60) - ended) / 5, climb
    assert [promoted(step) for step in range(70, 600, 53)] == [plain(step) for step in range(70, 600, 53)], "then its own schedule"
    with pytest.raises(ValueError, match="rewarm.steps"):
        RunConfig(**{**hyper, "rewarm": {**rewarm, "steps": 0}})


def test_starting_from_a_job_without_checkpoints_is_a_user_error_naming_the_fix(tmp_path):
    from trainforge.trainer.runtime.checkpoint_files import start_from
    from trainforge.trainer.runtime.config import UserError
    (tmp_path / "source" / "step-00000060").mkdir(parents=True)  # a save that never committed
    with pytest.raises(UserError) as refused:
        start_from(tmp_path / "source", tmp_path / "own")
    assert "holds no sound committed checkpoint" in str(refused.value) and "Fix:" in str(refused.value)
    assert not (tmp_path / "own").exists(), "nothing half-made"


def test_the_pruner_recorded_in_the_study_is_one_validated_model_for_both_sides(tmp_path):
    """Issue 23: the controller wrote the pruner as a hand-made dict and the runtime read another hand-made dict; now
    the controller records runtime/pruning.PrunerSettings and the trial validates the same record. A record from before
    (only the keys its type used) still builds; a damaged one is refused."""
    import optuna.pruners
    from pydantic import ValidationError

    from trainforge.trainer.runtime.pruning import PrunerSettings, make_pruner
    from trainforge.trainer.sweeps.spec import load_sweep
    from trainforge.trainer.sweeps.study import open_study, pruner_config
    sweep = load_sweep(write_sweep(tmp_path, name="pruned"))
    recorded = open_study(sweep, f"sqlite:///{tmp_path / 'study.db'}").user_attrs["pruner"]
    assert recorded == pruner_config(sweep) and PrunerSettings.model_validate(recorded).max_resource == sweep.max_steps()
    assert isinstance(make_pruner(recorded), optuna.pruners.HyperbandPruner)
    assert isinstance(make_pruner({"type": "median", "startup_trials": 3, "warmup_steps": 0}), optuna.pruners.MedianPruner)
    with pytest.raises(ValidationError):
        make_pruner({"type": "hyperband", "reduction_factor": 1})


def test_reconcile_after_a_restart_reads_the_study_once_not_once_per_trial(tmp_path):
    """Issue 40: a restarted controller settled 1,000 trials in 58 s on SQLite, reading every study attribute once per
    trial. It now reads them once: the storage is asked for them a fixed number of times, whatever the trial count."""
    from trainforge.trainer.sweeps.controller import SweepController
    from trainforge.trainer.sweeps.spec import parse_sweep

    sweep = parse_sweep({**SWEEP, "name": "many", "base": str(REPO / "examples" / "sweep-base.yaml"), "max_trials": 2000}, "many.yaml")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    counts = {}
    for trials in (50, 150):
        controller = SweepController(sweep, backend=None, admit=None, storage_url=storage)
        study = controller.study
        done = len(study.get_trials(deepcopy=False))
        for _ in range(done, trials):  # finished and settled trials, as a long sweep leaves them
            trial = study.ask()
            study.tell(trial, 0.5)
            study.set_user_attr(f"trial.{trial.number}.settled", True)
        reads: list[int] = []

        def counted(study_id, original=study._storage.get_study_user_attrs, sink=reads):
            sink.append(study_id)
            return original(study_id)
        study._storage.get_study_user_attrs = counted
        controller.reconcile()
        counts[trials] = len(reads)
    assert counts[150] == counts[50] <= 3, counts


def test_a_team_over_its_monthly_budget_cannot_sweep_as_it_cannot_submit(tmp_path):
    """`check` refuses the base job of a team that has spent its month's budget; its sweep used to launch trials as if
    the team had spent nothing (every path now admits through trainer/submission.py)."""
    from trainforge.stackconfig import load_stack_file
    stack = REPO / "stacks" / "Pulumi.dev.yaml"
    budget = next(t for t in load_stack_file(stack).teams if t.name == BASE["team"]).monthly_budget_usd
    home = tmp_path / "home"
    checked = cli(home, "check", str(REPO / "examples" / "sweep-base.yaml"), "--stack", str(stack), "--spent", str(budget))
    assert checked.returncode == 3, checked.stdout + checked.stderr
    refused = cli(home, "sweep", str(write_sweep(tmp_path, name="overspent")), "--stack", str(stack), "--spent", str(budget))
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "budget" in refused.stdout and "Traceback" not in refused.stdout + refused.stderr
    assert not (home / "jobs" / "overspent-t000").exists(), "no trial started"
    within = cli(home, "check", str(REPO / "examples" / "sweep-base.yaml"), "--stack", str(stack), "--spent", "0")
    assert within.returncode == 0, within.stdout
