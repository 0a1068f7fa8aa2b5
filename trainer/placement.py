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
Candidates no node group of the stack offers (for the instance type) are dropped; admission says why.
Without a stack (`trainforge render` as a preview) the catalogue stands in for the EFA groups: EFA whenever the
instance type has EFA interfaces. Cluster submission always decides with the stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainforge import catalog, contract
from trainforge.contract import Flavour
from trainforge.stackconfig import PlatformConfig
from trainforge.trainer.spec import JobSpec

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"  # set on every node by the kubelet


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
        """Labels every candidate flavour's nodes carry (a single flavour: all of its labels), and the instance type."""
        label_sets = [contract.flavour_traits(f).labels.items() for f in self.flavours]
        selector = dict(set.intersection(*map(set, label_sets))) if label_sets else {}
        if self.instance is not None:
            selector[INSTANCE_TYPE_LABEL] = self.instance.name
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
        return [Flavour.SYSTEM]
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
    return any(g.efa and instance.name in g.instance_types for g in platform.node_groups)


def offers(platform: PlatformConfig, flavour: Flavour, instance_type: str | None) -> bool:
    """Whether some node group of the stack has this flavour (and, if given, this instance type)."""
    groups = [g for g in platform.node_groups if g.flavour is flavour]
    return bool(groups) and (instance_type is None or any(instance_type in g.instance_types for g in groups))


def decide(spec: JobSpec, platform: PlatformConfig | None = None) -> Placement:
    instance = spec.resources.instance()
    flavours = preferred_flavours(spec, platform)
    if platform is not None:
        flavours = [f for f in flavours if offers(platform, f, instance.name if instance else None)]
    efa = catalog.efa_device_count(instance) if flavours == [Flavour.GPU_EFA] and instance is not None else 0
    return Placement(tuple(flavours), instance, spec.workers.nodes, spec.resources.gpus(), efa, spec.capacity,
                     platform.region if platform is not None else None)
