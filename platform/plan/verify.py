"""`trainforge platform verify`: after a `pulumi up`, check the live cluster the way a platform engineer would — the
application layer's counterpart of the offline plan (the plan says what an up would do; verify says whether it did).

What the stack should have comes from its config and the chart table (what the program deploys); what it has is read
through the Kubernetes API with the caller's kubeconfig, Prometheus through the API server's service proxy (no
port-forward, no network path into the VPC needed). MLflow is checked from inside the cluster by a short Job, as its
admin: the service proxy strips the caller's Authorization header and sends the pod's address as Host, so through it
MLflow (basic auth, a Host allowlist) could never answer. Each finding names what is wrong and the fix.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from trainforge import contract
from trainforge.platform.manifests import budget, monitoring, tracking
from trainforge.platform.manifests.charts import pinned
from trainforge.stackconfig import PlatformConfig

PLATFORM_NAMESPACES = contract.PLATFORM_NAMESPACES
PROMETHEUS_SERVICE = (contract.NAMESPACE_MONITORING, f"{contract.PROMETHEUS_SERVICE_NAME}:{contract.PROMETHEUS_PORT}")
# kube-prometheus-stack's always-firing heartbeat and its inhibitor: firing is their healthy state.
HEARTBEAT_ALERTS = {"Watchdog", "InfoInhibitor"}


@dataclass(frozen=True)
class Scrape:
    pool: str  # Prometheus' scrapePool for a ServiceMonitor/PodMonitor endpoint
    what: str
    required: bool  # False: it may have no target yet (no GPU node, no job running)


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if not f.ok]

    def add(self, check: str, ok: bool, detail: str, fix: str = "") -> None:
        self.findings.append(Finding(check, ok, detail, "" if ok else fix))

    def to_json(self) -> dict[str, Any]:
        return {"ok": not self.problems, "seconds": round(self.seconds, 2), "findings": [f.__dict__ for f in self.findings]}


def expected_scrapes() -> list[Scrape]:
    return [
        Scrape(f"serviceMonitor/{contract.NAMESPACE_KUEUE}/{monitoring.KUEUE_MONITOR}/0", "Kueue's quota metrics", True),
        Scrape(f"podMonitor/{contract.NAMESPACE_MONITORING}/{budget.NAME}/0", "the budget controller", True),
        Scrape(f"serviceMonitor/{contract.NAMESPACE_MONITORING}/dcgm-exporter/0", "DCGM GPU metrics", False),
        Scrape(f"podMonitor/{contract.NAMESPACE_MONITORING}/{monitoring.TRAINER_PODMONITOR}/0", "training pods", False),
    ]


class Api:
    """JSON over the official client's connection (kubeconfig auth, TLS), paths as the API server has them: reads, and
    the one Job verify runs (created, then deleted)."""

    def __init__(self, context: str | None = None, timeout_s: float = 20.0):
        import os

        from kubernetes import client, config
        configuration = client.Configuration()
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), context=context, client_configuration=configuration)
        configuration.retries = 1
        self.client = client.ApiClient(configuration)
        self.timeout_s = timeout_s

    def get(self, path: str, query: dict[str, str] | None = None) -> tuple[int, Any]:
        return self._call("GET", path, query)

    def create(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        return self._call("POST", path, None, body)

    def delete(self, path: str, query: dict[str, str] | None = None) -> tuple[int, Any]:
        return self._call("DELETE", path, query)

    def _call(self, method: str, path: str, query: dict[str, str] | None, body: Any = None) -> tuple[int, Any]:
        from kubernetes.client.exceptions import ApiException
        try:
            # _preload_content=False: the raw response, whatever the body (JSON from the API, text from a proxied service).
            response = self.client.call_api(path, method, query_params=list((query or {}).items()), auth_settings=["BearerToken"],
                                            body=body, header_params={"Content-Type": "application/json"} if body is not None else None,
                                            _preload_content=False, _return_http_data_only=True, _request_timeout=self.timeout_s)
            status, body = response.status, response.data.decode()
        except ApiException as exc:
            status, body = exc.status, exc.body or ""
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body

    def proxy(self, service: tuple[str, str], path: str, query: dict[str, str] | None = None) -> tuple[int, Any]:
        namespace, name = service
        return self.get(f"/api/v1/namespaces/{namespace}/services/{name}/proxy{path}", query)


def verify(cfg: PlatformConfig, api: Api, now: Callable[[], float] = time.time, on_check: Callable[[str], None] = lambda _: None) -> Report:
    started = now()
    report = Report()
    for step, check in (("Helm releases", _releases), ("workloads", _workloads), ("team queues", _queues),
                        ("Prometheus targets", _targets), ("alerts", _alerts), ("budget controller", _budget), ("MLflow", _mlflow),
                        ("nodes", _nodes)):
        on_check(step)
        check(cfg, api, report, now)
    report.seconds = now() - started
    return report


def _releases(cfg: PlatformConfig, api: Api, report: Report, now) -> None:
    """Helm keeps each release's state in Secrets labelled owner=helm,name=<release> (one per revision)."""
    for chart in pinned(cfg.kubernetes).values():
        if chart.release == "aws-efa-k8s-device-plugin" and not any(g.efa for g in cfg.node_groups):
            continue
        status, body = api.get(f"/api/v1/namespaces/{chart.namespace}/secrets", {"labelSelector": f"owner=helm,name={chart.release}"})
        revisions = sorted((body.get("items") or []) if status == 200 else [], key=lambda s: int(s["metadata"]["labels"].get("version", 0)))
        state = revisions[-1]["metadata"]["labels"].get("status") if revisions else "not installed"
        report.add(f"release {chart.release}", state == "deployed", f"{chart.namespace}/{chart.release} {chart.version}: {state}",
                   f"`helm history {chart.release} -n {chart.namespace}` shows why; `pulumi up` again once fixed"
                   if revisions else "`pulumi up` (the release was never installed: check its output for the failure)")


