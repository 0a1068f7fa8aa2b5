"""`trainforge platform verify` against the test Kubernetes API (tests/support/kubeapi.py) holding a deployed stack: the
releases the program registers (as Helm records them), the Deployments and DaemonSets their charts really render, the
program's own controller and team ClusterQueues, and Prometheus and MLflow behind the API server's service proxy —
Prometheus' scrape pools named after the monitors the program and the charts really create."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from support.repo import REPO, STACKS, TEAM_STACK_FILES
from support.helm import program_releases, rendered_program
from support.kubeapi import KubeApi, serve

from trainforge import contract
from trainforge.platform.plan.first_up import FirstUp
from trainforge.platform.plan.verify import PLATFORM_NAMESPACES

ADMIN = "platform-admin-token"


def healthy_cluster(evaluation, *team_stacks) -> KubeApi:
    """The platform stack deployed and healthy, with the objects of its team stacks (`team_stacks`: their evaluations)."""
    api = KubeApi(tokens={ADMIN: None})
    objects, _ = rendered_program(evaluation)
    everything = [o for r in FirstUp(evaluation, objects, {}).kubernetes_resources for o in FirstUp(evaluation, objects, {}).creates(r)]
    for team_stack in team_stacks:
        everything += [o for r in FirstUp(team_stack, {}, {}).kubernetes_resources for o in FirstUp(team_stack, {}, {}).creates(r)]
    for name, release in program_releases(evaluation).items():
        api.namespaces.add(release["namespace"])
        api.put({"apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": f"sh.helm.release.v1.{name}.v1", "namespace": release["namespace"],
            "labels": {"owner": "helm", "name": name, "status": "deployed", "version": "1"}}})
    for obj in everything:
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] == "Namespace":
            api.namespaces.add(obj["metadata"]["name"])
        elif obj["kind"] in ("Deployment", "DaemonSet") and namespace in PLATFORM_NAMESPACES:
            replicas = obj["spec"].get("replicas", 1)
            obj = {**obj, "status": {"replicas": replicas, "readyReplicas": replicas} if obj["kind"] == "Deployment"
                   else {"desiredNumberScheduled": 2, "numberReady": 2}}
            api.put(obj)
        elif obj["kind"] == "ClusterQueue":
            api.put({**obj, "status": {"conditions": [{"type": "Active", "status": "True", "reason": "Ready"}]}})
    pools = [f"{o['kind'][0].lower()}{o['kind'][1:]}/{o['metadata']['namespace']}/{o['metadata']['name']}/0"
             for o in everything if o["kind"] in ("ServiceMonitor", "PodMonitor")]
    api.prometheus = {"targets": [{"scrapePool": p, "health": "up", "labels": {"instance": "10.0.1.7:8443"}, "lastError": ""}
                                  for p in pools if "dcgm" not in p and "trainers" not in p],  # no GPU node, no job yet
                      "alerts": [{"labels": {"alertname": "Watchdog"}, "state": "firing"}],
                      "last_pass": time.time() - 60}

    def prometheus(path, query):
        if path == "/api/v1/targets":
            return 200, {"status": "success", "data": {"activeTargets": api.prometheus["targets"]}}
        if path == "/api/v1/alerts":
            return 200, {"status": "success", "data": {"alerts": api.prometheus["alerts"]}}
        if path == "/api/v1/query" and "trainforge_budget_last_pass" in query["query"]:
            last = api.prometheus["last_pass"]
            return 200, {"status": "success", "data": {"resultType": "vector", "result": [] if last is None else [{"metric": {}, "value": [time.time(), str(last)]}]}}
        return 404, "not found"

    api.mlflow = (200, {"experiments": [{"experiment_id": "0", "name": "Default"}]})
    api.proxies[(contract.NAMESPACE_MONITORING, "kube-prometheus-stack-prometheus:9090")] = prometheus
    api.proxies[(contract.NAMESPACE_MLFLOW, f"mlflow:{contract.MLFLOW_PORT}")] = lambda path, query: api.mlflow
    return api


@pytest.fixture
def cluster(evaluations, tmp_path):
    from trainforge.platform.components.offline import evaluate_stack_file

    platform = evaluations(STACKS / "Pulumi.dev.yaml")
    team_stacks = [evaluate_stack_file(path) for path in TEAM_STACK_FILES if path.name.startswith("Pulumi.dev.")]
    api = healthy_cluster(platform, *team_stacks)
    with serve(api) as served:
        yield api, served.kubeconfig(tmp_path / "kubeconfig", ADMIN)


def verify(kubeconfig, *extra) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", "platform", "verify", "--stack", "dev", *extra],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120)


def test_a_healthy_platform_passes_every_check(cluster):
    api, kubeconfig = cluster
    result = verify(kubeconfig, "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    checks = {f["check"] for f in report["findings"]}
    assert {"release kueue", "release kube-prometheus-stack", "queue team-vision", "queue team-language", "alerts", "mlflow",
            "budget controller", "scrape Kueue's quota metrics", "scrape the budget controller"} <= checks
    assert any(c.startswith("deployment monitoring/") for c in checks) and any(c.startswith("daemonset ") for c in checks)
    table = verify(kubeconfig)
    assert table.returncode == 0 and "checks passed" in table.stdout


def break_deployment(api):
    (mlflow,) = [o for o in api.of_kind("deployments", contract.NAMESPACE_MLFLOW)]
    mlflow["status"]["readyReplicas"] = 0


def break_release(api):
    secret = api.find("", "v1", "secrets", contract.NAMESPACE_KUEUE, "sh.helm.release.v1.kueue.v1")
    secret["metadata"]["labels"]["status"] = "failed"


def break_queue(api):
    queue = api.find("kueue.x-k8s.io", "v1beta2", "clusterqueues", None, contract.cluster_queue_name("vision"))
    queue["status"]["conditions"] = [{"type": "Active", "status": "False", "reason": "FlavorNotFound", "message": "flavor gpu-spot not found"}]


def break_scrape(api):
    kueue = next(t for t in api.prometheus["targets"] if "kueue" in t["scrapePool"])
    kueue.update(health="down", lastError="server returned HTTP status 403 Forbidden")


def fire_alert(api):
    api.prometheus["alerts"].append({"labels": {"alertname": "KubeControllerManagerDown"}, "state": "firing"})


def stale_budget(api):
    api.prometheus["last_pass"] = time.time() - 3600


def refuse_host(api):
    api.mlflow = (403, "Invalid Host header - possible DNS rebinding attack detected")


@pytest.mark.parametrize("breakage, check, words", [
    (break_deployment, "deployment mlflow/mlflow", "0/1 ready"),
    (break_release, "release kueue", "failed"),
    (break_queue, "queue team-vision", "FlavorNotFound"),
    (break_scrape, "scrape Kueue's quota metrics", "403"),
    (fire_alert, "alerts", "KubeControllerManagerDown"),
    (stale_budget, "budget controller", "last pass"),
    (refuse_host, "mlflow", "403"),
])
def test_each_broken_piece_is_named_with_its_fix_and_exit_1(cluster, breakage, check, words):
    api, kubeconfig = cluster
    breakage(api)
    result = verify(kubeconfig, "-o", "json")
    assert result.returncode == 1, result.stdout + result.stderr
    failed = [f for f in json.loads(result.stdout)["findings"] if not f["ok"]]
    assert [f["check"] for f in failed] == [check]
    assert words in failed[0]["detail"] and failed[0]["fix"]


def test_no_usable_kubeconfig_exits_2_with_the_command_to_get_one(tmp_path):
    result = verify(tmp_path / "absent")
    assert result.returncode == 2 and "aws eks update-kubeconfig --name trainforge-dev" in result.stderr
    assert "Traceback" not in result.stderr
