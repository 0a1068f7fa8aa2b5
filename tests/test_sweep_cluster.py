"""A cluster sweep's controller runs in the team's namespace (issue 25, 'in the cluster'), tested against the API
stand-in (tests/support/kubeapi.py) holding the program's own objects: the controller's TrainJob as a member's CLI creates it,
its pod as the Trainer would build it (admitted by the program's policies, restricted), the controller process run
as that pod would run it — under the program's ServiceAccount, authorised by the program's RBAC — over a real SQLite
study, killed and restarted as after a node loss. The test plays the Trainer and the trial pods: each trial's rank 0
reports to the study and its TrainJob is marked complete. A member follows, cancels, extends and resumes it with a
kubeconfig alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest
import yaml
from support.cli import StartedCli, run_cli, start_cli
from support.repo import REPO
from support import studies
from support.kubeapi import serve, service_account
from optuna.trial import TrialState
from support.pod_security import restricted_violations
from support.cluster import STACK, VISION, raw_request, seeded
from support.cluster import Program, TRAINJOBS
from support.waiting import wait_until


from trainforge import contract
from trainforge.trainer.spec import load_spec
from trainforge.trainer.sweeps.study import counted, load_existing

SWEEP = yaml.safe_load((REPO / "examples" / "sweeps" / "classifier-lr.yaml").read_text())

CONTROLLER_TOKEN = "sweep-controller-token"


def sweep_file(tmp: Path, name: str, **changes) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "name": name, "base": str(REPO / "examples" / "sweep-base.yaml"), "pruner": {"type": "none"},
                                    "budget": {"usd": 50}, **changes}))
    return path


class Cluster:
    """The stand-in with the program's objects; a member's kubeconfig and the controller ServiceAccount's."""

    def __init__(self, served, tmp: Path):
        self.served, self.tmp = served, tmp
        self.member = served.kubeconfig(tmp / "member.kubeconfig", "vision-token")
        self.controller = served.kubeconfig(tmp / "controller.kubeconfig", CONTROLLER_TOKEN)
        self.storage = tmp / "sweep-database"  # the team's Secret as its pod mounts it: one file holding the URL
        self.url = f"sqlite:///{tmp / 'study.db'}"
        self.storage.write_text(self.url)

    def cli(self, *argv: str, home: str = "member-home") -> subprocess.CompletedProcess:
        return run_cli(*argv, home=self.tmp / home, env={"KUBECONFIG": str(self.member)})

    def job(self, name: str) -> dict | None:
        return self.served.api.find(*TRAINJOBS, VISION, name)

    def start_controller(self, sweep: str, log: Path | None = None, give_up_after: float | None = None,
                         extra_env: dict[str, str] | None = None) -> StartedCli:
        """What the controller's pod runs, with what its pod gets: the TrainJob's environment, its token. `log`: its
        output goes there (read while it runs), else to a pipe; `extra_env`: a fault to inject."""
        job = self.job(contract.sweep_controller_job(sweep))
        env = {e["name"]: e["value"] for e in job["spec"]["trainer"]["env"] if "value" in e}
        assert job["spec"]["trainer"]["command"][-5:] == ["python", "-m", "trainforge.trainer.cli", "sweep", "controller"]
        patience = ["--give-up-after", str(give_up_after)] if give_up_after is not None else []
        return start_cli("sweep", "controller", "--storage", f"file:{self.storage}", "--poll", "0.2", *patience, output=log,
                         env={**os.environ, **{k: env[k] for k in (contract.HYPERPARAMETERS_ENV, "TRAINFORGE_JOB_ID", "TRAINFORGE_TEAM")},
                              "KUBECONFIG": str(self.controller), "TRAINFORGE_HOME": str(self.tmp / "pod-home"), **(extra_env or {})})

    def submit_sweep(self, name: str, **changes) -> None:
        """A member starts the sweep: its controller's TrainJob is created (the test runs what its pod would)."""
        spec = sweep_file(self.tmp, name, **changes)
        assert self.cli("sweep", str(spec), "--backend", "kubernetes", "--stack", str(STACK)).returncode == 0

    def start_sweep(self, name: str, give_up_after: float | None = None, **changes) -> tuple[StartedCli, Path]:
        """The sweep submitted and its controller started, its output in controller.log (read while it runs)."""
        self.submit_sweep(name, **changes)
        log = self.tmp / "controller.log"
        return self.start_controller(name, log=log, give_up_after=give_up_after), log

    def trials(self, sweep: str) -> list[dict]:
        return [j for j in self.served.api.of_kind("trainjobs", VISION)
                if j["metadata"]["name"].startswith(f"{sweep}-t")]

    @staticmethod
    def trial_id(job: dict) -> int:
        """The study's id of the trial a trial job runs, as its args name it."""
        return int(next(a.split("=", 1)[1] for a in job["spec"]["trainer"]["args"] if a.startswith("sweep.trial_id=")))

    def play_until_it_ends(self, sweep: str, controller: StartedCli, what: str) -> None:
        """The test as the Trainer: it finishes every trial it sees until the controller ends (killed if it does not)."""
        def played() -> bool:
            self.finish_trials(sweep)
            return controller.poll() is not None
        try:
            wait_until(played, 180, what=what)
        finally:
            if controller.poll() is None:
                controller.kill()
            controller.wait(30)

    def finish_trials(self, sweep: str, value=lambda number: 0.9 - 0.01 * number) -> int:
        """The trial pods' rank 0 and the Trainer: every trial job not yet ended reports its value and completes."""
        study = studies.study(sweep, self.url)
        done = 0
        for job in self.trials(sweep):
            if not job.get("status"):
                self.finish_trial(study, job, value)
                done += 1
        return done

    def finish_trial(self, study: optuna.Study, job: dict, value=lambda number: 0.9 - 0.01 * number) -> None:
        trial = optuna.trial.Trial(study, self.trial_id(job))
        trial.report(0.5, 20)
        study.tell(trial, value(trial.number))
        mark(job, "Complete")


