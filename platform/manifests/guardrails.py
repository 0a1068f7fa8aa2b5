"""What a team may run, enforced by the API server: ValidatingAdmissionPolicies over every team namespace.

RBAC decides which objects a member may create; these decide what those objects may say, for the objects members
create (TrainJobs, PyTorchJobs) and for the pods the operators create from them:
- `trainforge-team-jobs`: a job names its own team's LocalQueue (Kueue also suspends a queue-less job in a team
  namespace, `manageJobsWithoutQueueName`; this refuses it outright, with the fix) and a priority class the platform
  defines.
- `trainforge-team-pods`: a pod runs as its team's POSIX identity (the owner of its FSx directory) and never as root,
  mounts only its namespace's FSx claims and the kinds of volume a job needs (no CSI inline, hostPath, NFS, other
  claims), and can land only on tenant nodes: its nodeSelector names a tenant flavour (`cpu` or a GPU flavour; Kueue
  writes the admitted flavour's labels there), or every term of its required node affinity confines it to tenant
  flavours; it never names a node (`spec.nodeName` skips the scheduler). The system nodes run MLflow with the
  database's credentials, the budget controller (which may patch every ClusterQueue), Kueue and Prometheus: a team's
  pod there could read their memory through the node or starve them. The other way round, every tenant node is
  tainted (contract.flavour_traits) and every platform pod selects the system nodes, so nothing of the platform's
  lands beside a team's pod (tests/test_day_two.py fits each against each node group).

The team's facts come from its settings ConfigMap (`paramRef` without a namespace: the admitted object's own
namespace), which members can read but not write. No ConfigMap, no admission (`parameterNotFoundAction: Deny`).
"""

from __future__ import annotations

from typing import Any

from trainforge import contract

API = "admissionregistration.k8s.io/v1"
JOBS_POLICY = "trainforge-team-jobs"
PODS_POLICY = "trainforge-team-pods"
# Keys of the team's settings ConfigMap the policies read.
PARAM_UID, PARAM_GID, PARAM_QUEUE = "uid", "gid", "queue"
# Volumes a training pod may use besides its FSx claims: scratch, config and the service account's projected token.
ALLOWED_VOLUME_KINDS = ("emptyDir", "configMap", "secret", "projected", "downwardAPI")
ALLOWED_CLAIMS = (contract.FSX_CLAIM_NAME, contract.FSX_DATASETS_CLAIM_NAME)
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def team_namespaces() -> dict[str, Any]:
    return {"matchExpressions": [{"key": contract.LABEL_TEAM, "operator": "Exists"}]}


