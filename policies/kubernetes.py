"""Kubernetes rules: what runs privileged, what is pinned, how team namespaces are marked. (The objects tenancy
creates are checked as they land: these rules are written against the resource types.)"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Iterable, Mapping

from trainforge import contract
from trainforge.policies.registry import Context, resource_rule

EXACT_VERSION = re.compile(r"^v?\d+\.\d+\.\d+$")
HELM = ("kubernetes:helm.sh/v3:Release", "kubernetes:helm.sh/v4:Chart")
# Kinds that carry pod templates (anything whose spec holds `containers` is inspected, at any depth).
WORKLOADS = ("kubernetes:core/v1:Pod", "kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:DaemonSet", "kubernetes:apps/v1:StatefulSet",
             "kubernetes:batch/v1:Job", "kubernetes:batch/v1:CronJob", contract.pulumi_type(contract.TRAINER_API, "ClusterTrainingRuntime"),
             contract.pulumi_type(contract.TRAINER_API, "TrainingRuntime"), contract.pulumi_type(contract.TRAINER_API, "TrainJob"),
             contract.pulumi_type(contract.PYTORCHJOB_API, "PyTorchJob"), "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet")
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


def _is_list(value: Any) -> bool:
    """A list, or the policy SDK's proxy of one (a Sequence, not a list) under `pulumi preview`/`up`."""
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def pod_specs(node: Any) -> Iterable[Mapping[str, Any]]:
    if isinstance(node, Mapping):
        if _is_list(node.get("containers")):
            yield node
        for value in node.values():
            yield from pod_specs(value)
    elif _is_list(node):
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
        for peer in rule.get("to") or []:
            block = peer.get("ipBlock") or {}
            if block.get("cidr") == "0.0.0.0/0" and not _excepts_the_cluster(block.get("except") or []):
                yield ("egress to 0.0.0.0/0 without the cluster's ranges excepted: a team pod reaches every platform service "
                       f"(Prometheus, Alertmanager, the database) on its ports. Fix: except the VPC CIDR and {list(contract.EKS_DEFAULT_SERVICE_CIDRS)}")


