"""Kueue, computed once: the quota objects a stack gives each team, and Kueue's admission rule over them.

Quota. A team's quota is its GPUs per flavour (stack config). Kueue covers cpu, memory, GPUs and EFA devices together,
so each flavour's cpu and memory quota is the team's GPUs there times what one GPU of that flavour comes with on a node
(`per_gpu`: the node's usable cpu and memory over its GPUs, for the group whose template node gives the most per GPU).
A job that fits the GPU quota then always fits cpu and memory, and the namespace's ResourceQuota backstop is the same
sum. A flat figure on every flavour (the old 512 CPU / 4Ti) made multi-node jobs inadmissible whatever their GPUs.

Admission (`assign`), Kueue v0.19's flavour assignment (pkg/scheduler/flavorassigner): every resource a pod set
requests must be covered by a resource group of the ClusterQueue; within a group the flavours are tried in order, and a
flavour is skipped when the pod set does not tolerate its taints or selects other values of its node labels; a flavour
fits when, for every requested resource, the workload's total is at most the flavour's nominal quota plus what it may
borrow (its borrowingLimit, unlimited when unset, and never more than the rest of the cohort lends: each other queue's
lendingLimit, or its whole nominal quota when unset). Usage is left out: this says whether a workload can *ever* be
admitted ("request > maximum capacity" otherwise), which is what `check` and `submit` promise; queueing for room is
Kueue's. `check`, `submit`, sweeps and the tests call this one function, offline over the stack's queues and on a
cluster over the live one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from trainforge import catalog, contract, nodes
from trainforge.contract import Flavour
from trainforge.nodes import PodShape, Taint, quantity, show

if TYPE_CHECKING:
    from trainforge.stackconfig import PlatformConfig, TeamConfig

API = contract.KUEUE_API
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace
COVERED = ["cpu", "memory", contract.RESOURCE_GPU, contract.RESOURCE_EFA]


# ---- quota ------------------------------------------------------------------------------------------------------

def per_gpu(cfg: PlatformConfig, flavour: Flavour) -> dict[str, int]:
    """cpu (millicores), memory (bytes) and EFA devices one GPU of `flavour` comes with: the most any of the flavour's
    groups gives, per its template node (the first, smallest type)."""
    best: dict[str, int] = {"cpu": 0, "memory": 0, contract.RESOURCE_EFA: 0}
    for group in cfg.node_groups:
        if group.flavour is flavour and group.has_gpus:
            first = group.instances[0]
            usable = nodes.usable(first)
            share = {"cpu": usable["cpu"] // group.gpus_per_node, "memory": usable["memory"] // group.gpus_per_node,
                     contract.RESOURCE_EFA: math.ceil(catalog.efa_device_count(first) / group.gpus_per_node) if group.efa else 0}
            best = {k: max(best[k], share[k]) for k in best}
    return best


def cpu_text(millicores: int) -> str:
    return f"{millicores // 1000}" if millicores % 1000 == 0 else f"{millicores}m"


def memory_text(amount: int) -> str:
    return f"{amount // 2**30}Gi" if amount % 2**30 == 0 else f"{amount // 2**20}Mi"


@dataclass(frozen=True)
class FlavourQuota:
    """A team's quota of one flavour, per resource: (nominal, borrowing limit, lending limit or None)."""

    flavour: Flavour
    nominal: dict[str, int]
    borrowing: dict[str, int] = field(default_factory=dict)
    lending: dict[str, int | None] = field(default_factory=dict)


def team_quotas(cfg: PlatformConfig, team: TeamConfig) -> list[FlavourQuota]:
    """Per flavour the stack has (system first for CPU-only jobs, then GPU flavours the team may use), in node-group
    order: GPUs as configured, cpu/memory/EFA in proportion."""
    out = []
    for flavour in dict.fromkeys(g.flavour for g in cfg.node_groups):
        if flavour is Flavour.SYSTEM:
            continue  # the platform's own nodes: no team is ever admitted there
        if flavour is Flavour.CPU:
            nominal = {"cpu": quantity("cpu", team.cpu_quota), "memory": quantity("memory", team.memory_quota),
                       contract.RESOURCE_GPU: 0, contract.RESOURCE_EFA: 0}
            out.append(FlavourQuota(flavour, nominal))
            continue
        gpus, borrow = team.gpu_quota.get(flavour, 0), team.borrowing_limit.get(flavour, 0)
        if gpus + borrow == 0:
            continue
        share = {**per_gpu(cfg, flavour), contract.RESOURCE_GPU: 1}
        lend = team.lending_limit.get(flavour)
        out.append(FlavourQuota(flavour, {r: gpus * n for r, n in share.items()}, {r: borrow * n for r, n in share.items()},
                                {r: None if lend is None else lend * n for r, n in share.items()}))
    return out


