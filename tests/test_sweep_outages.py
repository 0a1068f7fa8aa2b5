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