def mark(job: dict, condition: str, at: float | None = None, **status) -> None:
    """The Trainer's word on a job: its condition true since `at` (now by default), and any other status fields."""
    job["status"] = {"conditions": [{"type": condition, "status": "True", "reason": condition, "message": "",
                                     "lastTransitionTime": stamp(time.time() if at is None else at)}], **status}


def stamp(at: float) -> str:
    """A Kubernetes time (RFC 3339, whole seconds, UTC)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


@pytest.fixture
def cluster(tmp_path):
    api = seeded()
    api.identities[CONTROLLER_TOKEN] = service_account(VISION, contract.SWEEP_CONTROLLER_SERVICE_ACCOUNT)
    with serve(api) as served:
        yield Cluster(served, tmp_path)


@pytest.fixture(scope="module")
def program():
    from support.evaluated import evaluation_of
    return Program(evaluation_of(STACK))


def test_a_member_starts_the_controller_as_a_job_of_the_team_and_it_is_admitted(cluster, program):
    started = cluster.cli("sweep", str(sweep_file(cluster.tmp, "in-cluster")), "--backend", "kubernetes", "--stack", str(STACK))
    assert started.returncode == 0, started.stdout + started.stderr
    assert f"TrainJob {VISION}/in-cluster-ctl" in started.stdout and "trainforge sweep status in-cluster" in started.stdout
    job = cluster.job("in-cluster-ctl")
    assert job["metadata"]["labels"][contract.KUEUE_QUEUE_LABEL] == contract.queue_name("vision"), "through the team's queue"
    assert "sqlite" not in json.dumps(job) and "postgresql" not in json.dumps(job), "no database URL in the job"
    assert program.denials(job, TRAINJOBS) == []
    (pod,) = program.pods(job)
    spec = pod["spec"]
    assert spec["serviceAccountName"] == contract.SWEEP_CONTROLLER_SERVICE_ACCOUNT
    assert spec["nodeSelector"][contract.LABEL_FLAVOUR] == contract.Flavour.CPU.value, "on the team's CPU nodes"
    assert pod["metadata"]["labels"][contract.SWEEP_ROLE_LABEL] == contract.SWEEP_CONTROLLER_ROLE
    mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts[contract.API_TOKEN_DIR]["readOnly"] and mounts[contract.SWEEP_STORAGE_DIR]["readOnly"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts[contract.API_TOKEN_DIR]["name"]]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"] <= 3607
    assert program.denials(pod, ("", "v1", "pods")) == [] and restricted_violations(spec) == []
    payload = json.loads(next(e["value"] for e in job["spec"]["trainer"]["env"] if e["name"] == contract.HYPERPARAMETERS_ENV))
    assert payload["sweep_spec"]["base"]["name"] == "clf-base" and payload["stack"]["name"] == "Pulumi.dev.yaml"

    again = cluster.cli("sweep", str(sweep_file(cluster.tmp, "in-cluster")), "--backend", "kubernetes", "--stack", str(STACK))
    assert again.returncode == 1 and "already has a controller in the cluster" in again.stderr, again.stderr


def test_the_controller_may_do_with_jobs_what_a_member_may_and_nothing_more(cluster):
    token = CONTROLLER_TOKEN
    allowed = raw_request(cluster.served, token, "GET", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{VISION}/trainjobs")
    assert allowed == 200
    for method, path, body in (
            ("GET", f"/api/v1/namespaces/{VISION}/secrets/{contract.SWEEP_STORAGE_SECRET}", None),
            ("GET", f"/api/v1/namespaces/{VISION}/secrets/{contract.MLFLOW_SECRET}", None),
            ("PATCH", f"/api/v1/namespaces/{VISION}/configmaps/{contract.TEAM_SETTINGS_CONFIG_MAP}", {"data": {"spent_usd": "0"}}),
            ("POST", f"/api/v1/namespaces/{VISION}/configmaps", {"metadata": {"name": "x"}}),
            ("POST", f"/api/v1/namespaces/{VISION}/pods", {"metadata": {"name": "p"}}),
            ("POST", f"/apis/batch/v1/namespaces/{VISION}/jobs", {"metadata": {"name": "j"}}),
            ("GET", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{contract.namespace_name('language')}/trainjobs", None),
            ("PATCH", f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{contract.cluster_queue_name('vision')}", {"spec": {"stopPolicy": "None"}})):
        assert raw_request(cluster.served, token, method, path, body) == 403, (method, path)


@pytest.mark.slow
def test_the_controller_runs_the_sweep_survives_a_node_loss_and_a_member_follows_it_with_a_kubeconfig(cluster):
    """Three trials, one at a time; the controller killed (SIGKILL, as a lost node) after the first and started again
    (as the Job restarts its pod): exactly three trial jobs, each settled once, never two alive; the member's CLI, which
    has no database access, reads status, best and report from the controller's TrainJob."""
    cluster.submit_sweep("followed", max_trials=3, max_parallel=1)
    controller = cluster.start_controller("followed")
    try:
        wait_until(lambda: len(cluster.trials("followed")) == 1, 120)
        cluster.finish_trials("followed")
        wait_until(lambda: any(t.state is TrialState.COMPLETE for t in studies.study("followed", cluster.url).get_trials()), 60)
        controller.send_signal(signal.SIGKILL)
        controller.wait(30)
        controller = cluster.start_controller("followed")  # the Job's restart, on another node
        alive: list[int] = [0]

        def played_until_the_controller_ends() -> bool:  # the test is the Trainer: it finishes each trial it sees
            alive.append(sum(1 for j in cluster.trials("followed") if not j.get("status")))
            cluster.finish_trials("followed")
            return controller.poll() is not None
        wait_until(played_until_the_controller_ends, 180, what="the restarted controller to finish the sweep")
        alive_at_most = max(alive)
        output, _ = controller.communicate(timeout=30)
    finally:
        if controller.poll() is None:
            controller.kill()
    assert controller.returncode == 0 and "all planned trials done" in output, output[-3000:]
    assert len(cluster.trials("followed")) == 3 and alive_at_most <= 1
    study = load_existing("followed", cluster.url)
    assert counted(study) == 3 and all(study.user_attrs.get(f"trial.{t.number}.settled") for t in study.get_trials())
    # Among the trials that ran: a kill inside the study's ask leaves a trial with no parameters yet, and one between
    # ask and launch gives its parameters back to a retry; neither ran.
    ran = [json.dumps(t.params, sort_keys=True) for t in study.get_trials() if t.state is TrialState.COMPLETE]
    assert len(ran) == len(set(ran)) == 3, "no parameters repeated after the restart"

    # A member with a kubeconfig and nothing else (another machine: no record of the sweep, no database URL).
    status = cluster.cli("sweep", "status", "followed", "-o", "json", "--backend", "kubernetes", "--team", "vision", home="laptop")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["finished_because"] == "all planned trials done"
    # The kill may land between asking the study for the second trial and creating its job: that trial is failed and
    # its parameters run again as a retry (never two jobs for one trial). Every row is complete, or such a give-back.
    retried = {t["retry_of"] for t in shown["trials"] if t["retry_of"] is not None}
    complete = [t for t in shown["trials"] if t["state"] == "complete"]
    assert len(complete) == 3 and all(t["state"] == "complete" or (t["state"] == "fail" and t["number"] in retried)
                                      for t in shown["trials"]), shown["trials"]
    assert all(t["cost_usd"] is not None for t in complete)
    best = cluster.cli("sweep", "best", "followed", "-o", "json", "--backend", "kubernetes", "--team", "vision",
                       "--write", str(cluster.tmp / "best.yaml"), home="laptop")
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout)["trial"] == 0 and json.loads(best.stdout)["value"] == pytest.approx(0.9)
    assert yaml.safe_load((cluster.tmp / "best.yaml").read_text())["entry"]["task"] == "classifier"
    report = cluster.cli("sweep", "report", "followed", "--backend", "kubernetes", "--team", "vision", "--out", str(cluster.tmp / "report"),
                         home="laptop")
    assert report.returncode == 0 and (cluster.tmp / "report" / "optimization_history.png").exists(), report.stdout + report.stderr
    table = cluster.cli("sweep", "status", "followed", "--backend", "kubernetes", "--team", "vision", home="laptop")
    assert "controller: " in table.stdout and "3 trials planned" in table.stdout