def _workloads(cfg: PlatformConfig, api: Api, report: Report, now) -> None:
    for namespace in PLATFORM_NAMESPACES:
        for kind, plural in (("Deployment", "deployments"), ("DaemonSet", "daemonsets")):
            status, body = api.get(f"/apis/apps/v1/namespaces/{namespace}/{plural}")
            for obj in (body.get("items") or []) if status == 200 else []:
                s = obj.get("status") or {}
                want, have = (s.get("replicas", obj["spec"].get("replicas", 1)), s.get("readyReplicas", 0)) if kind == "Deployment" \
                    else (s.get("desiredNumberScheduled", 0), s.get("numberReady", 0))
                name = f"{namespace}/{obj['metadata']['name']}"
                report.add(f"{kind.lower()} {name}", have >= want, f"{have}/{want} ready",
                           f"`kubectl -n {namespace} describe {kind.lower()} {obj['metadata']['name']}` and its pods' events "
                           "(Pending: no system node fits its requests; ImagePullBackOff: the image; CrashLoopBackOff: its logs)")


def _nodes(cfg: PlatformConfig, api: Api, report: Report, now) -> None:
    """Every node's runtime honours the team pods' supplementalGroupsPolicy (containerd 2.0+): a node that cannot refuses
    them at admission (`SupplementalGroupsPolicyNotSupported`), so a team's jobs would fail only there."""
    status, body = api.get("/api/v1/nodes")
    nodes = (body.get("items") or []) if status == 200 else []
    unable = sorted(n["metadata"]["name"] for n in nodes
                    if not ((n.get("status") or {}).get("features") or {}).get("supplementalGroupsPolicy"))
    detail = f"{len(nodes) - len(unable)}/{len(nodes)} run team pods' groups {contract.SUPPLEMENTAL_GROUPS_POLICY}" if status == 200 \
        else f"cannot list nodes ({status})"
    report.add("node runtimes", status == 200 and not unable, detail + (f"; not: {', '.join(unable[:10])}" if unable else ""),
               "their AMI's containerd is older than 2.0 (EKS AL2023 AMIs before v20251016): update the node group "
               "(`aws eks update-nodegroup-version --cluster-name <cluster> --nodegroup-name <group>`), then verify again")


