"""Where a job runs, decided once: node flavours, instance type, GPUs and EFA devices per node, node selection
and tolerations. Admission charges the quota of these flavours, rendering selects and tolerates exactly these
flavours' nodes, the local backend records and the ledger prices this instance type — no layer decides again.

The rule, with the stack at hand (what the cluster really has):
  - no GPUs                       -> system
  - spot                          -> gpu-spot
  - on-demand                     -> gpu-efa when the job spans nodes and an EFA node group offers its instance
                                     type (EFA only pays across nodes); else gpu-ondemand
  - spot-fallback                 -> gpu-spot, then gpu-ondemand: Kueue picks whichever the team's quota has room
                                     for. Never EFA: a pod's EFA request cannot depend on the flavour Kueue picks.
Candidates no node group of the stack can take are dropped; admission says why. A group takes the job when the
cluster-autoscaler's node template of the group (its first instance type, its tags: trainforge.nodes) would hold one
pod of it: the GPU model, GPUs per node, cpu and memory. Pods select the flavour and the GPU model
(`k8s.amazonaws.com/accelerator`), which every node of a group shares, never the instance type: a group may launch
any of its types, and the autoscaler sizes it by the first.
Without a stack (`trainforge render` as a preview) the catalogue stands in for the EFA groups: EFA whenever the
instance type has EFA interfaces. Cluster submission always decides with the stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainforge import catalog, contract, nodes
from trainforge.contract import Flavour
from trainforge.stackconfig import PlatformConfig
from trainforge.trainer.spec import JobSpec


@dataclass(frozen=True)
class Placement:
    flavours: tuple[Flavour, ...]  # in order of preference; more than one only for spot-fallback (Kueue chooses)
    instance: catalog.InstanceType | None
    nodes: int
    gpus_per_node: int
    efa_devices_per_node: int
    capacity: str
    region: str | None = None  # the stack's, when decided against one: where the job is priced

    @property
    def preferred(self) -> Flavour | None:
        return self.flavours[0] if self.flavours else None

    @property
    def instance_type(self) -> str | None:
        return self.instance.name if self.instance else None

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    def node_selector(self) -> dict[str, str]:
        """Labels every candidate flavour's nodes carry (a single flavour: all of its labels), and the GPU model."""
        label_sets = [contract.flavour_traits(f).labels.items() for f in self.flavours]
        selector = dict(set.intersection(*map(set, label_sets))) if label_sets else {}
        model = nodes.accelerator(self.instance) if self.instance is not None and self.gpus_per_node else None
        if model:
            selector[contract.LABEL_ACCELERATOR] = model
        return dict(sorted(selector.items()))

    def node_affinity(self) -> dict[str, Any] | None:
        """With several candidate flavours, the pod may land on any of them and no other (not, say, the EFA nodes)."""
        if len(self.flavours) < 2:
            return None
        term = {"matchExpressions": [{"key": contract.LABEL_FLAVOUR, "operator": "In", "values": [f.value for f in self.flavours]}]}
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}

    def tolerations(self) -> list[dict[str, str]]:
        taints = dict.fromkeys(t for f in self.flavours for t in contract.flavour_traits(f).taints)
        return [{"key": t.key, "operator": "Equal", "value": t.value, "effect": t.effect} for t in taints]

    def extended_resources(self) -> dict[str, int]:
        out = {}
        if self.gpus_per_node:
            out[contract.RESOURCE_GPU] = self.gpus_per_node
        if self.efa_devices_per_node:
            out[contract.RESOURCE_EFA] = self.efa_devices_per_node
        return out

    @property
    def termination_grace_s(self) -> int:
        """Spot nodes get the EC2 notice's two minutes for the emergency checkpoint and its upload."""
        return contract.SPOT_TERMINATION_GRACE_S if contract.Flavour.GPU_SPOT in self.flavours else contract.ON_DEMAND_TERMINATION_GRACE_S

    @property
    def training_runtime(self) -> str:
        """The ClusterTrainingRuntime of this grace class (Trainer 2.2.1 reads the grace period only from there)."""
        return contract.training_runtime_for(self.termination_grace_s)