@pytest.mark.slow
def test_a_member_cancels_extends_and_resumes_a_cluster_sweep(cluster):
    spec = sweep_file(cluster.tmp, "steered", max_trials=2, max_parallel=1)
    assert cluster.cli("sweep", str(spec), "--backend", "kubernetes", "--stack", str(STACK)).returncode == 0
    controller = cluster.start_controller("steered")
    try:
        wait_until(lambda: len(cluster.trials("steered")) == 1, 120)
        cancelled = cluster.cli("sweep", "cancel", "steered")
        assert cancelled.returncode == 0 and "asked its controller to cancel" in cancelled.stdout, cancelled.stderr
        output, _ = controller.communicate(timeout=120)
    finally:
        if controller.poll() is None:
            controller.kill()
    assert controller.returncode == 0 and "cancelled" in output, output[-3000:]
    assert cluster.trials("steered") == [], "the running trial's job was cancelled"
    shown = json.loads(cluster.cli("sweep", "status", "steered", "-o", "json").stdout)
    assert shown["finished_because"] == "cancelled" and shown["trials"][0]["state"] == "cancelled"
    mark(cluster.job("steered-ctl"), "Complete")  # the Trainer: its pod exited 0

    by_accident = cluster.cli("sweep", str(spec), "--backend", "kubernetes", "--stack", str(STACK))
    assert by_accident.returncode == 1 and "sweep resume steered" in by_accident.stderr
    extended = cluster.cli("sweep", "extend", "steered", "--trials", "+1")
    assert extended.returncode == 0 and "resume steered" in extended.stdout, extended.stderr
    resumed = cluster.cli("sweep", "resume", "steered")
    assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stdout + resumed.stderr
    controller = cluster.start_controller("steered")
    try:
        def played_until_the_controller_ends() -> bool:
            cluster.finish_trials("steered")
            return controller.poll() is not None
        wait_until(played_until_the_controller_ends, 180, what="the controller to finish the extended sweep")
        output, _ = controller.communicate(timeout=30)
    finally:
        if controller.poll() is None:
            controller.kill()
    assert controller.returncode == 0 and "all planned trials done" in output, output[-3000:]
    study = load_existing("steered", cluster.url)
    assert counted(study) == 3, "two planned + one extended; the cancelled trial's parameters ran again, uncounted"
    shown = json.loads(cluster.cli("sweep", "status", "steered", "-o", "json").stdout)
    assert [t["state"] for t in shown["trials"]].count("complete") == 3


