"""A team as Kubernetes objects: its namespace (cost labels, Pod Security), quota backstop and defaults, Kueue queues,
access, isolation, identity and the settings the CLI reads. Pure data; platform/components/tenancy.py applies it.

Pod Security: **restricted** is enforced. Training pods need a memory-backed /dev/shm (an emptyDir) and get EFA and
GPUs through device plugins (no privileged container, no host path, no added capability: the EKS AMIs already run
containerd with unlimited locked memory). The rendered pods run as the team's uid, non-root, with the runtime's
seccomp profile, and every training container drops all capabilities and cannot escalate (the ClusterTrainingRuntime
and the PyTorchJob template set it, so a researcher's own image needs nothing for it): tests/test_isolation.py checks
every rendered pod against the standard (tests/support/pod_security.py).
"""

from __future__ import annotations

from typing import Any, Sequence

from trainforge import contract, kueue
from trainforge.platform.manifests import guardrails, storage
from trainforge.stackconfig import PlatformConfig, TeamConfig

TEAM_LABEL = contract.LABEL_TEAM
MEMBER_ROLE = "trainforge-team-member"
SETTINGS_CONFIG_MAP = contract.TEAM_SETTINGS_CONFIG_MAP


def cost_labels(team: TeamConfig, environment: str) -> dict[str, str]:
    return {TEAM_LABEL: team.name, contract.LABEL_COST_CENTRE: contract.label_value(team.cost_centre), contract.LABEL_ENVIRONMENT: environment}


def _meta(name: str, team: TeamConfig, environment: str, namespaced: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": cost_labels(team, environment)}
    if namespaced:
        meta["namespace"] = contract.namespace_name(team.name)
    return meta


def namespace(team: TeamConfig, environment: str) -> dict[str, Any]:
    labels = {**cost_labels(team, environment),
              "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted",
              "pod-security.kubernetes.io/audit": "restricted"}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": contract.namespace_name(team.name), "labels": labels}}


def resource_quota(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any]:
    """A backstop under Kueue: what the namespace may hold at once even if something bypasses the queue — the sum of
    what the team's ClusterQueue can ever admit (quota plus borrowing, every flavour)."""
    total: dict[str, int] = {}
    for quota in kueue.team_quotas(cfg, team):
        for resource, amount in quota.nominal.items():
            total[resource] = total.get(resource, 0) + amount + quota.borrowing.get(resource, 0)
    hard = {contract.quota_requests_key(contract.RESOURCE_GPU): str(total[contract.RESOURCE_GPU]),
            contract.quota_requests_key(contract.RESOURCE_EFA): str(total[contract.RESOURCE_EFA]),
            "requests.cpu": kueue.cpu_text(total["cpu"]), "requests.memory": kueue.memory_text(total["memory"]),
            # Scratch disk: Kueue leaves it out (contract.KUEUE_EXCLUDED_RESOURCES); counted here, limits included.
            contract.quota_requests_key(contract.RESOURCE_EPHEMERAL_STORAGE): team.ephemeral_storage_quota,
            f"limits.{contract.RESOURCE_EPHEMERAL_STORAGE}": team.ephemeral_storage_quota,
            "pods": "500", "persistentvolumeclaims": "10"}
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": _meta("trainforge-quota", team, cfg.environment), "spec": {"hard": hard}}


def limit_range(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any]:
    """A pod that says nothing is still bounded (and counted against the quota); its scratch disk too (the quota counts
    ephemeral-storage limits, so a container without one would otherwise be refused)."""
    disk = contract.RESOURCE_EPHEMERAL_STORAGE
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": _meta("trainforge-defaults", team, cfg.environment),
            "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "500m", "memory": "1Gi", disk: "1Gi"},
                                 "default": {"cpu": "2", "memory": "8Gi", disk: "10Gi"}}]}}


def cluster_queue(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any]:
    """The team's quota per flavour (trainforge.kueue: GPUs as configured, cpu/memory/EFA per GPU), cost-labelled."""
    return kueue.cluster_queue(cfg, team, labels=cost_labels(team, cfg.environment))


def local_queue(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any]:
    return {"apiVersion": contract.KUEUE_API, "kind": "LocalQueue", "metadata": _meta(contract.queue_name(team.name), team, cfg.environment),
            "spec": {"clusterQueue": contract.cluster_queue_name(team.name)}}


