"""Metrics and tracking against the real things: a Prometheus server scraping a running job, an MLflow server."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import pytest
from support.lanes import TRAINING

pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")

from support.servers import Outage, free_port, prometheus  # noqa: E402
from support.training import result, run, start, wait_for_step  # noqa: E402
from support.waiting import wait_until  # noqa: E402

from trainforge import run_tags  # noqa: E402

pytestmark = [pytest.mark.slow, TRAINING]


def two_free_ports() -> int:
    """A base port whose successor is free too (rank r serves base + r)."""
    import socket
    for _ in range(50):
        base = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", base + 1))
                return base
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


def query(prometheus_url: str, promql: str) -> list[dict]:
    url = f"{prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)["data"]["result"]


def test_prometheus_scrapes_every_rank_of_a_running_job(tmp_path):
    base = two_free_ports()
    with prometheus(tmp_path, [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]) as prom:
        job = start(tmp_path, "job_id=scrape-me", "team=vision", f"metrics.port={base}", "metrics.addr=127.0.0.1",
                    "max_steps=2000", "step_sleep_s=0.02", "eval_every=100")
        try:
            wait_for_step(tmp_path, 20)
            def both_ranks() -> list[dict]:
                found = query(prom, 'trainforge_step{job="scrape-me", team="vision"} > 0')
                return found if {r["metric"]["rank"] for r in found} == {"0", "1"} else []
            found = wait_until(both_ranks, 60, interval=0.5, what="both ranks' trainforge_step in Prometheus")
            assert {r["metric"]["rank"] for r in found} == {"0", "1"}, found
            samples_per_s = query(prom, 'trainforge_samples_per_second{job="scrape-me", rank="0"}')
            assert float(samples_per_s[0]["value"][1]) > 0
            assert query(prom, 'trainforge_step_seconds_count{job="scrape-me"}')
            assert query(prom, 'trainforge_last_checkpoint_age_seconds{job="scrape-me"}')
        finally:
            job.terminate()
            job.wait(60)


def runs_of(uri: str, job_id: str, team: str = "default"):
    """The job's runs, in its team's experiment (`<team>/trainforge`)."""
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(run_tags.team_experiment(team, "trainforge"))
    return client, client.search_runs([experiment.experiment_id], filter_string=f"tags.`trainforge.job_id` = '{job_id}'")


def test_one_mlflow_run_per_job_with_lineage_across_ranks_and_restarts(tmp_path, mlflow_tracking):
    mlflow_uri = mlflow_tracking
    run(tmp_path, "job_id=lineage-1", "team=vision", f"tracking.uri={mlflow_uri}", "max_steps=30", "log_every=5")
    run(tmp_path, "job_id=lineage-1", "team=vision", f"tracking.uri={mlflow_uri}", "max_steps=40", "log_every=5")  # resumes
    assert result(tmp_path)["resumed_from"] == 30
    client, runs = runs_of(mlflow_uri, "lineage-1", "vision")
    assert len(runs) == 1, "one run per job, not per rank or per restart"
    tags = runs[0].data.tags
    assert tags["trainforge.world_size"] == "2" and tags["trainforge.team"] == "vision"
    assert len(tags["trainforge.git_commit"]) >= 7 and len(tags["trainforge.data_checksum"]) == 16
    assert tags["trainforge.checkpoint.step"] == "40" and tags["trainforge.checkpoint.latest"].endswith("step-00000040")
    assert runs[0].data.params["max_steps"] == "30"  # params of the run as first launched
    assert runs[0].info.status == "FINISHED"
    history = client.get_metric_history(runs[0].info.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(5, 45, 5))
    assert client.get_metric_history(runs[0].info.run_id, "eval_accuracy")


def test_a_tracking_server_that_is_down_buffers_and_catches_up(tmp_path, mlflow_tracking):
    """The job starts while its tracking endpoint refuses connections, trains on, and once the endpoint answers (a real
    MLflow server behind it) every metric logged during the outage arrives, in one run."""
    outage = Outage(mlflow_tracking)
    try:
        job = start(tmp_path, "job_id=outage-1", f"tracking.uri={outage.url}", "max_steps=120", "step_sleep_s=0.05",
                    "log_every=10", "eval_every=100", nproc=None)
        wait_for_step(tmp_path, 30)
        outage.restore()
        output, _ = job.communicate(timeout=300)
    finally:
        outage.close()
    assert job.returncode == 0, output[-3000:]
    assert "unreachable" in output and "buffering" in output
    client, runs = runs_of(mlflow_tracking, "outage-1")
    assert len(runs) == 1
    steps = sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "loss"))
    assert steps == list(range(10, 130, 10)), "metrics logged during the outage were lost"
