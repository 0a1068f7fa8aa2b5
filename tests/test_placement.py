"""One placement decision: the flavour admission charges is the flavour the rendered pods can be scheduled on.
(Whether the autoscaler would *create* such a node is tests/test_quotas.py's, over the ASG tags the engine recorded.)

For every example spec x capacity x team x stack (the shipped stacks and variants of them), the pods are
scheduled against a model of the stack's nodes — each node group's labels, taints, instance types and
extended resources, from the same contract the AWS layer applies — and the flavours they fit must be exactly
the placement's candidates, with the charged flavour among them (for spot-fallback, Kueue picks).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

import pytest
import yaml
from support.repo import REPO, STACK_FILES

from trainforge import catalog, contract, nodes
from trainforge.contract import Flavour
from trainforge.stackconfig import CONFIG_KEY, PlatformConfig, load_stack_file, parse, read_stack_file
from trainforge.trainer.admission import admit
from trainforge.nodes import INSTANCE_TYPE_LABEL
from trainforge.trainer.placement import decide
from trainforge.trainer.render import render
from trainforge.trainer.spec import JobSpec, load_spec

EXAMPLES = [p for p in sorted((REPO / "examples").glob("*.yaml")) if "entry" in (yaml.safe_load(p.read_text()) or {})]
CAPACITIES = ["on-demand", "spot", "spot-fallback"]


def _variant(path, change) -> PlatformConfig:
    stack = read_stack_file(path)
    raw = copy.deepcopy(stack.config[CONFIG_KEY])
    change(raw)
    return parse(raw, environment=stack.environment, source=f"{path.name} (variant)")


def _ondemand_g6_12xlarge(raw):
    """The issue's case: the on-demand group offers g6.12xlarge, which has an EFA interface, but no EFA group does."""
    next(g for g in raw["node_groups"] if g["name"] == "gpu-ondemand")["instance_types"] = ["g6.12xlarge"]
    for team in raw["teams"]:
        team["gpu_quota"] = {k: min(v, 24) for k, v in team["gpu_quota"].items()}


def _no_spot_group(raw):
    raw["node_groups"] = [g for g in raw["node_groups"] if g["capacity"] != "spot"]
    for team in raw["teams"]:
        team["gpu_quota"].pop("gpu-spot", None)


STACKS = {p.name: load_stack_file(p) for p in STACK_FILES}
STACKS["prod, on-demand group of g6.12xlarge"] = _variant(REPO / "stacks" / "Pulumi.prod.yaml", _ondemand_g6_12xlarge)
STACKS["prod, no spot group"] = _variant(REPO / "stacks" / "Pulumi.prod.yaml", _no_spot_group)


def specs_for(platform: PlatformConfig) -> list[JobSpec]:
    """Every example, plus multi-node jobs on every GPU type the stack offers, for every capacity and team."""
    bases = [load_spec(p) for p in EXAMPLES]
    gpu_types = sorted({t for g in platform.node_groups if g.has_gpus for t in g.instance_types})
    bases += [bases[0].model_copy(update={"name": f"multi-{t.replace('.', '-')}", "workers": bases[0].workers.model_copy(update={"nodes": 2}),
                                          "resources": bases[0].resources.model_copy(update={"instance_type": t, "gpu_type": None, "gpus_per_node": None,
                                                                                                     "cpu": "3", "memory": "12Gi"})})
              for t in gpu_types]
    # As each team may submit it: a priority the team was not granted is refused before placement (test_isolation).
    return [spec.model_copy(update={"capacity": capacity, "team": team.name,
                                    "priority": spec.priority if spec.priority in team.priorities else "normal"})
            for spec in bases for capacity in CAPACITIES for team in platform.teams]


@dataclass(frozen=True)
class Node:
    flavour: Flavour
    labels: dict[str, str]
    taints: tuple[contract.Taint, ...]
    allocatable: dict[str, int]


def nodes_of(platform: PlatformConfig) -> list[Node]:
    """One node per (group, instance type), labelled and tainted as the AWS layer makes them."""
    out = []
    for group in platform.node_groups:
        traits = contract.flavour_traits(group.flavour)
        for name in group.instance_types:
            instance = catalog.lookup(name)
            allocatable = nodes.usable(instance) if instance.gpus else {}
            if group.efa:
                allocatable[contract.RESOURCE_EFA] = catalog.efa_device_count(instance)
            if instance.gpus:  # the root disk the group gives its nodes
                allocatable[contract.RESOURCE_EPHEMERAL_STORAGE] = nodes.ephemeral_allocatable_gib(group.disk_gib) * 2**30
            labels = {**nodes.node_labels(group), INSTANCE_TYPE_LABEL: name}
            out.append(Node(group.flavour, labels, traits.taints, allocatable))
    return out


def schedulable(pod: dict, requests: dict, node: Node) -> bool:
    """The scheduler's filters that placement touches: nodeSelector, required node affinity, taints, extended resources."""
    if any(node.labels.get(k) != v for k, v in pod.get("nodeSelector", {}).items()):
        return False
    terms = pod.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms")
    if terms and not any(all(node.labels.get(e["key"]) in e["values"] for e in term["matchExpressions"]) for term in terms):
        return False
    tolerated = {(t["key"], t["value"], t["effect"]) for t in pod.get("tolerations", [])}
    if any((t.key, t.value, t.effect) not in tolerated for t in node.taints):
        return False
    return all(node.allocatable.get(r, 0) >= nodes.quantity(r, n) for r, n in requests.items())