def _queues(cfg: PlatformConfig, api: Api, report: Report, now) -> None:
    for team in cfg.teams:
        name = contract.cluster_queue_name(team.name)
        status, body = api.get(f"/apis/{contract.KUEUE_API}/clusterqueues/{name}")
        conditions = {c["type"]: c for c in ((body.get("status") or {}).get("conditions") or [])} if status == 200 else {}
        active = conditions.get("Active", {})
        held = (body.get("spec") or {}).get("stopPolicy", "None") != "None" if status == 200 else False
        detail = "active" if active.get("status") == "True" else f"not active: {active.get('reason', status)} {active.get('message', '')}".strip()
        report.add(f"queue {name}", active.get("status") == "True", detail + (" (held: stopPolicy set)" if held else ""),
                   "a flavour it names has no ResourceFlavor, or Kueue is not running: `kubectl get clusterqueue "
                   f"{name} -o yaml`" if status == 200 else f"`pulumi up` of the stack that declares team {team.name} (the platform's, "
                   f"or {cfg.environment}.team-{team.name}): its queue does not exist")


def _targets(cfg: PlatformConfig, api: Api, report: Report, now) -> None:
    status, body = api.proxy(PROMETHEUS_SERVICE, "/api/v1/targets", {"state": "active"})
    if status != 200:
        report.add("prometheus", False, f"Prometheus does not answer through the API proxy ({status})",
                   "`kubectl -n monitoring get pods` (a Pending prometheus pod: its volume claim, the StorageClass)")
        return
    targets = body["data"]["activeTargets"]
    for scrape in expected_scrapes():
        mine = [t for t in targets if t.get("scrapePool") == scrape.pool]
        down = [t for t in mine if t.get("health") != "up"]
        if not mine:
            report.add(f"scrape {scrape.what}", not scrape.required, f"{scrape.pool}: no target" +
                       ("" if scrape.required else " (none expected until a GPU node or a job runs)"),
                       "is the monitor selected (label release: kube-prometheus-stack) and the service or pod there?")
        else:
            report.add(f"scrape {scrape.what}", not down, f"{len(mine) - len(down)}/{len(mine)} targets up" +
                       "".join(f"; {t.get('labels', {}).get('instance')}: {t.get('lastError')}" for t in down[:3]),
                       "the target's lastError says why (TLS, 401/403 on /metrics, the port name)")


def _alerts(cfg: PlatformConfig, api: Api, report: Report, now) -> None:
    status, body = api.proxy(PROMETHEUS_SERVICE, "/api/v1/alerts")
    if status != 200:
        return  # said once, by the targets check
    firing = sorted({a["labels"]["alertname"] for a in body["data"]["alerts"]
                     if a.get("state") == "firing" and a["labels"].get("alertname") not in HEARTBEAT_ALERTS})
    report.add("alerts", not firing, "none firing" if not firing else f"firing: {', '.join(firing)}",
               "each alert's runbook_url or summary (Grafana > Alerting); a healthy new cluster has none")


def _budget(cfg: PlatformConfig, api: Api, report: Report, now) -> None:
    status, body = api.proxy(PROMETHEUS_SERVICE, "/api/v1/query", {"query": "max(trainforge_budget_last_pass_timestamp_seconds)"})
    if status != 200:
        return
    result = body["data"]["result"]
    every_s = cfg.kubernetes.monitoring.budget_every_minutes * 60
    if not result:
        report.add("budget controller", False, "no pass recorded", "`kubectl -n trainforge-system logs deploy/trainforge-budget` "
                   "(OpenCost unreachable, or the API refusing it)")
        return
    age = now() - float(result[0]["value"][1])
    report.add("budget controller", age <= 3 * every_s, f"last pass {age:.0f} s ago (every {every_s} s)",
               "`kubectl -n trainforge-system logs deploy/trainforge-budget`; until it passes, budgets are not enforced")