def _quoted(values: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _label(key: str) -> str:
    return f"object.metadata.labels['{key}']"


def _has_label(key: str) -> str:
    return f"has(object.metadata.labels) && '{key}' in object.metadata.labels"


def job_validations(priority_classes: list[str]) -> list[dict[str, str]]:
    queue, priority = contract.KUEUE_QUEUE_LABEL, contract.KUEUE_PRIORITY_LABEL
    return [
        {"expression": f"{_has_label(queue)} && {_label(queue)} == params.data.{PARAM_QUEUE}",
         "message": f"a job in a team namespace must carry the label {queue} naming the team's own LocalQueue (quota, "
                    "fair sharing and the budget hold apply through it). Fix: submit with `trainforge submit`, or set "
                    f"the label to the `{PARAM_QUEUE}` value of ConfigMap {contract.TEAM_SETTINGS_CONFIG_MAP}",
         "reason": "Forbidden"},
        {"expression": f"!({_has_label(priority)}) || ({_label(priority)} in {_quoted(priority_classes)} && params.data.exists(k, "
                       f"k.startsWith('{contract.SETTING_PRIORITY_PREFIX}') && params.data[k] == {_label(priority)}))",
         "message": f"{priority} must be one of the team's priorities (the `{contract.SETTING_PRIORITY_PREFIX}<priority>` values of "
                    f"ConfigMap {contract.TEAM_SETTINGS_CONFIG_MAP}; all of them: {', '.join(priority_classes)}). Fix: use the job "
                    "spec's `priority`; the platform team grants a team more in its stack config (teams[].priorities)",
         "reason": "Forbidden"},
    ]


def _every_container(condition: str) -> str:
    """`condition` (over `c`) for every container, init and ephemeral container of the pod."""
    return " && ".join(f"(!has(object.spec.{field}) || object.spec.{field}.all(c, {condition}))" for field in CONTAINER_LISTS)


def _identity(field: str, param: str) -> str:
    """The pod sets `field` to the team's id, and no container overrides it with another."""
    pod = "object.spec.securityContext"
    return (f"has({pod}) && has({pod}.{field}) && {pod}.{field} == int(params.data.{param}) && "
            + _every_container(f"!has(c.securityContext) || !has(c.securityContext.{field}) || "
                               f"c.securityContext.{field} == int(params.data.{param})"))


def allowed_images() -> str:
    """CEL: every container's image starts with one of the team settings' `image-prefix-<n>` values."""
    prefix = contract.SETTING_IMAGE_PREFIX
    return _every_container(f"params.data.exists(k, k.startsWith('{prefix}') && c.image.startsWith(params.data[k]))")


def controller_role_only_as_controller() -> str:
    """The team's NetworkPolicy opens the API server to pods by a label (a policy cannot select a ServiceAccount): the
    label is allowed only on pods that run as the sweep controller's ServiceAccount, whose Role is a member's own. So no
    pod with another identity (the training ServiceAccount and its IRSA role) gets the API server's address."""
    label = contract.SWEEP_ROLE_LABEL
    return (f"!({_has_label(label)} && {_label(label)} == '{contract.SWEEP_CONTROLLER_ROLE}') || "
            f"(has(object.spec.serviceAccountName) && object.spec.serviceAccountName == '{contract.SWEEP_CONTROLLER_SERVICE_ACCOUNT}')")


def tenant_placement() -> str:
    """CEL: the pod can be scheduled only onto nodes of a tenant flavour, whatever else it says."""
    key, tenant = contract.LABEL_FLAVOUR, _quoted([f.value for f in contract.TENANT_FLAVOURS])
    selector = f"has(object.spec.nodeSelector) && '{key}' in object.spec.nodeSelector && object.spec.nodeSelector['{key}'] in {tenant}"
    required = "object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    affinity = (f"has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && has({required}) && "
                f"{required}.nodeSelectorTerms.size() > 0 && {required}.nodeSelectorTerms.all(t, has(t.matchExpressions) && "
                f"t.matchExpressions.exists(e, e.key == '{key}' && e.operator == 'In' && e.values.all(v, v in {tenant})))")
    return f"!has(object.spec.nodeName) && (({selector}) || ({affinity}))"


# A quantity that is zero however it is written ("0", "0.0", "0m", "0Gi", "0e3"): zero requests count as nothing for
# the ResourceQuota and Kueue, and a zero limit is no limit at all.
_ZERO_QUANTITY = r"^[+]?0*([.]0*)?([eE][+-]?[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"


def counted_resources() -> str:
    """CEL: every container and init container limits cpu, memory and scratch disk to something, and requests nothing
    as zero."""
    def nonzero(where: str, resource: str) -> str:
        return f"!string(c.resources.{where}['{resource}']).matches('{_ZERO_QUANTITY}')"
    counted = ("cpu", "memory", contract.RESOURCE_EPHEMERAL_STORAGE)
    limits = " && ".join(f"'{r}' in c.resources.limits && {nonzero('limits', r)}" for r in counted)
    requests = " && ".join(f"(!('{r}' in c.resources.requests) || {nonzero('requests', r)})" for r in counted)
    condition = f"has(c.resources) && has(c.resources.limits) && {limits} && (!has(c.resources.requests) || ({requests}))"
    return " && ".join(f"(!has(object.spec.{field}) || object.spec.{field}.all(c, {condition}))" for field in ("containers", "initContainers"))