def member_role(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any]:
    """Run, watch and delete training jobs; read pods, logs, events, the team's settings and its study database URL — in
    this namespace only. Nothing that bypasses Kueue (pods, Jobs), no write to settings, quotas, policies or RBAC."""
    jobs = ["create", "get", "list", "watch", "delete", "patch"]
    read = ["get", "list", "watch"]
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(MEMBER_ROLE, team, cfg.environment),
            "rules": [{"apiGroups": [contract.api_group(contract.TRAINER_API)], "resources": ["trainjobs"], "verbs": jobs},
                      {"apiGroups": [contract.api_group(contract.PYTORCHJOB_API)], "resources": ["pytorchjobs"], "verbs": jobs},
                      {"apiGroups": [""], "resources": ["pods", "pods/log", "events", "configmaps"], "verbs": read},
                      {"apiGroups": [contract.api_group(contract.KUEUE_API)], "resources": ["localqueues", "workloads"], "verbs": read},
                      # The team's own study database URL, for `trainforge sweep --backend kubernetes`, and its MLflow
                      # credentials (the UI, the API); no other Secret.
                      {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
                       "resourceNames": [contract.SWEEP_STORAGE_SECRET, contract.MLFLOW_SECRET]}]}


def queue_reader_name(team: TeamConfig) -> str:
    return f"trainforge-{team.name}-queue-reader"


def queue_reader(cfg: PlatformConfig, team: TeamConfig) -> list[dict[str, Any]]:
    """Read of the team's own ClusterQueue (cluster-scoped: a namespaced Role cannot grant it; Kueue's
    clusterqueue-viewer role aggregates only to `admin`), for its quota and its budget hold. `get` only: RBAC cannot
    restrict a plain list to named objects, and the other teams' queues are not the team's business."""
    name = queue_reader_name(team)
    meta = _meta(name, team, cfg.environment, namespaced=False)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta,
            "rules": [{"apiGroups": [contract.api_group(contract.KUEUE_API)], "resources": ["clusterqueues"], "verbs": ["get"],
                       "resourceNames": [contract.cluster_queue_name(team.name)]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": dict(meta),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": contract.team_group(team.name)},
                            # The team's sweep controller admits each trial over the live queue, as `submit` does.
                            {"kind": "ServiceAccount", "name": contract.SWEEP_CONTROLLER_SERVICE_ACCOUNT,
                             "namespace": contract.namespace_name(team.name)}]}
    return [role, binding]


def role_bindings(cfg: PlatformConfig, team: TeamConfig) -> list[dict[str, Any]]:
    def binding(name: str, role_kind: str, role: str, group: str) -> dict[str, Any]:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(name, team, cfg.environment),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]}
    out = [binding("trainforge-team-members", "Role", MEMBER_ROLE, contract.team_group(team.name))]
    if team.visible_to_organisation:
        out.append(binding("trainforge-organisation-view", "ClusterRole", "view", contract.ORGANISATION_GROUP))
    return out


def in_cluster_ranges(cfg: PlatformConfig) -> list[str]:
    """Addresses of everything inside the cluster: the VPC (pods, nodes, the API server's private endpoint) and the
    Service ClusterIPs (contract.EKS_DEFAULT_SERVICE_CIDRS), without overlaps (an except must lie in its cidr)."""
    import ipaddress
    ranges = [ipaddress.IPv4Network(c) for c in (str(cfg.network.vpc_cidr), *contract.EKS_DEFAULT_SERVICE_CIDRS)]
    return [str(r) for r in ipaddress.collapse_addresses(ranges)]