def preferred_flavours(spec: JobSpec, platform: PlatformConfig | None) -> list[Flavour]:
    """The flavours the job may use, in order of preference, before asking which ones the stack offers."""
    if spec.resources.gpus() == 0:
        return [Flavour.CPU]
    if spec.capacity == "spot":
        return [Flavour.GPU_SPOT]
    if spec.capacity == "spot-fallback":
        return [Flavour.GPU_SPOT, Flavour.GPU_ONDEMAND]
    return [Flavour.GPU_EFA if _efa_pays_off(spec, platform) else Flavour.GPU_ONDEMAND]


def _efa_pays_off(spec: JobSpec, platform: PlatformConfig | None) -> bool:
    instance = spec.resources.instance()
    if instance is None or spec.workers.nodes < 2:
        return False
    if platform is None:
        return instance.supports_efa
    return not group_problems(spec, platform, Flavour.GPU_EFA)


def pod_shape(spec: JobSpec, where: Placement) -> nodes.PodShape:
    """One worker pod as the scheduler and the autoscaler match it against nodes."""
    requests = nodes.requests_of({"cpu": spec.resources.cpu, "memory": spec.resources.memory,
                                  contract.RESOURCE_EPHEMERAL_STORAGE: spec.resources.ephemeral_storage, **where.extended_resources()})
    affinity = where.node_affinity()
    pod = {"nodeSelector": where.node_selector(), "tolerations": where.tolerations(), **({"affinity": affinity} if affinity else {})}
    return nodes.PodShape.of_pod_spec(pod, requests)


def _single(spec: JobSpec, flavour: Flavour, platform: PlatformConfig | None) -> Placement:
    instance = spec.resources.instance()
    efa = catalog.efa_device_count(instance) if flavour is Flavour.GPU_EFA and instance is not None and instance.supports_efa else 0
    return Placement((flavour,), instance, spec.workers.nodes, spec.resources.gpus(), efa, spec.capacity,
                     platform.region if platform is not None else None)


def templates(platform: PlatformConfig, flavour: Flavour) -> list[nodes.NodeTemplate]:
    return [nodes.template(g) for g in platform.node_groups if g.flavour is flavour]


def group_problems(spec: JobSpec, platform: PlatformConfig, flavour: Flavour) -> list[str]:
    """Why no `flavour` node group would take a pod of the job (empty: one would)."""
    if flavour is Flavour.SYSTEM:
        return ["the system nodes run only the platform's services, never a team's job"]
    found = templates(platform, flavour)
    if not found and flavour is Flavour.CPU:
        return ["the stack has no node group for teams' CPU jobs (the system nodes run only the platform). "
                "Fix: ask the platform team for a CPU group with team_jobs: true, or request a GPU"]
    if not found:
        return [f"the stack has no {flavour.value} node group"]
    pod = pod_shape(spec, _single(spec, flavour, platform))
    reasons = {t.group: nodes.fit_problems(pod, t) for t in found}
    if any(not r for r in reasons.values()):
        return []
    return [f"node group {group} ({next(t.instance_type for t in found if t.group == group)}): {', '.join(r)}"
            for group, r in reasons.items()]


def decide(spec: JobSpec, platform: PlatformConfig | None = None) -> Placement:
    instance = spec.resources.instance()
    flavours = preferred_flavours(spec, platform)
    if platform is not None:
        flavours = [f for f in flavours if not group_problems(spec, platform, f)]
    efa = catalog.efa_device_count(instance) if flavours == [Flavour.GPU_EFA] and instance is not None else 0
    return Placement(tuple(flavours), instance, spec.workers.nodes, spec.resources.gpus(), efa, spec.capacity,
                     platform.region if platform is not None else None)
