"""`trainforge platform verify` against the test Kubernetes API (tests/support/kubeapi.py) holding a deployed stack: the
releases the program registers (as Helm records them), the Deployments and DaemonSets their charts really render, the
program's own controller and team ClusterQueues, and Prometheus behind the API server's service proxy — Prometheus'
scrape pools named after the monitors the program and the charts really create. MLflow is checked as verify checks it
on a cluster, by a Job: the stand-in's Job runner really runs the Job's command, with the env its Secrets resolve to,
against a real MLflow on loopback that has the program's admin, auth app and Host allowlist."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time

import pytest
from support.repo import STACKS, TEAM_STACK_FILES
from support.helm import program_releases, rendered_program
from support.kubeapi import KubeApi, serve
from support.cli import run_cli, run_command

from trainforge import contract
from trainforge.platform.plan.first_up import FirstUp
from trainforge.platform.plan.verify import PLATFORM_NAMESPACES

ADMIN = "platform-admin-token"
# One worker holds the module: its MLflow server (about 20 s to start) is started once, not once per worker.
pytestmark = pytest.mark.xdist_group("platform-verify")


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
        if obj["kind"] == "Secret" and namespace == contract.NAMESPACE_MLFLOW:  # stored as the API server stores stringData
            data = {k: base64.b64encode(str(v).encode()).decode() for k, v in (obj.get("stringData") or {}).items()}
            api.put({**{k: v for k, v in obj.items() if k != "stringData"}, "data": {**(obj.get("data") or {}), **data}})
        elif obj["kind"] == "Namespace":
            api.namespaces.add(obj["metadata"]["name"])
        elif obj["kind"] in ("Deployment", "DaemonSet") and namespace in PLATFORM_NAMESPACES:
            replicas = obj["spec"].get("replicas", 1)
            obj = {**obj, "status": {"replicas": replicas, "readyReplicas": replicas} if obj["kind"] == "Deployment"
                   else {"desiredNumberScheduled": 2, "numberReady": 2}}
            api.put(obj)
        elif obj["kind"] == "ClusterQueue":
            api.put({**obj, "status": {"conditions": [{"type": "Active", "status": "True", "reason": "Ready"}]}})
    for index in range(3):  # nodes whose runtime (containerd 2) reports what it can do
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"ip-10-0-{index}-7.ec2.internal"},
                 "status": {"features": {"supplementalGroupsPolicy": True}}})
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

    api.proxies[(contract.NAMESPACE_MONITORING, "kube-prometheus-stack-prometheus:9090")] = prometheus
    return api


@pytest.fixture(scope="session")
def admin_mlflow(evaluations, tmp_path_factory):
    """A real MLflow as the dev stack's chart runs it: the auth app, its Host allowlist, the program's admin. Once per
    session: xdist may run other modules' tests on this worker between this module's."""
    from support.evaluated import kubernetes_objects, manifest
    from support.servers import chart_auth_ini, mlflow_server
    from trainforge.platform.manifests import tracking
    evaluation = evaluations(STACKS / "Pulumi.dev.yaml")
    charts, _ = rendered_program(evaluation)
    (hosts,) = [o["data"]["MLFLOW_SERVER_ALLOWED_HOSTS"] for o in charts["mlflow"] if "MLFLOW_SERVER_ALLOWED_HOSTS" in (o.get("data") or {})]
    (secret,) = [manifest(r) for r in kubernetes_objects(evaluation) if r.inputs.get("metadata", {}).get("name") == tracking.ADMIN_SECRET]
    tmp = tmp_path_factory.mktemp("verify-mlflow")
    _, ini = chart_auth_ini(charts["mlflow"], (secret["stringData"]["username"], secret["stringData"]["password"]), tmp)
    env = {"MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-only-key",
           "MLFLOW_SERVER_ALLOWED_HOSTS": hosts}
    with mlflow_server(tmp, env=env, app_name=contract.MLFLOW_AUTH_APP) as uri:
        yield uri


@pytest.fixture(scope="session")
def dev_team_stacks(evaluations):
    """The dev platform's team stacks, each on the run's evaluation of the dev platform (what `pulumi up` of a team
    stack reads through its StackReference), not on an evaluation of its own."""
    from trainforge.platform.components.offline import evaluate_stack_file
    platform = evaluations(STACKS / "Pulumi.dev.yaml")
    return [evaluate_stack_file(path, platform=platform) for path in TEAM_STACK_FILES if path.name.startswith("Pulumi.dev.")]


@pytest.fixture
def cluster(evaluations, admin_mlflow, dev_team_stacks, tmp_path):
    from support.kubeapi import container_env, running_jobs

    platform = evaluations(STACKS / "Pulumi.dev.yaml")
    api = healthy_cluster(platform, *dev_team_stacks)
    api.mlflow_uri = admin_mlflow  # where the in-cluster name leads (a breakage may point it elsewhere)

    def execute(job: dict) -> tuple[int, str]:
        (container,) = job["spec"]["template"]["spec"]["containers"]
        env = {**container_env(api, contract.NAMESPACE_MLFLOW, container), "MLFLOW_TRACKING_URI": api.mlflow_uri,
               **getattr(api, "extra_env", {})}
        done = run_command(container["command"], env={**os.environ, **env}, timeout=120)
        return done.returncode, done.stdout + done.stderr

    with serve(api) as served, running_jobs(api, contract.NAMESPACE_MLFLOW, execute):
        yield api, served.kubeconfig(tmp_path / "kubeconfig", ADMIN)


def verify(kubeconfig, *extra) -> subprocess.CompletedProcess:
    return run_cli("platform", "verify", "--stack", "dev", *extra, env={"KUBECONFIG": str(kubeconfig), "COLUMNS": "250"}, timeout=120)


@pytest.mark.slow  # the cluster fixture's MLflow server
def test_a_healthy_platform_passes_every_check(cluster):
    api, kubeconfig = cluster
    result = verify(kubeconfig, "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    checks = {f["check"] for f in report["findings"]}
    assert {"release kueue", "release kube-prometheus-stack", "queue team-vision", "queue team-language", "alerts", "mlflow",
            "budget controller", "scrape Kueue's quota metrics", "scrape the budget controller"} <= checks
    assert any(c.startswith("deployment monitoring/") for c in checks) and any(c.startswith("daemonset ") for c in checks)
    (mlflow,) = [f for f in report["findings"] if f["check"] == "mlflow"]
    assert "answers the admin" in mlflow["detail"], mlflow
    created = [r["body"] for r in api.requests if r["method"] == "POST" and r["path"].endswith("/jobs")]
    assert created and created[0]["spec"]["template"]["spec"]["containers"][0]["image"] == next(
        c["image"] for c in api.find("apps", "v1", "deployments", contract.NAMESPACE_MLFLOW, "mlflow")["spec"]["template"]["spec"]["containers"]
        if c["name"] == "mlflow"), "the check runs on the image MLflow runs"
    assert not api.of_kind("jobs", contract.NAMESPACE_MLFLOW), "the check Job is deleted"
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


def wrong_admin(api):
    secret = api.find("", "v1", "secrets", contract.NAMESPACE_MLFLOW, "mlflow-admin")
    secret["data"]["password"] = base64.b64encode(b"not-the-admins-password").decode()


def old_runtime(api):
    (node, *_) = api.of_kind("nodes")
    node["status"]["features"] = {}  # containerd 1.7 reports nothing


def mlflow_down(api):
    api.mlflow_uri = "http://127.0.0.1:9"  # nothing listens there
    api.extra_env = {"MLFLOW_READY_TIMEOUT_S": "2"}


@pytest.mark.parametrize("breakage, check, words", [
    (break_deployment, "deployment mlflow/mlflow", "0/1 ready"),
    (break_release, "release kueue", "failed"),
    (break_queue, "queue team-vision", "FlavorNotFound"),
    (break_scrape, "scrape Kueue's quota metrics", "403"),
    (fire_alert, "alerts", "KubeControllerManagerDown"),
    (stale_budget, "budget controller", "last pass"),
    (wrong_admin, "mlflow", "401"),
    (mlflow_down, "mlflow", "did not answer /health"),
    (old_runtime, "node runtimes", "not: ip-10-0-"),
])
@pytest.mark.slow  # the cluster fixture's MLflow server
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


# ---- removing a team: drain its queue first --------------------------------------------------------------------------

def drain(kubeconfig, team: str, *extra) -> subprocess.CompletedProcess:
    return run_cli("platform", "drain-team", team, "--stack", "dev", *extra, env={"KUBECONFIG": str(kubeconfig), "COLUMNS": "250"},
                   timeout=120)


def vision_queue(api) -> dict:
    return api.find("kueue.x-k8s.io", "v1beta2", "clusterqueues", None, contract.cluster_queue_name("vision"))


def kueue_evicting(api, evicts: bool):
    """Kueue as HoldAndDrain makes it act: once the queue is drained it evicts the admitted workloads one by one (or,
    `evicts=False`, a workload that never lets go)."""
    from support.waiting import repeating

    def step() -> None:
        queue = vision_queue(api)  # a patch stores a new object
        if evicts and queue["spec"].get("stopPolicy") == "HoldAndDrain" and queue["status"]["admittedWorkloads"] > 0:
            queue["status"]["admittedWorkloads"] -= 1
    return repeating(step)


@pytest.mark.slow  # the cluster fixture's MLflow server
def test_drain_team_holds_the_queue_and_returns_once_kueue_has_let_go_of_every_workload(cluster):
    """The removal's order: the queue held and drained, its workloads evicted, then (the next `up`) the queue deleted —
    never a delete Kueue's `resource-in-use` finalizer would hold up. A budget hold becomes the engineer's hold, so the
    budget controller does not lift it at the month's turn."""
    api, kubeconfig = cluster
    queue = vision_queue(api)
    queue["metadata"].setdefault("annotations", {})[contract.BUDGET_HOLD_ANNOTATION] = "over budget"
    queue["status"].update(admittedWorkloads=3, reservingWorkloads=0)
    with kueue_evicting(api, evicts=True):
        result = drain(kubeconfig, "vision", "--timeout", "1m")
    assert result.returncode == 0, result.stdout + result.stderr
    queue = vision_queue(api)
    assert queue["spec"]["stopPolicy"] == "HoldAndDrain" and queue["status"]["admittedWorkloads"] == 0
    annotations = queue["metadata"]["annotations"]
    assert contract.BUDGET_HOLD_ANNOTATION not in annotations and contract.DRAIN_ANNOTATION in annotations
    assert "is drained" in result.stdout and "Next: remove team vision" in result.stdout
    patches = [r for r in api.requests if r["method"] == "PATCH" and "clusterqueues" in r["path"]]
    assert len(patches) == 1 and not [r for r in api.requests if r["method"] == "DELETE"], "it drains; the removal deletes"


@pytest.mark.slow  # the cluster fixture's MLflow server
def test_drain_team_names_what_is_still_admitted_at_its_timeout(cluster):
    api, kubeconfig = cluster
    queue = vision_queue(api)
    queue["status"].update(admittedWorkloads=1, reservingWorkloads=1)
    with kueue_evicting(api, evicts=False):
        result = drain(kubeconfig, "vision", "--timeout", "3s")
    assert result.returncode == 1
    assert "still holds 2 admitted or reserving workloads after 3s" in result.stderr
    assert f"kubectl get workloads -n {contract.namespace_name('vision')}" in result.stderr


@pytest.mark.slow  # the cluster fixture's MLflow server
def test_drain_team_refuses_a_team_the_stack_does_not_have(cluster):
    _, kubeconfig = cluster
    result = drain(kubeconfig, "nlp")
    assert result.returncode == 2 and "team 'nlp' is not in stack dev" in result.stderr
    assert "Traceback" not in result.stderr
