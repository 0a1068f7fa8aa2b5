"""Kubernetes rules: what runs privileged, what is pinned, how team namespaces are marked. (The objects tenancy
creates are checked as they land: these rules are written against the resource types.)"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from trainforge import contract
from trainforge.policies.registry import Context, resource_rule

EXACT_VERSION = re.compile(r"^v?\d+\.\d+\.\d+$")
HELM = ("kubernetes:helm.sh/v3:Release", "kubernetes:helm.sh/v4:Chart")
# Kinds that carry pod templates (anything whose spec holds `containers` is inspected, at any depth).
WORKLOADS = ("kubernetes:core/v1:Pod", "kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:DaemonSet", "kubernetes:apps/v1:StatefulSet",
             "kubernetes:batch/v1:Job", "kubernetes:batch/v1:CronJob", "kubernetes:trainer.kubeflow.org/v1alpha1:ClusterTrainingRuntime",
             "kubernetes:trainer.kubeflow.org/v1alpha1:TrainingRuntime", "kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob",
             "kubernetes:kubeflow.org/v1:PyTorchJob", "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet")
TEAM_LABEL = contract.LABEL_TEAM
# What Pod Security `baseline` lets a container add (the file-ownership ones a setup Job needs among them); anything
# else (SYS_ADMIN, NET_ADMIN, SYS_PTRACE...) reaches past the container.
BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                         "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
COST_LABELS = (contract.LABEL_COST_CENTRE, contract.LABEL_ENVIRONMENT)


@resource_rule("kubernetes", HELM, "Every Helm release is pinned to an exact chart version.")
def helm_releases_pinned(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    version = str(props.get("version") or "")
    if not EXACT_VERSION.match(version):
        yield (f"chart {props.get('chart')!r} is pinned to {version or 'nothing'}: the next `pulumi up` could install another release. "
               "Fix: an exact version, e.g. '1.2.3'")


def pod_specs(node: Any) -> Iterable[Mapping[str, Any]]:
    if isinstance(node, Mapping):
        if isinstance(node.get("containers"), list):
            yield node
        for value in node.values():
            yield from pod_specs(value)
    elif isinstance(node, list):
        for value in node:
            yield from pod_specs(value)


@resource_rule("kubernetes", WORKLOADS, "No privileged containers, added capabilities, host namespaces or host paths outside the "
               "system namespaces.", config=("systemNamespaces",))
def no_privileged_pods_outside_system_namespaces(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    namespace = (props.get("metadata") or {}).get("namespace")
    if namespace in ctx.config["systemNamespaces"]:
        return
    for spec in pod_specs(props.get("spec")):
        for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
            if (container.get("securityContext") or {}).get("privileged") is True:
                yield (f"container {container.get('name')!r} runs privileged in {namespace or 'team namespaces'}: it owns the node. "
                       "Fix: drop privileged (EFA and GPUs come through device plugins), or run it in a system namespace")
        for field in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(field):
                yield f"the pod shares the node's {field[4:]} namespace in {namespace or 'team namespaces'}. Fix: remove {field}"
        for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
            added = set(((container.get("securityContext") or {}).get("capabilities") or {}).get("add") or []) - BASELINE_CAPABILITIES
            if added:
                yield (f"container {container.get('name')!r} adds capabilities {sorted(added)}. Fix: drop them (devices come "
                       "through device plugins)")
        for volume in spec.get("volumes", []):
            if volume.get("hostPath"):
                yield (f"volume {volume.get('name')!r} mounts the host path {volume['hostPath'].get('path')!r}. "
                       "Fix: an emptyDir, the FSx claim, or a system namespace")


@resource_rule("kubernetes", ["kubernetes:core/v1:Namespace"], "Team namespaces carry the cost labels.")
def team_namespaces_carry_cost_labels(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    labels = (props.get("metadata") or {}).get("labels") or {}
    if TEAM_LABEL not in labels:
        return
    missing = [k for k in COST_LABELS if not labels.get(k)]
    if missing:
        yield f"team namespace without {missing}: its pods' cost could not be attributed. Fix: label it from the team's config"


def _is_team_namespace(namespace: str | None) -> bool:
    return bool(namespace) and str(namespace).startswith(contract.TEAM_NAMESPACE_PREFIX)


@resource_rule("kubernetes", ["kubernetes:core/v1:Namespace"],
               "Team namespaces (the team label or the team- prefix) carry the team label and enforce Pod Security restricted.")
def team_namespaces_enforce_pod_security(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    metadata = props.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if TEAM_LABEL not in labels and not _is_team_namespace(metadata.get("name")):
        return
    if TEAM_LABEL not in labels:
        yield (f"namespace {metadata.get('name')!r} is named like a team's but has no {TEAM_LABEL} label, so no team rule (cost "
               "labels, admission policies) reaches it. Fix: create team namespaces through the team's config only")
    enforced = labels.get("pod-security.kubernetes.io/enforce")
    if enforced != "restricted":
        yield (f"team namespace enforces Pod Security {enforced or 'nothing'}: its pods could run as root, privileged or on host "
               "paths. Fix: pod-security.kubernetes.io/enforce: restricted")


# What a team's own Role must never grant: other Secrets, everything, a shell in a pod, or the power to grant itself more.
DANGEROUS_RESOURCES = {"secrets", "pods/exec", "pods/attach", "pods/portforward", "roles", "rolebindings", "serviceaccounts/token"}
DANGEROUS_VERBS = {"*", "escalate", "bind", "impersonate"}


@resource_rule("kubernetes", ["kubernetes:rbac.authorization.k8s.io/v1:Role"],
               "Team Roles grant no wildcard, no Secrets beyond named ones, no exec/attach, no RBAC and no escalation.")
def team_roles_least_privilege(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    if not _is_team_namespace((props.get("metadata") or {}).get("namespace")):
        return
    for rule in props.get("rules") or []:
        resources, verbs = set(rule.get("resources") or []), set(rule.get("verbs") or [])
        if "*" in resources or "*" in set(rule.get("apiGroups") or []):
            yield f"a team Role grants every resource ({rule}). Fix: list the resources the team needs"
        for resource in sorted(resources & DANGEROUS_RESOURCES):
            if resource == "secrets" and rule.get("resourceNames") and verbs <= {"get"}:
                continue  # reading named Secrets (the team's own sweep URL, MLflow credentials) is the intended grant
            yield f"a team Role grants {resource} ({sorted(verbs)}): a member could read others' credentials or act as another. Fix: remove it"
        for verb in sorted(verbs & DANGEROUS_VERBS):
            yield f"a team Role grants the verb {verb!r}. Fix: list the verbs the team needs"


@resource_rule("kubernetes", ["kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding", "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"],
               "Nobody is bound to cluster-admin or admin by the program (admins come through EKS access policies).")
def no_admin_bindings(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    role = (props.get("roleRef") or {}).get("name")
    if role in ("cluster-admin", "admin"):
        subjects = [s.get("name") for s in props.get("subjects") or []]
        yield f"binds {subjects} to {role}. Fix: an EKS access policy for admins, the team Role for members"


def _open_peers(peers: Any) -> bool:
    """A rule's from/to that lets everything in: absent or empty, every namespace, or the whole internet."""
    if not peers:
        return True
    for peer in peers:
        if peer.get("namespaceSelector") == {} and not peer.get("podSelector"):
            return True
        if (peer.get("ipBlock") or {}).get("cidr") in ("0.0.0.0/0", "::/0") and not (peer.get("ipBlock") or {}).get("except"):
            return True
    return False


