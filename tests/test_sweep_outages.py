"""What the sweep controller retries (trainer/sweeps/outages.py), each classified from a real failure of the real
thing: a study database held locked, a database server that is not there, an MLflow server that is not there, the
API server's 5xx and 429 (tests/test_sweep_cluster.py runs the controller through those), and what it must not retry:
a refusal or a bug."""

from __future__ import annotations

import socket
import sqlite3

import optuna
import pytest

from trainforge import exits
from trainforge.trainer.kube import ClusterError, explain
from trainforge.trainer.sweeps.outages import Outage, ServicesDown, is_transient


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def _raised(call) -> BaseException:
    with pytest.raises(Exception) as caught:
        call()
    return caught.value


def test_a_study_database_held_locked_is_an_outage(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 0.05}})
    study = optuna.create_study(study_name="s", storage=storage)
    locker = sqlite3.connect(tmp_path / "study.db", timeout=0)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        failure = _raised(lambda: study.set_user_attr("k", 1))
    finally:
        locker.rollback()
        locker.close()
    assert is_transient(failure), repr(failure)
    study.set_user_attr("k", 1)  # and over once the lock is gone


def test_a_database_server_that_does_not_answer_is_an_outage():
    url = f"postgresql+psycopg2://u:p@127.0.0.1:{_closed_port()}/db"
    failure = _raised(lambda: optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"connect_timeout": 2}}))
    assert is_transient(failure), repr(failure)


def test_an_mlflow_server_that_does_not_answer_is_an_outage(monkeypatch):
    from mlflow import MlflowClient
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    failure = _raised(lambda: MlflowClient(f"http://127.0.0.1:{_closed_port()}").get_experiment_by_name("team/x"))
    assert is_transient(failure), repr(failure)


@pytest.mark.parametrize("status", [500, 502, 503, 429, 409])
def test_the_api_servers_blips_are_outages(status):
    assert is_transient(explain("reading TrainJob team-vision/x", status, None, "team-vision", "https://k"))


def test_unreachable_api_server_is_an_outage():
    assert is_transient(ClusterError("reading TrainJob: the Kubernetes API cannot be reached (NewConnectionError)"))


@pytest.mark.parametrize("failure", [explain("patch", 403, None, "team-vision", "https://k"), explain("get", 404, None, None, "https://k"),
                                     explain("get", 401, None, None, "https://k"), ValueError("a bug"), KeyError("trial.3.settled")])
def test_a_refusal_or_a_bug_is_not_retried(failure):
    assert not is_transient(failure)


def test_an_outage_backs_off_and_past_its_patience_says_so_with_a_code_the_job_restarts(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("trainforge.trainer.sweeps.outages.time.monotonic", lambda: clock[0])
    outage = Outage(give_up_after_s=60)
    waits = []
    for _ in range(4):
        waits.append(outage.failed(ConnectionError("refused"), poll_s=1.0))
        clock[0] += waits[-1]
    assert waits == sorted(waits) and waits[-1] <= 60 and outage.ongoing
    outage.over()
    assert not outage.ongoing and outage.failures == 0
    outage.failed(ConnectionError("refused"), poll_s=1.0)
    clock[0] += 61
    with pytest.raises(ServicesDown) as ended:
        outage.failed(ConnectionError("still refused"), poll_s=1.0)
    assert ended.value.exit_code == exits.EXIT_SERVICES_DOWN and exits.is_retryable(ended.value.exit_code)
    assert "has not answered for 61 s" in str(ended.value) and "still refused" in str(ended.value)


@pytest.fixture
def study_database(tmp_path):
    """A real PostgreSQL (the platform's kind of study database), reached directly and through a loopback hop that a test
    can cut (the database's failover: every connection dropped, new ones refused) and restore."""
    pytest.importorskip("psycopg2", reason="the sweep extra's PostgreSQL driver is not installed")
    from support.servers import Outage as Hop
    from support.servers import postgres_binaries, postgres_server
    if postgres_binaries() is None:
        pytest.skip("no PostgreSQL server programs (Debian's postgresql package)")
    with postgres_server(tmp_path) as (port, user, password):
        hop = Hop(f"127.0.0.1:{port}")
        hop.restore()
        url = f"postgresql+psycopg2://{user}:{password}@127.0.0.1:{{}}/postgres"
        study = optuna.create_study(study_name="sweep-a", storage=url.format(port), direction="minimize")
        study.set_user_attr("pruner", {"type": "median"})
        try:
            yield study, hop, url.format(hop.port)
        finally:
            hop.close()


def trial_config(study, url: str):
    from trainforge.trainer.runtime.config import SweepTrialConfig
    trial = study.ask()
    return SweepTrialConfig(storage=url, study=study.study_name, trial_id=trial._trial_id, metric="loss", heartbeat_s=60)


@pytest.mark.slow
def test_a_trial_rides_out_its_study_databases_failover_and_still_tells_its_outcome(study_database, caplog):
    """The trial's side: an evaluation while the database is out is not reported (training goes on, unpruned this
    once); the outcome waits for the database to come back. Both used to raise: exit 1, the trial failed for good and
    was run again from scratch by the controller."""
    import threading

    from support.waiting import wait_until

    from trainforge.trainer.runtime.pruning import TrialReporter
    caplog.set_level("WARNING")
    study, hop, url = study_database
    reporter = TrialReporter(trial_config(study, url), patience_s=120)
    assert reporter.on_eval(10, {"loss": 1.0}) is None
    hop.cut()
    assert reporter.on_eval(20, {"loss": 0.9}) is None
    assert "database is out at step 20" in caplog.text

    def restore_once_it_waits():
        wait_until(lambda: "could not tell the study" in caplog.text, 60, interval=0.05, what="the trial to wait for its database")
        hop.restore()
    restorer = threading.Thread(target=restore_once_it_waits)
    restorer.start()
    assert reporter.finish(0, None, {"loss": 0.8}) == "complete"
    restorer.join()
    told = study.trials[0]
    assert told.state is optuna.trial.TrialState.COMPLETE and told.value == 0.8
    assert told.intermediate_values[10] == 1.0


@pytest.mark.slow
def test_a_trial_whose_database_stays_out_past_its_patience_exits_for_its_job_to_restart_it(study_database):
    from trainforge.trainer.runtime.__main__ import exit_code_for
    from trainforge.trainer.runtime.pruning import TrialReporter
    study, hop, url = study_database
    reporter = TrialReporter(trial_config(study, url), patience_s=2)
    hop.cut()
    with pytest.raises(ServicesDown) as gave_up:
        reporter.finish(0, None, {"loss": 0.8})
    assert exit_code_for(gave_up.value) == exits.EXIT_SERVICES_DOWN and exits.is_retryable(exits.EXIT_SERVICES_DOWN)
    assert study.trials[0].state is optuna.trial.TrialState.RUNNING, "nothing told: the restarted trial tells it"
