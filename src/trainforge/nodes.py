"""A node as the scheduler and the cluster-autoscaler see it, decided once for every layer.

- `allocatable(instance)`: what an EKS AL2023 node of that type offers pods (capacity less the kubelet's reservations
  and eviction threshold, nodeadm's formula) and `usable(instance)`, less the platform's DaemonSets on a GPU node.
- `template(group)`: the autoscaler's picture of a node group it has no node of. The AWS provider builds it from the ASG:
  the **first** instance type of the group's mixed-instances policy sets capacity, and the ASG's
  `k8s.io/cluster-autoscaler/node-template/{label,taint,resources}/...` tags set labels, taints and extended resources
  (cluster-autoscaler/cloudprovider/aws/aws_manager.go, buildNodeFromTemplate; EKS copies neither the group's labels nor
  its taints to the ASG). `template_tags(group)` are the tags the AWS layer writes; `template_from(first type, tags)`
  reads them back the autoscaler's way, so a test can feed it what the engine really recorded.
- `scale_up_candidates(pod, templates)`: the groups whose template holds one pod of the job — the autoscaler scales
  nothing else up. A pod that fits no template stays Pending for ever.

Quantities are integers in base units: CPU in millicores, memory in bytes, extended resources in counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainforge import catalog, contract

if TYPE_CHECKING:
    from trainforge.stackconfig import NodeGroupConfig

AUTOSCALER = "k8s.io/cluster-autoscaler"
TEMPLATE_LABEL, TEMPLATE_TAINT, TEMPLATE_RESOURCE = (f"{AUTOSCALER}/node-template/{kind}/" for kind in ("label", "taint", "resources"))
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"  # set on every node by the kubelet, and on the autoscaler's templates

_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")


class BadQuantity(ValueError):
    pass


def quantity(resource: str, text: str | int | float) -> int:
    """A Kubernetes quantity in base units; CPU in millicores ("500m" -> 500, "4" -> 4000)."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise BadQuantity(f"{resource}: {text!r} is not a Kubernetes quantity (e.g. '4', '500m', '16Gi')")
    number, suffix = float(match.group(1)), match.group(2)
    if suffix == "m":
        value = number / 1000
    else:
        value = number * _SUFFIX.get(suffix or "", 1)
    return round(value * 1000) if resource == "cpu" else int(value)


def show(resource: str, amount: int) -> str:
    """The reverse of `quantity`, in the unit people read: "47.5" (CPUs), "180Gi", "8"."""
    if resource == "cpu":
        return f"{amount / 1000:g}"
    if resource in ("memory", contract.RESOURCE_EPHEMERAL_STORAGE):
        gib = amount / 2**30
        return f"{gib:.4g}Gi" if gib < 10_000 else f"{gib / 1024:.4g}Ti"
    return str(amount)


def requests_of(resources: dict[str, Any]) -> dict[str, int]:
    return {name: quantity(name, value) for name, value in resources.items()}


# ---- what a node offers -----------------------------------------------------------------------------------------

# The kubelet's hard eviction threshold on EKS AMIs (memory.available<100Mi).
EVICTION_HARD_MEMORY = 100 * 2**20


def max_pods(instance: catalog.InstanceType) -> int:
    """nodeadm caps max pods at 110 below 30 vCPUs and 250 from there; the VPC CNI's ENI limit may be lower, which
    only lowers the memory reserved, so this bound makes `allocatable` a floor."""
    return 110 if instance.vcpus < 30 else 250


def kube_reserved_cpu_m(vcpus: int) -> int:
    """EKS: 6% of the first core, 1% of the second, 0.5% of the next two, 0.25% of every core above four."""
    cores = [(1, 60), (1, 10), (2, 5), (max(vcpus - 4, 0), 2.5)]
    reserved, left = 0.0, vcpus
    for count, millis in cores:
        used = min(count, left)
        reserved += used * millis
        left -= used
    return int(reserved + 0.999)


def kube_reserved_memory(instance: catalog.InstanceType) -> int:
    """EKS: 255 MiB plus 11 MiB per pod the node may hold."""
    return (255 + 11 * max_pods(instance)) * 2**20