@pytest.mark.slow  # runs the sweep controller
def test_a_controller_whose_study_refuses_the_sweep_says_so_where_status_looks(cluster):
    first = sweep_file(cluster.tmp, "clash", max_trials=1)
    assert cluster.cli("sweep", str(first), "--backend", "kubernetes", "--stack", str(STACK)).returncode == 0
    study = optuna.create_study(study_name="clash", storage=cluster.url)
    study.set_user_attr("search", json.dumps({"space": "another"}))  # a study of that name searching otherwise
    controller = cluster.start_controller("clash")
    output, _ = controller.communicate(timeout=120)
    assert controller.returncode == 2, output[-2000:]
    status = cluster.cli("sweep", "status", "clash")
    assert status.returncode == 1 and "could not start" in status.stderr and "another name" in status.stderr, status.stderr


def _logged(path: Path, text: str) -> bool:
    return text in path.read_text(errors="replace")


@pytest.mark.slow  # runs the sweep controller
def test_the_controller_rides_out_api_errors(cluster):
    """500s and 429s from the API server: the controller backs off and retries inside its loop (it used to exit 1, a
    user error the job never restarts), takes up where it was (its trial adopted, not launched twice), and finishes the
    sweep, each trial launched and settled once. The database's and MLflow's failures take the same path
    (tests/test_sweep.py: each classified as transient from a real failure)."""
    controller, log = cluster.start_sweep("weathered", max_trials=2, max_parallel=1)
    try:
        wait_until(lambda: len(cluster.trials("weathered")) == 1, 120)
        cluster.served.api.faults[CONTROLLER_TOKEN] = [500, 429, 503]
        wait_until(lambda: _logged(log, "services answer again after 3 failed look(s)"), 90,
                   what="the controller to retry through three API errors")
        assert controller.poll() is None, log.read_text()[-3000:]
        cluster.play_until_it_ends("weathered", controller, "the controller to finish the sweep")
    finally:
        if controller.poll() is None:
            controller.kill()
    output = log.read_text()
    assert controller.returncode == 0 and "all planned trials done" in output, output[-3000:]
    assert len(cluster.trials("weathered")) == 2
    study = load_existing("weathered", cluster.url)
    assert counted(study) == 2 and all(study.user_attrs.get(f"trial.{t.number}.settled") for t in study.get_trials())