def _text(resource: str, amount: int) -> Any:
    return cpu_text(amount) if resource == "cpu" else memory_text(amount) if resource == "memory" else amount


def cluster_queue(cfg: PlatformConfig, team: TeamConfig, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The team's ClusterQueue, in the platform's cohort: borrowed capacity reclaimed by its owner, a fair-sharing weight."""
    entries = []
    for quota in team_quotas(cfg, team):
        resources = []
        for resource in COVERED:
            entry: dict[str, Any] = {"name": resource, "nominalQuota": _text(resource, quota.nominal[resource])}
            if quota.flavour.has_gpus:
                entry["borrowingLimit"] = _text(resource, quota.borrowing[resource])
                lending = quota.lending.get(resource)
                if lending is not None:
                    entry["lendingLimit"] = _text(resource, lending)
            resources.append(entry)
        entries.append({"name": quota.flavour.value, "resources": resources})
    return {
        "apiVersion": API, "kind": "ClusterQueue",
        "metadata": {"name": contract.cluster_queue_name(team.name), **({"labels": labels} if labels else {})},
        "spec": {
            "cohortName": contract.KUEUE_COHORT,
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: contract.namespace_name(team.name)}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [{"coveredResources": COVERED, "flavors": entries}],
            # No borrowWithinCohort: with fair sharing on, Kueue preempts across the cohort by fair share alone and
            # ignores it (Kueue docs, "Fair Sharing": preemption within the cohort uses the fair-sharing strategies).
            "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
            "fairSharing": {"weight": str(team.fair_share_weight)},
        },
    }


def resource_flavor(flavour: Flavour) -> dict[str, Any]:
    traits = contract.flavour_traits(flavour)
    spec: dict[str, Any] = {"nodeLabels": dict(traits.labels)}
    if traits.taints:
        # Kueue assigns the flavour only to workloads that tolerate these (the rendered jobs do).
        spec["nodeTaints"] = [{"key": t.key, "value": t.value, "effect": t.effect} for t in traits.taints]
    return {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": flavour.value}, "spec": spec}


def resource_flavors(cfg: PlatformConfig) -> list[dict[str, Any]]:
    return [resource_flavor(f) for f in dict.fromkeys(g.flavour for g in cfg.node_groups) if f is not Flavour.SYSTEM]


def stack_queues(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """Every team's ClusterQueue as the stack creates it (the cohort, offline)."""
    return [cluster_queue(cfg, team) for team in cfg.teams]


# ---- admission --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PodSet:
    name: str
    count: int
    pod: PodShape  # requests per pod


@dataclass
class Verdict:
    admitted: bool
    flavours: dict[str, str]  # pod set -> flavour assigned
    problems: list[str]


def _quantities(entry: dict[str, Any], key: str) -> int | None:
    value = entry.get(key)
    return None if value is None else quantity(entry["name"], value)


def _lendable(queue: dict[str, Any], flavour: str, resource: str) -> int:
    for group in queue.get("spec", {}).get("resourceGroups", []):
        for f in group.get("flavors", []):
            if f["name"] == flavour:
                for r in f.get("resources", []):
                    if r["name"] == resource:
                        lend = _quantities(r, "lendingLimit")
                        return (_quantities(r, "nominalQuota") or 0) if lend is None else lend
    return 0


def _flavour_taints(flavor: dict[str, Any]) -> list[Taint]:
    return [Taint(t["key"], t.get("value", ""), t["effect"]) for t in flavor.get("spec", {}).get("nodeTaints", [])]


def _flavour_problem(pod: PodShape, flavor: dict[str, Any] | None, name: str) -> str | None:
    if flavor is None:
        return f"flavor {name} not found"
    labels = flavor.get("spec", {}).get("nodeLabels", {}) or {}
    mismatched = pod.label_problems(labels, only_keys=set(labels))
    if mismatched:
        return f"flavor {name} doesn't match node affinity ({'; '.join(mismatched)})"
    untolerated = [t for t in _flavour_taints(flavor) if t.effect in ("NoSchedule", "NoExecute") and not pod.tolerates(t)]
    if untolerated:
        return f"untolerated taint {untolerated[0].key}={untolerated[0].value}:{untolerated[0].effect} in flavor {name}"
    return None


def excluded(resource: str) -> bool:
    """Whether Kueue leaves `resource` out of quota (its Configuration's excludeResourcePrefixes, as the platform sets
    them: contract.KUEUE_EXCLUDED_RESOURCES; a prefix matches the whole name or up to a "/")."""
    return any(resource == prefix or resource.startswith(prefix.rstrip("/") + "/") for prefix in contract.KUEUE_EXCLUDED_RESOURCES)


def assign(pod_sets: list[PodSet], queue: dict[str, Any], *, cohort: Sequence[dict[str, Any]] = (),
           flavors: dict[str, dict[str, Any]]) -> Verdict:
    """Whether Kueue can ever admit a workload of `pod_sets` into `queue` (its cohort's other queues in `cohort`, the
    ResourceFlavor objects by name in `flavors`), which flavour each pod set gets, and why not."""
    cohort_name = queue.get("spec", {}).get("cohortName")
    others = [q for q in cohort if cohort_name is not None and q["metadata"]["name"] != queue["metadata"]["name"]
              and q.get("spec", {}).get("cohortName") == cohort_name]
    groups = queue.get("spec", {}).get("resourceGroups", [])
    used: dict[tuple[str, str], int] = {}
    chosen: dict[str, str] = {}
    problems: list[str] = []
    for pod_set in pod_sets:
        totals = {r: n * pod_set.count for r, n in pod_set.pod.requests.items() if n > 0 and not excluded(r)}
        uncovered = [r for r in totals if not any(r in g.get("coveredResources", []) for g in groups)]
        if uncovered:
            problems.append(f"pod set {pod_set.name}: resource {uncovered[0]} unavailable in ClusterQueue {queue['metadata']['name']}")
            continue
        for group in groups:
            wanted = {r: n for r, n in totals.items() if r in group.get("coveredResources", [])}
            if not wanted:
                continue
            reasons, skipped = [], []
            for entry in group.get("flavors", []):
                name = entry["name"]
                skip = _flavour_problem(pod_set.pod, flavors.get(name), name)
                if skip:
                    skipped.append(skip)
                    continue
                short = []
                quotas = {r["name"]: r for r in entry.get("resources", [])}
                for resource, amount in wanted.items():
                    if resource not in quotas:
                        short.append(f"resource {resource} unavailable in flavor {name}")
                        continue
                    nominal = _quantities(quotas[resource], "nominalQuota") or 0
                    limit = _quantities(quotas[resource], "borrowingLimit")
                    lent = sum(_lendable(q, name, resource) for q in others)
                    capacity = nominal + min(lent, limit if limit is not None else lent)
                    if used.get((name, resource), 0) + amount > capacity:
                        short.append(f"insufficient quota for {resource} in flavor {name}, request > maximum capacity "
                                     f"({show(resource, used.get((name, resource), 0) + amount)} > {show(resource, capacity)})")
                if short:
                    reasons.append("; ".join(short))
                    continue
                chosen[pod_set.name] = name
                for resource, amount in wanted.items():
                    used[(name, resource)] = used.get((name, resource), 0) + amount
                break
            else:
                # The flavours the pods could use say why; the others only if there is none.
                problems.append(f"pod set {pod_set.name}: " + ("; ".join(reasons or skipped) or "no flavors"))
    return Verdict(not problems, chosen, problems)


def pod_sets(manifest: dict[str, Any]) -> list[PodSet]:
    """The pod sets Kueue makes of a rendered TrainJob (one: the trainer's nodes; Trainer 2.2.1's resourcesPerNode is
    the trainer container's resources, placement from the runtime patch) or PyTorchJob (one per replica type)."""
    spec = manifest["spec"]
    if manifest["kind"] == "TrainJob":
        trainer = spec["trainer"]
        pod: dict[str, Any] = {}
        for patch in spec.get("runtimePatches", []):
            for job in patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {}).get("replicatedJobs", []):
                pod |= {k: v for k, v in job["template"]["spec"]["template"]["spec"].items() if k != "containers"}
        requests = nodes.requests_of(_requests(trainer.get("resourcesPerNode", {})))
        return [PodSet(contract.TRAINJOB_REPLICATED_JOB, int(trainer.get("numNodes", 1)), PodShape.of_pod_spec(pod, requests))]
    return [PodSet(role.lower(), int(replica.get("replicas", 1)), PodShape.of_pod_spec(replica["template"]["spec"],
                                                                                       pod_requests(replica["template"]["spec"])))
            for role, replica in spec["pytorchReplicaSpecs"].items()]


def _requests(resources: dict[str, Any]) -> dict[str, Any]:
    """A container's requests; a limit without a request counts as the request (the API server defaults it so)."""
    return {**resources.get("limits", {}), **resources.get("requests", {})}


def pod_requests(pod: dict[str, Any]) -> dict[str, int]:
    """What a pod requests: its containers' requests summed (init containers and overhead: none in what we render)."""
    out: dict[str, int] = {}
    for container in pod.get("containers", []):
        for resource, amount in nodes.requests_of(_requests(container.get("resources") or {})).items():
            out[resource] = out.get(resource, 0) + amount
    return out