def _excepts_the_cluster(excepted: list[Any]) -> bool:
    """The except list covers both Service ranges EKS may pick and a private range (the VPC's). IPv4: the cluster's."""
    import ipaddress
    networks = []
    for entry in excepted:
        try:
            networks.append(ipaddress.IPv4Network(str(entry)))
        except ValueError:
            continue  # an IPv6 range excepts nothing of the cluster's
    private = [ipaddress.IPv4Network(r) for r in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10")]
    services = [ipaddress.IPv4Network(c) for c in contract.EKS_DEFAULT_SERVICE_CIDRS]
    covers_services = all(any(s.subnet_of(n) for n in networks) for s in services)
    vpc_like = [n for n in networks if any(n.subnet_of(p) for p in private) and not any(n.subnet_of(s) for s in services)]
    return covers_services and bool(vpc_like)


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


# ---- isolation regressions the pack catches (issue 37, item 8) -------------------------------------------------

_SECRET_SIG = "4dabf18193072939515e22adb298388d"  # how the engine hands a secret value to an analyzer


def plain(value: Any) -> Any:
    """`value` with the engine's secret wrappers removed, at any depth (a release whose values hold a secret arrives
    wrapped as a whole)."""
    if isinstance(value, Mapping):
        if _SECRET_SIG in value:
            return plain(value.get("value"))
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


@resource_rule("kubernetes", HELM, "MLflow runs trainforge's auth app with no permission by default: each team sees only what "
                                   "it made, and the team boundary basic-auth alone does not draw holds.")
def mlflow_enforces_team_boundaries(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    if _chart(props) != "mlflow":
        return
    auth = (plain(props.get("values")) or {}).get("auth") or {}
    if auth.get("enabled") is not True:
        yield "MLflow without authentication: anyone in the cluster reads and deletes every team's runs. Fix: auth.enabled: true"
        return
    if auth.get("appName") != contract.MLFLOW_AUTH_APP:
        yield (f"MLflow's auth app is {auth.get('appName')!r}: basic-auth alone lets a team read another's artifacts through a "
               f"model version and squat its experiment names. Fix: auth.appName: {contract.MLFLOW_AUTH_APP}")
    if auth.get("defaultPermission") != "NO_PERMISSIONS":
        yield (f"MLflow's default permission is {auth.get('defaultPermission')!r}: every team would read every other team's "
               "experiments. Fix: auth.defaultPermission: NO_PERMISSIONS")


def _positive(number: Any) -> bool:
    """A limit that is set: the engine hands numbers over as floats."""
    return isinstance(number, (int, float)) and not isinstance(number, bool) and number > 0


def _values_of(props: Mapping[str, Any], chart: str) -> Mapping[str, Any] | None:
    return (plain(props.get("values")) or {}) if _chart(props) == chart else None


@resource_rule("kubernetes", HELM, "Scraped labels never win and scrapes are bounded: Prometheus enforces sample and label limits "
                                   "on every target, and dcgm-exporter copies no pod label but the job's onto GPU series.")
def scrapes_bounded_and_unforgeable(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    if (values := _values_of(props, contract.PROMETHEUS_RELEASE)) is not None:
        spec = ((values.get("prometheus") or {}).get("prometheusSpec") or {})
        for key in ("enforcedSampleLimit", "enforcedLabelLimit", "enforcedLabelValueLengthLimit"):
            if not _positive(spec.get(key)):
                yield (f"prometheusSpec.{key} is unset: one target (any pod's metrics, a GPU exporter copying pod labels) can "
                       "fill Prometheus and stop the budget controller's reads. Fix: set it (platform/manifests/monitoring.py)")
    if (values := _values_of(props, "dcgm-exporter")) is not None:
        monitor, k8s = values.get("serviceMonitor") or {}, values.get("kubernetes") or {}
        if monitor.get("honorLabels") is not False:
            yield "dcgm-exporter's scrape honours scraped labels: a GPU series could claim another namespace. Fix: honorLabels: false"
        if k8s.get("enablePodLabels") and not k8s.get("podLabelAllowlistRegex"):
            yield ("dcgm-exporter copies every pod label onto GPU series (unbounded, and set by any member). Fix: "
                   "kubernetes.podLabelAllowlistRegex naming the labels it may copy")


@resource_rule("kubernetes", ["kubernetes:monitoring.coreos.com/v1:PodMonitor"],
               "The trainer PodMonitor (every team's pods) honours no scraped label and bounds what one pod may send.")
def trainer_scrape_unforgeable(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    spec = props.get("spec") or {}
    if (props.get("metadata") or {}).get("name") != contract.TRAINER_PODMONITOR:
        return
    if any(e.get("honorLabels") is not False for e in spec.get("podMetricsEndpoints") or []):
        yield "the trainer scrape honours a pod's own labels: a team could publish series as another team. Fix: honorLabels: false"
    for key in ("sampleLimit", "labelLimit"):
        if not _positive(spec.get(key)):
            yield f"the trainer scrape has no {key}: one pod can flood Prometheus. Fix: {key} (monitoring.TRAINER_SCRAPE_LIMITS)"


# The admission policies' names, and what each must still check (a fingerprint of each rule, so a dropped or opened
# one is caught without this layer importing the platform's builders).
TEAM_POLICIES = ("trainforge-team-pods", "trainforge-team-jobs")
POD_RULE_MARKS = {"the team's uid": ("runAsUser", "params.data.uid"), "the team's gid": ("runAsGroup", "params.data.gid"),
                  "only the team's volumes": ("object.spec.volumes", "persistentVolumeClaim"),
                  "tenant nodes only": ("nodeSelector", "!has(object.spec.nodeName)"),
                  "resources that count": ("c.resources.limits", "matches("),
                  "images from the platform's registries": ("c.image.startsWith(params.data[k])",),
                  "only the groups the pod names": ("supplementalGroupsPolicy",),
                  "the sweep controller's label only on its ServiceAccount": (contract.SWEEP_ROLE_LABEL, "object.spec.serviceAccountName")}
JOB_RULE_MARKS = {"the team's own queue": ("params.data.queue",), "the team's priorities": (contract.KUEUE_PRIORITY_LABEL, f"'{contract.SETTING_PRIORITY_PREFIX}'")}
OPEN_VOLUME_KINDS = ("hostPath", "nfs", "csi", "ephemeral", "iscsi", "rbd", "cephfs", "glusterfs")


@resource_rule("kubernetes", ["kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy",
                              "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"],
               "The team admission policies keep every rule (uid, gid, volumes, placement, resources, images, queue) and deny.")
def team_admission_policies_complete(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    spec = props.get("spec") or {}
    name = (props.get("metadata") or {}).get("name")
    if props.get("kind") == "ValidatingAdmissionPolicyBinding" or "validationActions" in spec:
        actions = [str(a) for a in spec.get("validationActions") or []]
        if spec.get("policyName") in TEAM_POLICIES and actions != ["Deny"]:
            yield (f"binding {name} only {actions}s: a team's pod or job that breaks the policy is admitted. "
                   "Fix: validationActions: [Deny]")
        return
    if name not in TEAM_POLICIES:
        return
    expressions = [str(v.get("expression") or "") for v in spec.get("validations") or []]
    marks = POD_RULE_MARKS if name == TEAM_POLICIES[0] else JOB_RULE_MARKS
    for what, needles in marks.items():
        if not any(all(n in e for n in needles) for e in expressions):
            yield f"policy {name} no longer checks {what}. Fix: restore its rule (platform/manifests/guardrails.py)"
    if name == TEAM_POLICIES[0]:
        volume_rules = [e for e in expressions if "object.spec.volumes" in e]
        for kind in OPEN_VOLUME_KINDS:
            if any(f"has(v.{kind})" in e for e in volume_rules):
                yield f"policy {name} admits {kind} volumes: a pod could mount the node or another team's storage. Fix: remove it"


@resource_rule("kubernetes", ["kubernetes:core/v1:ConfigMap"], "A team's settings name the team's own POSIX identity, never root.")
def team_settings_name_the_teams_identity(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    meta = props.get("metadata") or {}
    namespace = meta.get("namespace")
    if meta.get("name") != contract.TEAM_SETTINGS_CONFIG_MAP or not _is_team_namespace(namespace):
        return
    team = str(namespace).removeprefix(contract.TEAM_NAMESPACE_PREFIX)
    expected = str(contract.team_posix_id(team))
    data = props.get("data") or {}
    for key in ("uid", "gid"):
        if str(data.get(key)) != expected:
            yield (f"{namespace}'s {key} is {data.get(key)!r}, not the team's {expected}: its pods would run as that identity "
                   "(root, or another team's files). Fix: the program's value (contract.team_posix_id)")


@resource_rule("kubernetes", ["kubernetes:batch/v1:Job"], "A team's FSx directory is made for the team alone (mode 0770).")
def team_directories_private(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    meta = props.get("metadata") or {}
    if meta.get("namespace") != contract.NAMESPACE_SYSTEM or not str(meta.get("name") or "").startswith("fsx-dir-"):
        return
    script = " ".join(str(part) for spec in pod_specs(props) for c in spec.get("containers") or [] for part in c.get("command") or [])
    modes = re.findall(r"chmod\s+(?:-R\s+)?([0-7]{3,4})", script)
    if not modes or any(int(m, 8) & 0o007 for m in modes):
        yield f"the FSx directory Job sets mode {modes or 'nothing'}: other teams' identities could read it. Fix: chmod 0770"