@pytest.mark.slow  # runs the sweep controller
def test_a_trial_that_ends_before_its_launch_is_recorded_is_settled_once(cluster):
    """The Trainer runs a trial and the trial tells the study its value before the controller has written down that it
    created the job (a trial that fails at once; a controller slowed between the two): the controller goes on (it used
    to die on optuna's UpdateFinishedTrialError, seen on CI), settles that trial once and launches the next."""
    cluster.submit_sweep("hasty", max_trials=2, max_parallel=1)

    def run_at_once(obj: dict) -> None:  # in the API server, before the controller hears its create answered
        if obj["kind"] == "TrainJob" and obj["metadata"]["name"].startswith("hasty-t"):
            cluster.finish_trial(studies.study("hasty", cluster.url), obj)
    cluster.served.api.on_create = run_at_once
    controller = cluster.start_controller("hasty")
    try:
        output, _ = controller.communicate(timeout=180)
    finally:
        if controller.poll() is None:
            controller.kill()
    assert controller.returncode == 0 and "all planned trials done" in output, output[-3000:]
    assert "told the study before its launch was recorded" in output
    study = load_existing("hasty", cluster.url)
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 2
    assert all(study.user_attrs.get(f"trial.{t.number}.settled") for t in study.get_trials())


@pytest.mark.slow  # runs the sweep controller
def test_an_outage_past_the_controllers_patience_ends_it_with_a_code_the_job_restarts(cluster):
    """The API server down for longer than --give-up-after: the controller exits EXIT_SERVICES_DOWN (>= 128, which the
    job's restart rules retry; 1-127 would fail the job for good), and the restarted controller finishes the sweep."""
    from trainforge import exits

    controller, log = cluster.start_sweep("outlasted", give_up_after=3, max_trials=2, max_parallel=1)
    try:
        wait_until(lambda: len(cluster.trials("outlasted")) == 1, 120)
        cluster.served.api.faults[CONTROLLER_TOKEN] = [503] * 100_000
        wait_until(lambda: controller.poll() is not None, 120, what="the controller to give up")
    finally:
        if controller.poll() is None:
            controller.kill()
    assert controller.returncode == exits.EXIT_SERVICES_DOWN and exits.is_retryable(controller.returncode), log.read_text()[-3000:]
    assert "has not answered for" in log.read_text()
    cluster.served.api.faults.clear()
    restarted = cluster.start_controller("outlasted", log=cluster.tmp / "restarted.log")
    cluster.play_until_it_ends("outlasted", restarted, "the restarted controller to finish the sweep")
    assert restarted.returncode == 0, (cluster.tmp / "restarted.log").read_text()[-3000:]
    assert len(cluster.trials("outlasted")) == 2
    assert counted(load_existing("outlasted", cluster.url)) == 2