def pod_and_requests(manifest: dict) -> tuple[dict, dict]:
    if manifest["kind"] == "TrainJob":
        job = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        return job["template"]["spec"]["template"]["spec"], manifest["spec"]["trainer"]["resourcesPerNode"]["requests"]
    pod = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    return pod, pod["containers"][0]["resources"]["requests"]


@pytest.mark.parametrize("stack_name", sorted(STACKS))
def test_admission_charges_the_flavour_the_rendered_pods_run_on(stack_name):
    platform = STACKS[stack_name]
    nodes = nodes_of(platform)
    checked = 0
    for spec in specs_for(platform):
        decision = admit(spec, platform)
        if not decision.admitted:
            continue
        for kind in ("trainjob", "pytorchjob"):
            pod, requests = pod_and_requests(render(spec, decision.placement, kind))
            lands_on = {n.flavour for n in nodes if schedulable(pod, requests, n)}
            where = f"{spec.name} ({spec.capacity}, {spec.workers.nodes} x {spec.resources.instance_type}, team {spec.team}) as {kind}"
            assert decision.flavour in lands_on, f"{where}: charged {decision.flavour}, pods fit {lands_on}"
            assert lands_on == set(decision.placement.flavours), f"{where}: pods fit {lands_on}, placement {decision.placement.flavours}"
            if spec.capacity != "spot-fallback":
                assert lands_on == {decision.flavour}, where
            checked += 1
    assert checked >= 10, f"only {checked} admitted cases on {stack_name}: the sweep lost its coverage"


def test_the_reported_case_is_charged_and_scheduled_on_gpu_ondemand():
    """prod with g6.12xlarge on-demand: a 2-node on-demand g6.12xlarge job of `applied` must not ask for EFA nodes."""
    platform = STACKS["prod, on-demand group of g6.12xlarge"]
    spec = load_spec(REPO / "examples" / "quickstart.yaml").model_copy(update={
        "team": "applied", "capacity": "on-demand", "workers": JobSpec.model_fields["workers"].annotation(nodes=2),
        "resources": load_spec(REPO / "examples" / "quickstart.yaml").resources.model_copy(update={"instance_type": "g6.12xlarge", "gpu_type": None})})
    decision = admit(spec, platform)
    assert decision.admitted, decision.problems
    assert decision.flavour is Flavour.GPU_ONDEMAND
    pod, requests = pod_and_requests(render(spec, decision.placement, "trainjob"))
    assert pod["nodeSelector"][contract.LABEL_FLAVOUR] == "gpu-ondemand"
    assert contract.RESOURCE_EFA not in requests


def test_spot_fallback_pods_may_land_on_spot_or_on_demand_nodes_and_never_on_efa_nodes():
    platform = STACKS["Pulumi.prod.yaml"]
    spec = load_spec(REPO / "examples" / "llm-pretrain-efa.yaml").model_copy(update={"capacity": "spot-fallback", "team": "applied"})
    spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"instance_type": "g6e.12xlarge", "cpu": "40", "memory": "300Gi"})})
    where = decide(spec, platform)
    assert where.flavours == (Flavour.GPU_SPOT, Flavour.GPU_ONDEMAND) and where.efa_devices_per_node == 0
    pod, requests = pod_and_requests(render(spec, where, "trainjob"))
    assert {n.flavour for n in nodes_of(platform) if schedulable(pod, requests, n)} == {Flavour.GPU_SPOT, Flavour.GPU_ONDEMAND}


def test_the_local_record_and_the_cost_use_the_placement(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_HOME", str(tmp_path))
    from trainforge.trainer import ledger
    from trainforge.trainer.backends.local_records import JobState, prepare
    platform = STACKS["Pulumi.prod.yaml"]
    spec = load_spec(REPO / "examples" / "llm-pretrain-efa.yaml")
    decision = admit(spec, platform)
    state = prepare(spec, decision.placement)
    saved = json.loads((tmp_path / "jobs" / spec.name / "state.json").read_text())
    assert (saved["instance_type"], saved["nodes"], saved["region"]) == (decision.placement.instance_type, decision.placement.nodes, platform.region)
    state.run_seconds = 3600.0
    cost = ledger.job_cost(JobState(**{**saved, "run_seconds": 3600.0}))
    assert cost["on_demand_usd"] == pytest.approx(decision.cost.on_demand_hourly * decision.placement.nodes, rel=1e-6)


def test_a_job_of_a_second_on_the_cheapest_instance_costs_more_than_nothing(tmp_path, monkeypatch):
    """A sweep trial of a few seconds on a laptop was settled at $0.0 (the ledger rounded to 4 places) and a cost
    objective read it as free: the ledger keeps what the seconds cost, however small."""
    monkeypatch.setenv("TRAINFORGE_HOME", str(tmp_path))
    from trainforge.pricing import price_table
    from trainforge.trainer import ledger
    from trainforge.trainer.backends.local_records import JobState, prepare
    spec = load_spec(REPO / "examples" / "llm-pretrain-efa.yaml")
    table = price_table()
    region = table.regions[0]
    cheapest = min(table.on_demand, key=lambda name: table.quote(name, region).spot)
    prepare(spec, decide(spec, STACKS["Pulumi.prod.yaml"]))
    saved = json.loads((tmp_path / "jobs" / spec.name / "state.json").read_text())
    second = JobState(**{**saved, "instance_type": cheapest, "region": region, "nodes": 1, "capacity": "spot", "run_seconds": 1.0})
    cost = ledger.job_cost(second)
    assert cost["cost_usd"] == pytest.approx(table.quote(cheapest, region).spot / 3600, rel=1e-9) and cost["cost_usd"] > 0