def _mlflow(cfg: PlatformConfig, api: Api, report: Report, now) -> None:
    """Run tracking.probe_job on the image MLflow runs (on the system nodes already, so no pull to wait for) and report
    what it printed; the Job is deleted whatever happened."""
    jobs = f"/apis/batch/v1/namespaces/{contract.NAMESPACE_MLFLOW}/jobs"
    status, deployment = api.get(f"/apis/apps/v1/namespaces/{contract.NAMESPACE_MLFLOW}/deployments/{contract.MLFLOW_SERVICE_NAME}")
    containers = deployment.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []) if status == 200 else []
    image = next((c["image"] for c in containers if c.get("name") == contract.MLFLOW_SERVICE_NAME), None)
    if image is None:
        report.add("mlflow", False, f"no {contract.NAMESPACE_MLFLOW}/{contract.MLFLOW_SERVICE_NAME} Deployment ({status})",
                   "`helm history mlflow -n mlflow`, then `pulumi up`")
        return
    name = f"{tracking.PROBE_JOB_PREFIX}{int(now())}"
    status, body = api.create(jobs, tracking.probe_job(name, image))
    if status not in (200, 201):
        report.add("mlflow", False, f"could not start the check Job: {status} {str(body)[:200]}",
                   "verify runs a Job in the mlflow namespace: run it as a platform admin")
        return
    try:
        succeeded, output = _wait_for_job(api, f"{jobs}/{name}", name, now)
    finally:
        api.delete(f"{jobs}/{name}", {"propagationPolicy": "Background"})
    report.add("mlflow", succeeded, output or ("answers the admin" if succeeded else "the check Job did not finish"),
               "" if succeeded else _mlflow_fix(output))


def _wait_for_job(api: Api, path: str, name: str, now) -> tuple[bool, str]:
    """(succeeded, what its pod printed) once the Job ends, or (False, why) at its deadline."""
    deadline = now() + tracking.PROBE_DEADLINE_S + 30
    while now() < deadline:
        status, job = api.get(path)
        state = job.get("status", {}) if status == 200 else {}
        failed = any(c.get("type") == "Failed" and c.get("status") == "True" for c in state.get("conditions", []))
        if state.get("succeeded") or failed or state.get("failed"):
            return bool(state.get("succeeded")), _job_output(api, name)
        time.sleep(1)
    return False, f"the check Job {contract.NAMESPACE_MLFLOW}/{name} did not finish within {tracking.PROBE_DEADLINE_S + 30} s"


def _job_output(api: Api, name: str) -> str:
    status, pods = api.get(f"/api/v1/namespaces/{contract.NAMESPACE_MLFLOW}/pods", {"labelSelector": f"job-name={name}"})
    for pod in (pods.get("items") or []) if status == 200 else []:
        status, log = api.get(f"/api/v1/namespaces/{contract.NAMESPACE_MLFLOW}/pods/{pod['metadata']['name']}/log")
        if status == 200 and str(log).strip():
            return str(log).strip().splitlines()[-1][:300]
    return ""


def _mlflow_fix(output: str) -> str:
    if "Invalid Host header" in output:
        return "the chart's serverAllowedHosts must list the service's in-cluster names (platform/manifests/values.py mlflow_hosts)"
    if "401" in output:
        return "the mlflow-admin Secret and the chart's auth config disagree: `pulumi up` writes both"
    return "`kubectl -n mlflow logs deploy/mlflow` (the database connection, the artifact bucket's role)"