def allocatable(instance: catalog.InstanceType) -> dict[str, int]:
    """What the node reports as allocatable: CPU and memory after reservations, GPUs, EFA devices on EFA types."""
    if not instance.vcpus:
        raise catalog.UnknownInstanceType(f"{instance.name}: the catalogue has no size for it (CPU types are not sized)")
    out = {"cpu": instance.vcpus * 1000 - kube_reserved_cpu_m(instance.vcpus),
           "memory": instance.memory_gib * 2**30 - kube_reserved_memory(instance) - EVICTION_HARD_MEMORY, "pods": max_pods(instance)}
    if instance.gpus:
        out[contract.RESOURCE_GPU] = instance.gpus
    return out


# Requests of the DaemonSets on every GPU node, held back from what a training pod may ask for. Two parts:
# - EKS's add-ons, which no chart of ours renders (aws-node 25m, kube-proxy 100m, ebs-csi-node and fsx-csi-node ~30m and
#   ~60Mi each, eks-pod-identity-agent, eks-node-monitoring-agent): an allowance;
# - the platform's charts (NVIDIA device plugin, DCGM exporter, node exporter, EFA device plugin on EFA nodes):
#   tests/test_quotas.py renders them through the real charts and checks they fit in PLATFORM_DAEMONSETS.
EKS_ADDON_DAEMONSETS = {"cpu": 300, "memory": 512 * 2**20, "pods": 6}
PLATFORM_DAEMONSETS = {"cpu": 200, "memory": 512 * 2**20, "pods": 6}
GPU_NODE_DAEMONSETS = {r: EKS_ADDON_DAEMONSETS[r] + PLATFORM_DAEMONSETS[r] for r in EKS_ADDON_DAEMONSETS}


def usable(instance: catalog.InstanceType) -> dict[str, int]:
    """What a training pod can have on a node: allocatable less the DaemonSets every GPU node runs (a CPU node runs
    fewer: a floor there)."""
    out = allocatable(instance)
    for resource, amount in GPU_NODE_DAEMONSETS.items():
        out[resource] -= amount
    return out


# ---- the autoscaler's node template ------------------------------------------------------------------------------

def accelerator(instance: catalog.InstanceType) -> str | None:
    """The autoscaler's GPU label value on nodes of this type (AWS provider: GPULabel k8s.amazonaws.com/accelerator)."""
    return contract.accelerator_label(instance.gpu_model) if instance.gpus else None


def node_labels(group: NodeGroupConfig) -> dict[str, str]:
    """Labels every node of the group carries: its flavour's, its name, and the GPU model of a GPU group (the same on
    every type of the group, which is what jobs select: the instance type is not)."""
    labels = {**contract.flavour_traits(group.flavour).labels, contract.LABEL_NODE_GROUP: group.name}
    model = accelerator(group.instances[0])
    if model:
        labels[contract.LABEL_ACCELERATOR] = model
    return labels


def template_tags(group: NodeGroupConfig) -> dict[str, str]:
    """The ASG tags from which the autoscaler builds a node of this group while it has none: labels, taints, extended
    resources. Without them a pod that needs `nvidia.com/gpu` never makes a GPU group scale up from zero."""
    tags = {TEMPLATE_LABEL + k: v for k, v in node_labels(group).items()}
    tags |= {TEMPLATE_TAINT + t.key: f"{t.value}:{t.effect}" for t in contract.flavour_traits(group.flavour).taints}
    if group.has_gpus:
        tags[TEMPLATE_RESOURCE + contract.RESOURCE_GPU] = str(group.gpus_per_node)
    if group.efa:
        tags[TEMPLATE_RESOURCE + contract.RESOURCE_EFA] = str(catalog.efa_device_count(group.instances[0]))
    tags[TEMPLATE_RESOURCE + contract.RESOURCE_EPHEMERAL_STORAGE] = f"{ephemeral_allocatable_gib(group.disk_gib)}Gi"
    return tags


def ephemeral_allocatable_gib(disk_gib: int) -> int:
    """Scratch disk the scheduler may hand out on a node of `disk_gib` root disk: less the kubelet's hard eviction
    threshold (nodefs.available<10%) and its ephemeral-storage reservation (1 GiB) on EKS AMIs. Images share the disk
    but not allocatable: the kubelet evicts by real use."""
    return int(disk_gib * 0.9) - 1


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class NodeTemplate:
    group: str
    instance_type: str
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    allocatable: dict[str, int]


