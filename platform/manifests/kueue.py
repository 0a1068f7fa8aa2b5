"""Kueue's cluster-wide objects: the cohort every team's ClusterQueue joins and the priority classes job specs name.
The ResourceFlavors and the teams' ClusterQueues are built by trainforge.kueue (admission reads the same objects);
the LocalQueues belong to tenancy."""

from __future__ import annotations

from typing import Any

from trainforge import contract
from trainforge import kueue as core_kueue

API = core_kueue.API
PRIORITY_VALUES = {"low": 100, "normal": 1000, "high": 10000}


def cohort() -> dict[str, Any]:
    return {"apiVersion": API, "kind": "Cohort", "metadata": {"name": contract.KUEUE_COHORT}, "spec": {}}


def workload_priority_classes() -> list[dict[str, Any]]:
    assert set(PRIORITY_VALUES) == set(contract.PRIORITIES)
    return [{"apiVersion": API, "kind": "WorkloadPriorityClass", "metadata": {"name": contract.priority_class_name(p)},
             "value": PRIORITY_VALUES[p], "description": f"trainforge jobs of priority {p!r} (job spec `priority`)"}
            for p in contract.PRIORITIES]
