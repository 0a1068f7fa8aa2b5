"""Kueue's cluster-wide objects: one ResourceFlavor per node flavour of the stack (labels and taints from the
contract, the same the node groups carry), the cohort every team's ClusterQueue joins, and the priority classes
job specs name. The teams' ClusterQueues and LocalQueues belong to tenancy."""

from __future__ import annotations

from typing import Any

from trainforge import contract
from trainforge.stackconfig import PlatformConfig

API = "kueue.x-k8s.io/v1beta2"
PRIORITY_VALUES = {"low": 100, "normal": 1000, "high": 10000}


def resource_flavor(flavour: contract.Flavour) -> dict[str, Any]:
    traits = contract.flavour_traits(flavour)
    spec: dict[str, Any] = {"nodeLabels": dict(traits.labels)}
    if traits.taints:
        # Kueue assigns the flavour only to workloads that tolerate these (the rendered jobs do).
        spec["nodeTaints"] = [{"key": t.key, "value": t.value, "effect": t.effect} for t in traits.taints]
    return {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": flavour.value}, "spec": spec}


def resource_flavors(cfg: PlatformConfig) -> list[dict[str, Any]]:
    present = dict.fromkeys(g.flavour for g in cfg.node_groups)
    return [resource_flavor(f) for f in present]


def cohort() -> dict[str, Any]:
    return {"apiVersion": API, "kind": "Cohort", "metadata": {"name": contract.KUEUE_COHORT}, "spec": {}}


def workload_priority_classes() -> list[dict[str, Any]]:
    assert set(PRIORITY_VALUES) == set(contract.PRIORITIES)
    return [{"apiVersion": API, "kind": "WorkloadPriorityClass", "metadata": {"name": contract.priority_class_name(p)},
             "value": PRIORITY_VALUES[p], "description": f"trainforge jobs of priority {p!r} (job spec `priority`)"}
            for p in contract.PRIORITIES]
