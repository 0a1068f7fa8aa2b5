"""A team cannot forge another team's metrics or flood Prometheus: the program's own trainer PodMonitor, run by a real
Prometheus (Debian's) against exporters on loopback that send what a hostile pod would."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import pytest
from support.helm import rendered_program
from support.servers import free_port, prometheus, scrape_config, trainer_scrape
from support.waiting import wait_until

from trainforge.platform.manifests import monitoring

prometheus_client = pytest.importorskip("prometheus_client", reason="prometheus-client (runtime extra) is not installed")

pytestmark = pytest.mark.slow  # a real server per test


def query(url: str, promql: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}), timeout=5) as response:
        return json.load(response)["data"]["result"]


def until(url: str, promql: str, timeout: float = 60) -> list[dict]:
    """The query's result once it has one (Prometheus scrapes every second here; the first takes a few)."""
    return wait_until(lambda: query(url, promql), timeout, interval=0.5, what=f"a result for {promql}")


def exporter(series: list[dict[str, str]], name: str = "trainforge_step") -> tuple[str, object]:
    """A metrics endpoint on loopback serving one gauge with the given label sets; returns host:port and the server."""
    registry = prometheus_client.CollectorRegistry()
    names = sorted({k for labels in series for k in labels})
    gauge = prometheus_client.Gauge(name, "what the pod claims", names, registry=registry)
    for labels in series:
        gauge.labels(**{k: labels.get(k, "") for k in names}).set(5)
    port = free_port()
    server, _ = prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)
    return f"127.0.0.1:{port}", server


def test_a_pod_cannot_claim_another_teams_labels(tmp_path):
    forged = {"job": "their-job", "team": "language", "namespace": "team-language", "pod": "their-pod", "rank": "0"}
    target, server = exporter([forged])
    try:
        with prometheus(tmp_path, [target], job=trainer_scrape([target], namespace="team-vision")) as url:
            (series,) = until(url, "trainforge_step")
    finally:
        server.shutdown()
    labels = series["metric"]
    assert labels["team"] == "vision" and labels["namespace"] == "team-vision" and labels["pod"] == "trainer-0"
    assert labels["job"] == "their-job", "the training job's own name is kept (the scrape job's would shadow it)"
    assert not [k for k in labels if k.startswith("exported_")], labels


def test_a_pod_exposing_too_many_series_fails_its_scrape_and_stores_none(tmp_path):
    limit = monitoring.TRAINER_SCRAPE_LIMITS["sampleLimit"]
    target, server = exporter([{"job": "flood", "rank": str(i)} for i in range(limit + 1)])
    try:
        with prometheus(tmp_path, [target], job=trainer_scrape([target])) as url:
            (up,) = until(url, 'up{job="monitoring/trainforge-trainers"}')
            assert up["value"][1] == "0", "the scrape over the sample limit is failed (and the target shows down)"
            assert query(url, "count(trainforge_step)") == []
    finally:
        server.shutdown()


def test_a_series_with_too_many_labels_fails_the_scrape(tmp_path):
    limit = monitoring.TRAINER_SCRAPE_LIMITS["labelLimit"]
    target, server = exporter([{f"l{i}": "x" for i in range(limit + 1)}])
    try:
        with prometheus(tmp_path, [target], job=trainer_scrape([target])) as url:
            (up,) = until(url, 'up{job="monitoring/trainforge-trainers"}')
            assert up["value"][1] == "0"
    finally:
        server.shutdown()


def test_a_healthy_trainer_is_well_within_the_limits():
    """The runtime's registry (every metric, a 2-rank job's labels) against the limits the monitor sets."""
    pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")
    from trainforge.trainer.runtime import metrics

    registry = prometheus_client.CollectorRegistry()
    metrics.RuntimeMetrics(registry=registry, job="a-long-training-job-name", team="vision", rank=1)
    samples = [s for family in registry.collect() for s in family.samples]
    limits = monitoring.TRAINER_SCRAPE_LIMITS
    assert 0 < len(samples) <= limits["sampleLimit"] // 4, len(samples)
    assert max(len(s.labels) for s in samples) + 4 <= limits["labelLimit"]  # + namespace, pod, job, instance


def test_gpu_series_name_the_pod_and_team_using_the_gpu_whatever_the_pod_says(tmp_path, evaluations):
    """dcgm-exporter as the chart renders it from the program's values (issue 37, item 7): its ServiceMonitor run by a
    real Prometheus against an exporter that sends what dcgm-exporter sends for a GPU of team vision's pod, plus labels a
    pod could try to slip in. Scraped labels never win; team comes from the namespace the kubelet reports."""
    from support.repo import STACK_FILES

    from trainforge import contract
    charts, _ = rendered_program(evaluations(next(p for p in STACK_FILES if p.name == "Pulumi.prod.yaml")))
    (monitor,) = [o for o in charts["dcgm-exporter"] if o["kind"] == "ServiceMonitor"]
    (daemonset,) = [o for o in charts["dcgm-exporter"] if o["kind"] == "DaemonSet"]
    (prom,) = [o for o in charts["kube-prometheus-stack"] if o["kind"] == "Prometheus"]
    env = {v["name"]: v.get("value") for v in daemonset["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS"] == "true"
    assert env["DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX"] == "^trainforge\\.io/job$,^batch\\.kubernetes\\.io/job\\-completion\\-index$"
    assert {k: prom["spec"][k] for k in monitoring.PROMETHEUS_SCRAPE_LIMITS} == monitoring.PROMETHEUS_SCRAPE_LIMITS
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is False
    sent = {"gpu": "0", "UUID": "GPU-1", "namespace": "team-vision", "pod": "trainer-0", "container": "trainer",
            "team": "language", "job": "their-job", "trainforge_io_job": "clf"}
    target, server = exporter([sent], name="DCGM_FI_DEV_GPU_UTIL")
    exporter_labels = {"namespace": contract.NAMESPACE_MONITORING, "pod": "dcgm-exporter-7x2k", "container": "exporter",
                       "job": "dcgm-exporter"}
    try:
        with prometheus(tmp_path, [target], job=scrape_config(monitor, [target], exporter_labels)) as url:
            (series,) = until(url, "DCGM_FI_DEV_GPU_UTIL")
    finally:
        server.shutdown()
    labels = series["metric"]
    assert (labels["namespace"], labels["pod"], labels["container"], labels["team"]) == ("team-vision", "trainer-0", "trainer", "vision")
    assert labels["trainforge_io_job"] == "clf" and labels["gpu"] == "0"
    assert not [k for k in labels if k.startswith("exported_")], labels