def _last_heartbeat_long_ago(url: str, trial_id: int) -> None:
    """The trial's worker last beat ten minutes ago (its pod gone with a reclaimed node, its job suspended by Kueue)."""
    import sqlite3
    with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
        db.execute("DELETE FROM trial_heartbeats WHERE trial_id = ?", (trial_id,))
        db.execute("INSERT INTO trial_heartbeats (trial_id, heartbeat) VALUES (?, datetime('now', '-10 minutes'))", (trial_id,))


@pytest.mark.slow  # runs the sweep controller
def test_a_preempted_trial_waits_and_completes_as_itself_from_its_own_job(cluster):
    """A trial whose job Kueue suspended (its pods gone, its worker's heartbeat silent far past the grace) is waiting,
    not failed: the controller neither cancels its job nor retries it under a new name from step 0 (it used to, and a
    second preemption failed it for good); readmitted, the same job resumes from its own checkpoints and the trial
    completes as itself."""
    controller, log = cluster.start_sweep("preempted", max_trials=1, max_parallel=1)
    try:
        wait_until(lambda: len(cluster.trials("preempted")) == 1, 120)
        (job,) = cluster.trials("preempted")
        trial_id = cluster.trial_id(job)
        optuna.storages.RDBStorage(cluster.url).record_heartbeat(trial_id)  # its worker ran, then its pod went
        mark(job, "Suspended")
        job["spec"]["suspend"] = True
        _last_heartbeat_long_ago(cluster.url, trial_id)
        looks = len(cluster.served.api.requests)
        wait_until(lambda: len(cluster.served.api.requests) > looks + 20, 60, what="the controller to look at it a few times")
        study = load_existing("preempted", cluster.url)
        assert [t.state for t in study.get_trials()] == [TrialState.RUNNING], log.read_text()[-2000:]
        assert cluster.job(job["metadata"]["name"]) is not None and len(cluster.trials("preempted")) == 1, "not cancelled, not relaunched"
        job["spec"]["suspend"] = False  # readmitted: the same job's pods resume from its checkpoints
        job.pop("status")
        wait_until(lambda: cluster.finish_trials("preempted") or controller.poll() is not None, 120,
                   what="the resumed trial to report and the controller to finish")
        controller.wait(60)
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait(30)
    assert controller.returncode == 0, log.read_text()[-3000:]
    study = load_existing("preempted", cluster.url)
    assert [(t.number, t.state) for t in study.get_trials()] == [(0, TrialState.COMPLETE)]
    assert len(cluster.trials("preempted")) == 1


