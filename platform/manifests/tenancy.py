"""A team as Kubernetes objects: its namespace (cost labels, Pod Security), quota backstop and defaults, Kueue queues,
access, isolation, identity and the settings the CLI reads. Pure data; platform/components/tenancy.py applies it.

Pod Security: **baseline** is enforced, restricted only warned about. Training pods need a memory-backed /dev/shm
(an emptyDir, allowed by baseline) and EFA and GPUs arrive through device plugins (no privileged container, no host
path, no added capability: the EKS AMIs already run containerd with unlimited locked memory). Restricted would also
demand runAsNonRoot, a seccomp profile and dropping every capability on every container, which researchers' own
images commonly lack; the warning shows them what is missing without blocking their jobs.
"""

from __future__ import annotations

from typing import Any

from trainforge import catalog, contract
from trainforge.contract import Flavour
from trainforge.platform.manifests import storage
from trainforge.stackconfig import PlatformConfig, TeamConfig

TEAM_LABEL = contract.LABEL_TEAM
COST_CENTRE_LABEL = f"{contract.LABEL_DOMAIN}/{contract.TAG_COST_CENTRE}"
ENVIRONMENT_LABEL = f"{contract.LABEL_DOMAIN}/{contract.TAG_ENVIRONMENT}"
MEMBER_ROLE = "trainforge-team-member"
SETTINGS_CONFIG_MAP = contract.TEAM_SETTINGS_CONFIG_MAP
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace


def cost_labels(team: TeamConfig, environment: str) -> dict[str, str]:
    return {TEAM_LABEL: team.name, COST_CENTRE_LABEL: contract.label_value(team.cost_centre), ENVIRONMENT_LABEL: environment}


def _meta(name: str, team: TeamConfig, environment: str, namespaced: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": cost_labels(team, environment)}
    if namespaced:
        meta["namespace"] = contract.namespace_name(team.name)
    return meta


def namespace(team: TeamConfig, environment: str) -> dict[str, Any]:
    labels = {**cost_labels(team, environment),
              "pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/warn": "restricted",
              "pod-security.kubernetes.io/audit": "restricted"}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": contract.namespace_name(team.name), "labels": labels}}


def efa_devices(cfg: PlatformConfig, team: TeamConfig) -> int:
    """EFA devices the team's EFA GPUs come with: whole EFA nodes' worth."""
    groups = [g for g in cfg.node_groups if g.efa]
    if not groups or not team.reachable_gpus(Flavour.GPU_EFA):
        return 0
    group = groups[0]
    nodes = -(-team.reachable_gpus(Flavour.GPU_EFA) // group.gpus_per_node)
    return nodes * catalog.efa_device_count(group.instances[0])


def resource_quota(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any]:
    """A backstop under Kueue: what the namespace may hold at once even if something bypasses the queue."""
    gpus = sum(team.reachable_gpus(f) for f in contract.GPU_FLAVOURS)
    hard = {f"requests.{contract.RESOURCE_GPU}": str(gpus), f"requests.{contract.RESOURCE_EFA}": str(efa_devices(cfg, team)),
            "requests.cpu": team.cpu_quota, "requests.memory": team.memory_quota, "pods": "500", "persistentvolumeclaims": "10"}
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": _meta("trainforge-quota", team, cfg.environment), "spec": {"hard": hard}}


def limit_range(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any]:
    """A pod that says nothing is still bounded (and counted against the quota)."""
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": _meta("trainforge-defaults", team, cfg.environment),
            "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "500m", "memory": "1Gi"},
                                 "default": {"cpu": "2", "memory": "8Gi"}}]}}


COVERED = ["cpu", "memory", contract.RESOURCE_GPU, contract.RESOURCE_EFA]


def cluster_queue(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any]:
    """The team's nominal GPU quota per flavour exactly as configured, in the platform's cohort: borrowing and lending
    from config, borrowed capacity reclaimed by its owner, a fair-sharing weight. CPU and memory follow the namespace's
    quota on every flavour it uses; the system flavour carries its CPU-only jobs."""
    flavours = [f for f in dict.fromkeys(g.flavour for g in cfg.node_groups) if f is Flavour.SYSTEM or team.gpu_quota.get(f, 0) > 0]
    entries = []
    for flavour in flavours:
        gpu: dict[str, Any] = {"name": contract.RESOURCE_GPU, "nominalQuota": team.gpu_quota.get(flavour, 0)}
        if flavour is not Flavour.SYSTEM:
            gpu["borrowingLimit"] = team.borrowing_limit.get(flavour, 0)
            if flavour in team.lending_limit:
                gpu["lendingLimit"] = team.lending_limit[flavour]
        efa = efa_devices(cfg, team) if flavour is Flavour.GPU_EFA else 0
        entries.append({"name": flavour.value, "resources": [
            {"name": "cpu", "nominalQuota": team.cpu_quota}, {"name": "memory", "nominalQuota": team.memory_quota}, gpu,
            {"name": contract.RESOURCE_EFA, "nominalQuota": efa}]})
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": _meta(contract.cluster_queue_name(team.name), team, cfg.environment, namespaced=False),
        "spec": {
            "cohortName": contract.KUEUE_COHORT,
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: contract.namespace_name(team.name)}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [{"coveredResources": COVERED, "flavors": entries}],
            "preemption": {"reclaimWithinCohort": "Any", "borrowWithinCohort": {"policy": "LowerPriority"},
                           "withinClusterQueue": "LowerPriority"},
            "fairSharing": {"weight": str(team.fair_share_weight)},
        },
    }