def network_policies(cfg: PlatformConfig, team: TeamConfig) -> list[dict[str, Any]]:
    """Deny everything, then allow what training needs: the namespace to itself (rendezvous, NCCL bootstrap), DNS,
    scraping from the monitoring namespace, the MLflow service, and HTTPS out (S3, STS and the other AWS endpoints)
    but not into the VPC: pods, nodes and the API server's private endpoint all have VPC addresses, and no training pod
    needs any of them on 443. So a team pod reaches no platform service but MLflow and DNS (tests/test_isolation.py,
    over the charts' own pods). Ingress into a platform service cannot be narrowed by address: the API server's
    service proxy (`trainforge platform verify`) comes from control-plane interfaces in the pod subnets, so any
    address range admitting it would admit every pod; the teams' egress, and MLflow's (the one platform server that
    fetches what a user names, tracking.network_policies), are where isolation holds.
    Enforced by the VPC CNI's network policy agent (the vpc-cni add-on has it on)."""
    def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(name, team, cfg.environment), "spec": spec}

    def namespace_peer(name: str) -> dict[str, Any]:
        return {"namespaceSelector": {"matchLabels": {kueue.NAMESPACE_NAME_LABEL: name}}}
    everyone: dict[str, Any] = {"podSelector": {}}
    return [
        policy("default-deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        policy("allow-same-namespace", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                                        "ingress": [{"from": [everyone]}], "egress": [{"to": [everyone]}]}),
        policy("allow-dns", {"podSelector": {}, "policyTypes": ["Egress"], "egress": [dns_egress()]}),
        policy("allow-metrics-scrape", {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{
            "from": [namespace_peer(contract.NAMESPACE_MONITORING)], "ports": [{"protocol": "TCP", "port": contract.METRICS_PORT}]}]}),
        policy("allow-mlflow", {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{
            "to": [namespace_peer(contract.NAMESPACE_MLFLOW)], "ports": [{"protocol": "TCP", "port": contract.MLFLOW_PORT}]}]}),
        policy("allow-https-out", {"podSelector": {}, "policyTypes": ["Egress"], "egress": [https_out_of_cluster(cfg)]}),
    ]