@pytest.mark.slow  # runs the sweep controller
def test_a_trials_cost_and_run_time_count_only_while_its_job_runs(cluster):
    """Kueue admits a trial's job two seconds after it was created, preempts it two seconds later, readmits it two seconds
    after that, and it completes two seconds on: its run time is four seconds by its job's own condition times (it used
    to be its trial's whole life, queue and suspension included, so a busy cluster ended sweeps early on their USD budget
    and the cost objective measured congestion), its cost is its estimate scaled by those four seconds, and its queue
    time (creation to first admission) is kept apart and shown by `status`."""
    controller, log = cluster.start_sweep("metered", max_trials=1, max_parallel=1)
    key = "trial.0.running_since"
    try:
        wait_until(lambda: len(cluster.trials("metered")) == 1, 120)
        (job,) = cluster.trials("metered")
        study = studies.study("metered", cluster.url)
        started = study.trials[0].datetime_start.timestamp()
        admitted, suspended, readmitted, completed = (int(started) + k for k in (2, 4, 6, 8))

        def admit(moment: int) -> None:  # Kueue admits it: its Suspended condition turns False, its pods start
            job["spec"]["suspend"] = False
            job["status"] = {"conditions": [{"type": "Suspended", "status": "False", "reason": "Resumed", "message": "",
                                             "lastTransitionTime": stamp(moment)}], "jobsStatus": [{"name": "node", "active": 1}]}

        def preempt(moment: int) -> None:
            job["spec"]["suspend"] = True
            mark(job, "Suspended", moment)

        def at(moment: int, change, what: str, recorded) -> None:  # at that moment the Trainer changes it; the controller sees it
            wait_until(lambda: time.time() >= moment, 30, interval=0.05)
            change(moment)
            wait_until(lambda: recorded(study.user_attrs), 60, what=f"the controller to see the job {what}")
        at(admitted, admit, "admitted", lambda attrs: attrs.get(key) == admitted)
        at(suspended, preempt, "preempted", lambda attrs: attrs.get("trial.0.ran_s") == 2.0 and attrs.get(key) is None)
        at(readmitted, admit, "readmitted", lambda attrs: attrs.get(key) == readmitted)
        wait_until(lambda: time.time() >= completed, 30, interval=0.05)
        trial = optuna.trial.Trial(study, cluster.trial_id(job))
        study.tell(trial, 0.9)
        mark(job, "Complete", completed)
        controller.wait(120)
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait(30)
    assert controller.returncode == 0, log.read_text()[-3000:]
    attrs = load_existing("metered", cluster.url).user_attrs
    (trial,) = load_existing("metered", cluster.url).get_trials()
    max_runtime_s = load_spec(REPO / "examples" / "sweep-base.yaml").limits.max_runtime_hours * 3600
    assert attrs["trial.0.run_s"] == 4.0
    assert attrs["trial.0.queued_s"] == pytest.approx(admitted - started, abs=1e-3)
    assert attrs["trial.0.cost_usd"] == pytest.approx(trial.user_attrs["estimate_usd"] * 4.0 / max_runtime_s, abs=2e-6)
    assert trial.user_attrs["estimate_usd"] > 0, "a priced trial: a cost of zero would prove nothing"
    shown = cluster.cli("sweep", "status", "metered", "--backend", "kubernetes", "--team", "vision")
    assert shown.returncode == 0, shown.stderr
    header = next(line for line in shown.stdout.splitlines() if "queued s" in line)
    assert "run s" in header


@pytest.mark.slow  # runs the sweep controller
def test_two_members_extending_at_once_are_both_taken_up_exactly_once_across_a_controller_kill(cluster):
    """Member B's `extend` lands between member A's read of the controller's TrainJob and A's write: A's patch names the
    resourceVersion it read, the API server answers 409, and A adds its request to what is there now (it used to
    overwrite B's, losing it). The controller, SIGKILLed right after taking up the first request and started again with
    both still asked, applies each exactly once: 1 planned + 2 + 3 trials."""
    from trainforge.trainer.sweeps.faults import KILL_AT_ENV
    from trainforge.trainer.sweeps.keys import StudyKey
    cluster.submit_sweep("crowded", max_trials=1, max_parallel=1)
    controller_job = contract.sweep_controller_job("crowded")
    others: list[subprocess.CompletedProcess] = []
    armed = [True]

    def member_b_first(method: str, namespace: str, name: str) -> None:  # B's whole extend runs inside A's first write
        if method != "PATCH" or name != controller_job or not armed:
            return
        armed.clear()
        others.append(cluster.cli("sweep", "extend", "crowded", "--trials", "+3", "--backend", "kubernetes", "--team", "vision",
                                      home="member-b"))
    cluster.served.api.on_write = member_b_first
    extended = cluster.cli("sweep", "extend", "crowded", "--trials", "+2")
    cluster.served.api.on_write = None
    assert extended.returncode == 0, extended.stderr
    assert others and others[0].returncode == 0, others[0].stderr if others else "member B never ran"
    conflicts = [r for r in cluster.served.api.requests if r["method"] == "PATCH" and controller_job in r["path"]]
    assert len(conflicts) == 3, "A's first patch, B's, A's again after the 409"
    asked = json.loads(cluster.job(controller_job)["metadata"]["annotations"][contract.SWEEP_EXTEND_ANNOTATION])
    assert sorted(r["trials"] for r in asked) == [2, 3], "both members' requests, each once"

    log = cluster.tmp / "controller.log"
    killed = cluster.start_controller("crowded", log=log, extra_env={KILL_AT_ENV: "extended:1"})
    assert killed.wait(120) == -signal.SIGKILL, log.read_text()[-3000:]
    assert load_existing("crowded", cluster.url).user_attrs[StudyKey.EXTENDED]["max_trials"] in (3, 4), "one request taken up, then killed"
    controller = cluster.start_controller("crowded", log=log)
    cluster.play_until_it_ends("crowded", controller, "the restarted controller to finish the extended sweep")
    assert controller.returncode == 0, log.read_text()[-3000:]
    study = load_existing("crowded", cluster.url)
    assert study.user_attrs[StudyKey.EXTENDED]["max_trials"] == 6 and counted(study) == 6
    assert sorted(study.user_attrs[StudyKey.EXTENDED]["taken"]) == sorted(r["id"] for r in asked)