def template_from(group: str, first_type: str, tags: dict[str, str]) -> NodeTemplate:
    """The node the autoscaler imagines for an ASG: the first type's capacity (less the DaemonSets it simulates on it),
    the labels, taints and resources its tags name."""
    instance = catalog.lookup(first_type)
    # The generic labels the AWS provider puts on every template (buildGenericLabels; the AMIs are x86_64 Linux).
    generic = {INSTANCE_TYPE_LABEL: first_type, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    labels = {**generic, **{k.removeprefix(TEMPLATE_LABEL): v for k, v in tags.items() if k.startswith(TEMPLATE_LABEL)}}
    taints = tuple(Taint(k.removeprefix(TEMPLATE_TAINT), *v.rsplit(":", 1)) for k, v in sorted(tags.items()) if k.startswith(TEMPLATE_TAINT))
    resources = usable(instance) if instance.vcpus else {}
    resources |= {name: quantity(name, v) for k, v in tags.items() if k.startswith(TEMPLATE_RESOURCE)
                  for name in (k.removeprefix(TEMPLATE_RESOURCE),)}
    return NodeTemplate(group, first_type, labels, taints, resources)


def template(group: NodeGroupConfig) -> NodeTemplate:
    return template_from(group.name, group.instance_types[0], template_tags(group))


# ---- does a pod fit a node ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PodShape:
    """One pod of a job as the scheduler matches it against nodes (and Kueue against flavours)."""

    requests: dict[str, int]
    node_selector: dict[str, str] = field(default_factory=dict)
    # Required node affinity: OR of terms, each an AND of (key, operator, values).
    affinity_terms: tuple[tuple[tuple[str, str, tuple[str, ...]], ...], ...] = ()
    tolerations: tuple[dict[str, Any], ...] = ()

    @classmethod
    def of_pod_spec(cls, pod: dict[str, Any], requests: dict[str, int]) -> PodShape:
        required = (((pod.get("affinity") or {}).get("nodeAffinity") or {})
                    .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
        terms = tuple(tuple((e["key"], e["operator"], tuple(e.get("values") or ())) for e in term.get("matchExpressions") or [])
                      for term in required)
        return cls(requests, dict(pod.get("nodeSelector") or {}), terms, tuple(pod.get("tolerations") or ()))

    def tolerates(self, taint: Taint) -> bool:
        for t in self.tolerations:
            if t.get("effect") not in (None, "", taint.effect):
                continue
            if t.get("operator") == "Exists" and t.get("key") in (None, "", taint.key):
                return True
            if t.get("key") == taint.key and t.get("value", "") == taint.value:
                return True
        return False

    def label_problems(self, labels: dict[str, str], only_keys: set[str] | None = None) -> list[str]:
        """Why nodes with `labels` cannot take the pod (nodeSelector, required affinity); `only_keys`: judge only those
        keys (Kueue compares a pod with a flavour on the flavour's label keys alone)."""
        def judged(key: str) -> bool:
            return only_keys is None or key in only_keys
        out = [f"nodeSelector {k}={v} (node: {labels.get(k, 'unset')})" for k, v in sorted(self.node_selector.items())
               if judged(k) and labels.get(k) != v]

        def holds(key: str, op: str, values: tuple[str, ...]) -> bool:
            if not judged(key):
                return True
            if op == "In":
                return labels.get(key) in values
            if op == "NotIn":
                return labels.get(key) not in values
            if op == "Exists":
                return key in labels
            if op == "DoesNotExist":
                return key not in labels
            return True
        if self.affinity_terms and not any(all(holds(*e) for e in term) for term in self.affinity_terms):
            out.append("required node affinity " + " or ".join(
                " and ".join(f"{k} {op} {list(v)}" for k, op, v in term) for term in self.affinity_terms))
        return out


def fit_problems(pod: PodShape, node: NodeTemplate) -> list[str]:
    """Why the scheduler would not put `pod` on a node like `node` (empty: it would)."""
    out = pod.label_problems(node.labels)
    out += [f"taint {t.key}={t.value}:{t.effect} not tolerated" for t in node.taints
            if t.effect in ("NoSchedule", "NoExecute") and not pod.tolerates(t)]
    for resource, amount in sorted(pod.requests.items()):
        have = node.allocatable.get(resource, 0)
        if amount > have:
            out.append(f"{resource} {show(resource, amount)} requested, {show(resource, have)} allocatable on {node.instance_type}")
    return out


def scale_up_candidates(pod: PodShape, templates: list[NodeTemplate]) -> list[NodeTemplate]:
    """The groups the autoscaler may grow for this pod: those whose template node would take it."""
    return [t for t in templates if not fit_problems(pod, t)]