def local_queue(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": _meta(contract.queue_name(team.name), team, cfg.environment),
            "spec": {"clusterQueue": contract.cluster_queue_name(team.name)}}


def member_role(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any]:
    """Run, watch and delete training jobs; read pods, logs, events and the team's settings — in this namespace only."""
    jobs = ["create", "get", "list", "watch", "delete", "patch"]
    read = ["get", "list", "watch"]
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(MEMBER_ROLE, team, cfg.environment),
            "rules": [{"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": jobs},
                      {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": jobs},
                      {"apiGroups": [""], "resources": ["pods", "pods/log", "events", "configmaps"], "verbs": read},
                      {"apiGroups": ["kueue.x-k8s.io"], "resources": ["localqueues", "workloads"], "verbs": read}]}


def role_bindings(cfg: PlatformConfig, team: TeamConfig) -> list[dict[str, Any]]:
    def binding(name: str, role_kind: str, role: str, group: str) -> dict[str, Any]:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(name, team, cfg.environment),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]}
    out = [binding("trainforge-team-members", "Role", MEMBER_ROLE, contract.team_group(team.name))]
    if team.visible_to_organisation:
        out.append(binding("trainforge-organisation-view", "ClusterRole", "view", contract.ORGANISATION_GROUP))
    return out


def network_policies(cfg: PlatformConfig, team: TeamConfig) -> list[dict[str, Any]]:
    """Deny everything, then allow what training needs: the namespace to itself (rendezvous, NCCL bootstrap), DNS,
    scraping from the monitoring namespace, the MLflow service, and HTTPS out (S3, STS and the other AWS endpoints).
    Enforced by the VPC CNI's network policy agent (the vpc-cni add-on has it on)."""
    def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(name, team, cfg.environment), "spec": spec}

    def namespace_peer(name: str) -> dict[str, Any]:
        return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: name}}}
    everyone = {"podSelector": {}}
    return [
        policy("default-deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        policy("allow-same-namespace", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                                        "ingress": [{"from": [everyone]}], "egress": [{"to": [everyone]}]}),
        policy("allow-dns", {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{
            "to": [{**namespace_peer("kube-system"), "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]}),
        policy("allow-metrics-scrape", {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{
            "from": [namespace_peer(contract.NAMESPACE_MONITORING)], "ports": [{"protocol": "TCP", "port": contract.METRICS_PORT}]}]}),
        policy("allow-mlflow", {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{
            "to": [namespace_peer(contract.NAMESPACE_MLFLOW)], "ports": [{"protocol": "TCP", "port": contract.MLFLOW_PORT}]}]}),
        policy("allow-https-out", {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{
            "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"protocol": "TCP", "port": 443}]}]}),
    ]


def service_account(cfg: PlatformConfig, team: TeamConfig, role_arn: Any) -> dict[str, Any]:
    meta = _meta(contract.TRAINING_SERVICE_ACCOUNT, team, cfg.environment)
    meta["annotations"] = {contract.IRSA_ROLE_ANNOTATION: role_arn}
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}


def settings(cfg: PlatformConfig, team: TeamConfig, prices_as_of: str) -> dict[str, Any]:
    """What the CLI needs of the team without the stack file (the budget controller adds spent / as-of)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(SETTINGS_CONFIG_MAP, team, cfg.environment),
            "data": {"team": team.name, "cost_centre": team.cost_centre, contract.SETTING_BUDGET_USD: f"{team.monthly_budget_usd:.2f}",
                     "region": cfg.region, "prices_as_of": prices_as_of, "queue": contract.queue_name(team.name)}}


def claims(cfg: PlatformConfig, team: TeamConfig) -> list[dict[str, Any]]:
    """The claims the platform's static FSx volumes are pre-bound to (platform/manifests/storage.py)."""
    def claim(name: str, mode: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(name, team, cfg.environment),
                "spec": {"accessModes": [mode], "storageClassName": storage.STORAGE_CLASS, "volumeName": f"{name}-{team.name}",
                         "resources": {"requests": {"storage": f"{cfg.fsx.storage_capacity_gib}Gi"}}}}
    return [claim(contract.FSX_CLAIM_NAME, "ReadWriteMany"), claim(contract.FSX_DATASETS_CLAIM_NAME, "ReadOnlyMany")]


def team_objects(cfg: PlatformConfig, team: TeamConfig, *, role_arn: Any, prices_as_of: str) -> list[dict[str, Any]]:
    """Every object of one team, namespace first."""
    return [namespace(team, cfg.environment), resource_quota(cfg, team), limit_range(cfg, team), cluster_queue(cfg, team),
            local_queue(cfg, team), member_role(cfg, team), *role_bindings(cfg, team), *network_policies(cfg, team),
            service_account(cfg, team, role_arn), settings(cfg, team, prices_as_of), *claims(cfg, team)]