def test_a_ten_thousand_trial_sweeps_status_fits_the_api_and_best_reads_the_right_trial(cluster, monkeypatch):
    """Issue 40, item 4: the controller's status object at 10,000 trials (the most a spec allows) is accepted by the API
    server (all annotations under 256 KiB) and holds every trial counted by state and the best ones whole: `best
    --write` writes the best trial's own hyperparameters. It used to drop the parameters of all but the newest trials
    to fit, so `best --write` wrote the base job's and `--promote` resumed the best weights under them."""
    import random

    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
    from optuna.trial import create_trial

    from trainforge.trainer.controllers.sweep import StatusObject
    from trainforge.trainer.kube import Cluster as KubeCluster
    from trainforge.trainer.sweeps.cluster import payload_of, sweep_of
    cluster.submit_sweep("vast", max_trials=10_000, max_parallel=4)
    controller_job = contract.sweep_controller_job("vast")
    sweep = sweep_of(payload_of(cluster.job(controller_job)))
    space = {"lr": FloatDistribution(1e-4, 0.3, log=True), "warmup_steps": IntDistribution(0, 40, step=10),
             "task_args.width": CategoricalDistribution([32, 64, 128])}
    study = optuna.create_study(study_name="vast", direction="maximize")  # the controller's study after 10,000 trials
    rng = random.Random(0)
    states = [TrialState.COMPLETE] * 6 + [TrialState.PRUNED] * 3 + [TrialState.FAIL]
    trials = []
    for number in range(10_000):
        state = TrialState.RUNNING if number >= 9_996 else TrialState.COMPLETE if number == 4_321 else rng.choice(states)
        params = {"lr": 10 ** rng.uniform(-4, -0.6), "warmup_steps": rng.choice([0, 10, 20, 30, 40]), "task_args.width": rng.choice([32, 64, 128])}
        value = 0.999 if number == 4_321 else rng.uniform(0.5, 0.98)
        trials.append(create_trial(state=state, value=value if state is TrialState.COMPLETE else None, params=params, distributions=space,
                                   intermediate_values={step: value - 0.1 * (1 - step / 120) for step in range(20, 121, 20)},
                                   user_attrs={"job": f"vast-t{number:05d}"}))
    study.add_trials(trials)
    monkeypatch.setenv("KUBECONFIG", str(cluster.controller))
    StatusObject(KubeCluster(), "vision", controller_job).publish(
        type("Looked", (), {"study": study, "sweep": sweep, "running": {n: None for n in range(9_996, 10_000)},
                            "spent_usd": lambda self: 1234.5})(), force=True)  # the API server took it: under its limit

    shown = cluster.cli("sweep", "status", "vast", "--backend", "kubernetes", "--team", "vision", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["trials_total"] == 10_000 and sum(status["counts"].values()) == 10_000
    assert status["counts"]["running"] == 4 and all(t["params"] for t in status["trials"]), "every trial shown, whole"
    best = cluster.cli("sweep", "best", "vast", "--backend", "kubernetes", "--team", "vision", "-o", "json",
                       "--write", str(cluster.tmp / "best.yaml"))
    assert best.returncode == 0, best.stderr
    found = json.loads(best.stdout)
    assert found["trial"] == 4_321 and found["params"] == study.trials[4_321].params
    written = yaml.safe_load((cluster.tmp / "best.yaml").read_text())
    assert written["hyperparameters"]["lr"] == study.trials[4_321].params["lr"]
    assert written["entry"]["args"]["width"] == study.trials[4_321].params["task_args.width"]
    table = cluster.cli("sweep", "status", "vast", "--backend", "kubernetes", "--team", "vision")
    assert "of 10000 trials" in table.stdout and "the best 20" in table.stdout, table.stdout[-2000:]