@resource_rule("kubernetes", ["kubernetes:networking.k8s.io/v1:NetworkPolicy"],
               "Team NetworkPolicies open no ingress to every namespace, and no egress to the internet on every port.")
def team_network_policies_not_open(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    if not _is_team_namespace((props.get("metadata") or {}).get("namespace")):
        return
    spec = props.get("spec") or {}
    for rule in spec.get("ingress") or []:
        if _open_peers(rule.get("from")):
            yield "ingress from every namespace (or anywhere): another team's pods could reach this team's. Fix: name the namespaces"
    for rule in spec.get("egress") or []:
        if _open_peers(rule.get("to")) and not rule.get("ports"):
            yield "egress anywhere on every port. Fix: name the destinations, or the ports (e.g. 443)"


def _chart(props: Mapping[str, Any]) -> str:
    return str(props.get("chart") or "").rsplit("/", 1)[-1]


@resource_rule("kubernetes", HELM, "Kueue manages every job in team namespaces, queue label or not.")
def kueue_enforces_queues(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    if _chart(props) != "kueue":
        return
    import yaml
    raw = ((props.get("values") or {}).get("managerConfig") or {}).get("controllerManagerConfigYaml")
    try:
        configuration = yaml.safe_load(raw) if isinstance(raw, str) else None
    except yaml.YAMLError:
        configuration = None
    if not isinstance(configuration, Mapping) or configuration.get("manageJobsWithoutQueueName") is not True \
            or not configuration.get("managedJobsNamespaceSelector"):
        yield ("Kueue leaves jobs without a queue label alone: such a job runs outside every quota, fair share and budget hold. "
               "Fix: manageJobsWithoutQueueName: true with managedJobsNamespaceSelector over the team namespaces")


def _service_types(values: Any) -> Iterable[str]:
    """Every `service.type` (or `*.service.type`) a chart's values set, at any depth."""
    if isinstance(values, Mapping):
        service = values.get("service")
        if isinstance(service, Mapping) and service.get("type"):
            yield str(service["type"])
        for value in values.values():
            yield from _service_types(value)
    elif isinstance(values, list):
        for value in values:
            yield from _service_types(value)


@resource_rule("kubernetes", [*HELM, "kubernetes:core/v1:Service"],
               "No platform service (MLflow, Prometheus, Grafana...) is exposed outside the cluster by a LoadBalancer or NodePort.")
def services_stay_inside_the_cluster(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    types = [str((props.get("spec") or {}).get("type") or "ClusterIP")] if "spec" in props else list(_service_types(props.get("values")))
    for kind in types:
        if kind in ("LoadBalancer", "NodePort"):
            yield (f"a {kind} service makes {_chart(props) or (props.get('metadata') or {}).get('name')!r} reachable from outside "
                   "the cluster. Fix: ClusterIP; reach it through `kubectl port-forward` or the API server's service proxy")


def _team_directory(mount_name: str) -> str | None:
    """The team whose directory a Lustre fileset mount (`<mountname>/teams/<team>[/...]`) reaches, if any."""
    parts = str(mount_name).split("/")
    if contract.FSX_TEAMS_DIR in parts[1:-1]:
        return parts[parts.index(contract.FSX_TEAMS_DIR, 1) + 1]
    return None


@resource_rule("kubernetes", ["kubernetes:core/v1:PersistentVolume"],
               "An FSx volume bound into a team namespace mounts that team's own directory, or the datasets read-only; never the "
               "file system's root or another team's directory.")
def team_volumes_reach_only_their_team(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    spec = props.get("spec") or {}
    csi = spec.get("csi") or {}
    namespace = (spec.get("claimRef") or {}).get("namespace")
    if csi.get("driver") != "fsx.csi.aws.com" or not _is_team_namespace(namespace):
        return
    team = str(namespace).removeprefix(contract.TEAM_NAMESPACE_PREFIX)
    labelled = ((props.get("metadata") or {}).get("labels") or {}).get(TEAM_LABEL)
    if labelled and labelled != team:
        yield f"team {labelled!r}'s volume is bound to {namespace}. Fix: claimRef.namespace {contract.namespace_name(labelled)}"
    mount_name = str((csi.get("volumeAttributes") or {}).get("mountname") or "")
    owner = _team_directory(mount_name)
    read_only = csi.get("readOnly") is True and "ro" in (spec.get("mountOptions") or [])
    if owner is not None and owner != team:
        yield (f"{namespace} mounts team {owner!r}'s directory ({mount_name}): it could read and overwrite that team's checkpoints. "
               f"Fix: mount only {contract.FSX_TEAMS_DIR}/{team}")
    elif owner is None and "/" not in mount_name.strip("/"):
        yield (f"{namespace} mounts the file system's root ({mount_name or '?'}): every team's files. "
               f"Fix: mount only {contract.FSX_TEAMS_DIR}/{team}")
    elif owner is None and not read_only:
        yield (f"{namespace} mounts {mount_name} read-write outside its own directory: it could change the shared datasets. "
               "Fix: readOnly: true and the ro mount option, or its own directory")