def pod_validations() -> list[dict[str, str]]:
    pod = "object.spec.securityContext"
    volume_ok = " || ".join([f"has(v.{kind})" for kind in ALLOWED_VOLUME_KINDS]
                            + [f"(has(v.persistentVolumeClaim) && v.persistentVolumeClaim.claimName in {_quoted(ALLOWED_CLAIMS)})"])
    return [
        {"expression": _identity("runAsUser", PARAM_UID),
         "message": "pods in a team namespace run as the team's uid (the owner of its FSx directory), set in the pod's "
                    f"securityContext and not overridden by a container. Fix: submit with `trainforge submit`; the uid is "
                    f"the `{PARAM_UID}` value of ConfigMap {contract.TEAM_SETTINGS_CONFIG_MAP}"},
        {"expression": _identity("runAsGroup", PARAM_GID),
         "message": f"pods in a team namespace run with the team's gid (the `{PARAM_GID}` value of ConfigMap "
                    f"{contract.TEAM_SETTINGS_CONFIG_MAP}). Fix: submit with `trainforge submit`"},
        {"expression": f"!has({pod}) || ((!has({pod}.fsGroup) || {pod}.fsGroup == int(params.data.{PARAM_GID})) && "
                       f"(!has({pod}.supplementalGroups) || {pod}.supplementalGroups.all(g, g == int(params.data.{PARAM_GID}))))",
         "message": "a team's pod may join no group but its team's (fsGroup, supplementalGroups)"},
        {"expression": f"has({pod}) && has({pod}.supplementalGroupsPolicy) && {pod}.supplementalGroupsPolicy == "
                       f"'{contract.SUPPLEMENTAL_GROUPS_POLICY}'",
         "message": f"a team's pod sets securityContext.supplementalGroupsPolicy: {contract.SUPPLEMENTAL_GROUPS_POLICY}, so its "
                    "image's /etc/group cannot add another team's group to it. Fix: submit with `trainforge submit`, or set it"},
        {"expression": f"!has(object.spec.volumes) || object.spec.volumes.all(v, {volume_ok})",
         "message": f"a team's pod may mount only its namespace's FSx claims ({', '.join(ALLOWED_CLAIMS)}) and "
                    f"{', '.join(ALLOWED_VOLUME_KINDS)} volumes"},
        {"expression": counted_resources(),
         "message": "every container of a team's pod limits cpu, memory and ephemeral-storage to more than zero, and requests "
                    "none of them as zero: zero counts as nothing against the team's quota, and a zero limit is none. Fix: "
                    "submit with `trainforge submit` (resources.cpu, .memory and .ephemeral_storage are the requests and "
                    "the limits)"},
        {"expression": allowed_images(),
         "message": "a team's pod runs only images from the platform's registries: the stack's ECR registry, the deployed "
                    "runtime image's repository and kubernetes.image_registries (the "
                    f"`{contract.SETTING_IMAGE_PREFIX}<n>` values of ConfigMap {contract.TEAM_SETTINGS_CONFIG_MAP}). Fix: push "
                    "the image to the account's ECR, or ask the platform team to add its registry"},
        {"expression": controller_role_only_as_controller(),
         "message": f"only a sweep controller's pod carries {contract.SWEEP_ROLE_LABEL}={contract.SWEEP_CONTROLLER_ROLE} (the label opens "
                    f"the API server to it), and it runs as ServiceAccount {contract.SWEEP_CONTROLLER_SERVICE_ACCOUNT}. Fix: drop the "
                    "label, or start the sweep with `trainforge sweep --cluster`"},
        {"expression": tenant_placement(),
         "message": f"a team's pod runs only on tenant nodes ({', '.join(f.value for f in contract.TENANT_FLAVOURS)}), never on the "
                    f"system nodes that run the platform, and names no node. Fix: submit with `trainforge submit` (Kueue sets "
                    f"the {contract.LABEL_FLAVOUR} nodeSelector); a CPU-only job needs the stack's team_jobs CPU group"},
    ]


def policy(name: str, rules: list[dict[str, Any]], validations: list[dict[str, str]]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name},
            "spec": {"failurePolicy": "Fail", "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
                     "matchConstraints": {"resourceRules": rules, "namespaceSelector": team_namespaces()},
                     "validations": validations}}


def binding(name: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"],
                     "paramRef": {"name": contract.TEAM_SETTINGS_CONFIG_MAP, "parameterNotFoundAction": "Deny"},
                     "matchResources": {"namespaceSelector": team_namespaces()}}}


def objects(priority_classes: list[str]) -> list[dict[str, Any]]:
    jobs = [{"apiGroups": [contract.api_group(contract.TRAINER_API)], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["trainjobs"]},
            {"apiGroups": [contract.api_group(contract.PYTORCHJOB_API)], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["pytorchjobs"]}]
    pods = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
    return [policy(JOBS_POLICY, jobs, job_validations(priority_classes)), binding(JOBS_POLICY),
            policy(PODS_POLICY, pods, pod_validations()), binding(PODS_POLICY)]