def dns_egress() -> dict[str, Any]:
    """An egress rule to the cluster's DNS (CoreDNS in kube-system), UDP and TCP."""
    return {"to": [{"namespaceSelector": {"matchLabels": {kueue.NAMESPACE_NAME_LABEL: contract.NAMESPACE_KUBE_SYSTEM}},
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}


def https_out_of_cluster(cfg: PlatformConfig) -> dict[str, Any]:
    """An egress rule to HTTPS outside the cluster (S3, STS and the other AWS endpoints), never into the VPC or a
    Service address."""
    return {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": in_cluster_ranges(cfg)}}], "ports": [{"protocol": "TCP", "port": 443}]}


def service_account(cfg: PlatformConfig, team: TeamConfig, role_arn: Any) -> dict[str, Any]:
    meta = _meta(contract.TRAINING_SERVICE_ACCOUNT, team, cfg.environment)
    meta["annotations"] = {contract.IRSA_ROLE_ANNOTATION: role_arn}
    # No API token in the pods that use it (IRSA's web identity token is a projected volume of its own).
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta, "automountServiceAccountToken": False}


def settings(cfg: PlatformConfig, team: TeamConfig, prices_as_of: str, runtime_image: Any, image_prefixes: Sequence[Any] = ()) -> dict[str, Any]:
    """What the CLI needs of the team without the stack file (the budget controller adds spent / as-of). The runtime
    image is the one the platform deployed, by digest: what a job that names no image runs (its content tag changes
    with every build, so no client could name it from its own version)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(SETTINGS_CONFIG_MAP, team, cfg.environment),
            "data": {"team": team.name, "cost_centre": team.cost_centre, contract.SETTING_BUDGET_USD: f"{team.monthly_budget_usd:.2f}",
                     contract.SETTING_DEFAULT_IMAGE: runtime_image,
                     "region": cfg.region, "prices_as_of": prices_as_of, guardrails.PARAM_QUEUE: contract.queue_name(team.name),
                     # The team's POSIX identity: its pods run as it and its FSx directory belongs to it (admission
                     # policy params, platform/manifests/guardrails.py).
                     guardrails.PARAM_UID: str(contract.team_posix_id(team.name)), guardrails.PARAM_GID: str(contract.team_posix_id(team.name)),
                     # Where its pods may pull images from, one prefix per key (the pod admission policy's rule).
                     **{f"{contract.SETTING_IMAGE_PREFIX}{i}": prefix for i, prefix in enumerate(image_prefixes)},
                     # The priorities its jobs may use, each by its WorkloadPriorityClass (the jobs admission policy's rule).
                     **{f"{contract.SETTING_PRIORITY_PREFIX}{p}": contract.priority_class_name(p) for p in team.priorities}}}


def claims(cfg: PlatformConfig, team: TeamConfig) -> list[dict[str, Any]]:
    """The claims the platform's static FSx volumes are pre-bound to (platform/manifests/storage.py)."""
    def claim(name: str, mode: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(name, team, cfg.environment),
                "spec": {"accessModes": [mode], "storageClassName": storage.STORAGE_CLASS, "volumeName": f"{name}-{team.name}",
                         "resources": {"requests": {"storage": f"{cfg.fsx.storage_capacity_gib}Gi"}}}}
    return [claim(contract.FSX_CLAIM_NAME, "ReadWriteMany"), claim(contract.FSX_DATASETS_CLAIM_NAME, "ReadOnlyMany")]


SWEEP_CONTROLLER_ROLE = contract.SWEEP_CONTROLLER_SERVICE_ACCOUNT  # the Role is named as the ServiceAccount it binds


def sweep_controller(cfg: PlatformConfig, team: TeamConfig) -> list[dict[str, Any]]:
    """What a cluster sweep's controller (a TrainJob of the team's, trainer/sweeps/cluster.py) runs as: a ServiceAccount
    whose Role grants what a member may do with jobs and reads the team's settings — nothing more, since any member
    can name this ServiceAccount in a job of theirs. Its status object is its own TrainJob (annotations), so it needs no
    write to ConfigMaps (the team's settings hold its budget state). No token is mounted by default: the controller's
    pod projects one explicitly. Its pods reach the API server on 443 (the `kubernetes` Service and, after translation,
    the endpoint's addresses in the VPC), which no other team pod may."""
    namespace = contract.namespace_name(team.name)
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(contract.SWEEP_CONTROLLER_SERVICE_ACCOUNT, team, cfg.environment),
               "automountServiceAccountToken": False}
    jobs = ["create", "get", "list", "watch", "delete", "patch"]
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(SWEEP_CONTROLLER_ROLE, team, cfg.environment),
            "rules": [{"apiGroups": [contract.api_group(contract.TRAINER_API)], "resources": ["trainjobs"], "verbs": jobs},
                      {"apiGroups": [contract.api_group(contract.PYTORCHJOB_API)], "resources": ["pytorchjobs"], "verbs": jobs},
                      {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": [contract.TEAM_SETTINGS_CONFIG_MAP]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(SWEEP_CONTROLLER_ROLE, team, cfg.environment),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SWEEP_CONTROLLER_ROLE},
               "subjects": [{"kind": "ServiceAccount", "name": contract.SWEEP_CONTROLLER_SERVICE_ACCOUNT, "namespace": namespace}]}
    api = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta("allow-sweep-controller-api", team, cfg.environment),
           "spec": {"podSelector": {"matchLabels": {contract.SWEEP_ROLE_LABEL: contract.SWEEP_CONTROLLER_ROLE}}, "policyTypes": ["Egress"],
                    "egress": [{"to": [{"ipBlock": {"cidr": cidr}} for cidr in api_server_addresses(cfg)],
                                "ports": [{"protocol": "TCP", "port": 443}]}]}}
    return [account, role, binding, api]


def api_server_addresses(cfg: PlatformConfig) -> list[str]:
    """The `kubernetes` Service (the first address of each EKS Service range) and the VPC, where the API server's
    private endpoint has its addresses (assigned by EKS, not known before the cluster exists)."""
    import ipaddress
    services = [f"{ipaddress.ip_network(c)[1]}/32" for c in contract.EKS_DEFAULT_SERVICE_CIDRS]
    return [*services, str(cfg.network.vpc_cidr)]


def team_objects(cfg: PlatformConfig, team: TeamConfig, *, role_arn: Any, prices_as_of: str, runtime_image: Any,
                 image_prefixes: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Every object of one team, namespace first. `image_prefixes`: where its pods may pull images from (the deployed
    image's repository, known at deploy, is among them)."""
    return [namespace(team, cfg.environment), resource_quota(cfg, team), limit_range(cfg, team), cluster_queue(cfg, team),
            local_queue(cfg, team), member_role(cfg, team), *role_bindings(cfg, team), *queue_reader(cfg, team), *network_policies(cfg, team),
            service_account(cfg, team, role_arn), *sweep_controller(cfg, team), settings(cfg, team, prices_as_of, runtime_image, image_prefixes),
            *claims(cfg, team)]
