"""The budget controller's objects: the identity it runs as (allowed to read and hold team ClusterQueues, update
the team settings ConfigMaps, record events — nothing else), its Deployment and the PodMonitor for its metrics.

A one-replica Deployment looping every few minutes rather than a CronJob: a CronJob's pod lives seconds, too short
for Prometheus to scrape the spend and hold metrics the budget alerts read; the loop is the same pass
(`trainforge budget run --once` is it by hand). `Recreate` so two controllers never act at once.
"""

from __future__ import annotations

from typing import Any

from trainforge import contract
from trainforge.platform.manifests.monitoring import SELECTED
from trainforge.platform.manifests.values import SYSTEM_NODES
from trainforge.stackconfig import PlatformConfig

NAME = contract.BUDGET_CONTROLLER
POD_LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "trainforge"}


def _meta(name: str = NAME, namespaced: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(POD_LABELS)}
    if namespaced:
        meta["namespace"] = contract.NAMESPACE_SYSTEM
    return meta


def service_account() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta()}


def cluster_role() -> dict[str, Any]:
    """ConfigMaps by name only (`trainforge-team` in any namespace); ClusterQueues listed (to find the teams) and
    patched (stopPolicy); Events created."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": _meta(namespaced=False),
            "rules": [{"apiGroups": [contract.api_group(contract.KUEUE_API)], "resources": ["clusterqueues"], "verbs": ["get", "list", "patch"]},
                      {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [contract.TEAM_SETTINGS_CONFIG_MAP],
                       "verbs": ["get", "patch"]},
                      {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]}


def cluster_role_binding() -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": _meta(namespaced=False),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": contract.NAMESPACE_SYSTEM}]}


def deployment(cfg: PlatformConfig, image: Any) -> dict[str, Any]:
    every_s = cfg.kubernetes.monitoring.budget_every_minutes * 60
    container = {
        "name": "controller", "image": image,
        "command": ["trainforge", "budget", "run", "--every", str(every_s), "--opencost", contract.OPENCOST_URL,
                    "--metrics-port", str(contract.BUDGET_METRICS_PORT)],
        "ports": [{"name": contract.METRICS_PORT_NAME, "containerPort": contract.BUDGET_METRICS_PORT}],
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": contract.RUNTIME_UID, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(),
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": dict(POD_LABELS)},
                     "template": {"metadata": {"labels": dict(POD_LABELS)},
                                  "spec": {"serviceAccountName": NAME, "nodeSelector": dict(SYSTEM_NODES),
                                           "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                                           "containers": [container]}}}}


def pod_monitor() -> dict[str, Any]:
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
            "metadata": {"name": NAME, "namespace": contract.NAMESPACE_MONITORING, "labels": dict(SELECTED)},
            "spec": {"namespaceSelector": {"matchNames": [contract.NAMESPACE_SYSTEM]}, "selector": {"matchLabels": dict(POD_LABELS)},
                     "podMetricsEndpoints": [{"port": contract.METRICS_PORT_NAME, "interval": "60s"}]}}


def controller_objects(cfg: PlatformConfig, image: Any) -> list[dict[str, Any]]:
    return [service_account(), cluster_role(), cluster_role_binding(), deployment(cfg, image)]
