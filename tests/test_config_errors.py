"""A bad stack config stops before any resource exists, with a message naming the field, the value and the fix."""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest
import yaml
from support.repo import REPO, STACKS

from trainforge.stackconfig import CONFIG_KEY, ConfigError, load_stack_file, parse


def prod() -> dict:
    return copy.deepcopy(yaml.safe_load((STACKS / "Pulumi.prod.yaml").read_text())["config"][CONFIG_KEY])


def group(raw: dict, name: str) -> dict:
    return next(g for g in raw["node_groups"] if g["name"] == name)


def rejected(raw: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse(raw, environment="prod", source="stacks/Pulumi.prod.yaml")
    message = str(info.value)
    assert message.startswith("invalid trainforge configuration in stacks/Pulumi.prod.yaml")
    return message


def test_shipped_stacks_are_valid():
    for path in sorted(STACKS.glob("Pulumi.*.yaml")):
        load_stack_file(path)


def test_unknown_instance_type_for_efa():
    raw = prod()
    group(raw, "p5-efa")["instance_types"] = ["m6i.32xlarge"]
    message = rejected(raw)
    assert "node_groups[1].instance_types: m6i.32xlarge has no EFA interfaces" in message
    assert "Fix: use one of" in message and "p5.48xlarge" in message


def test_gpu_type_missing_from_the_catalogue():
    raw = prod()
    group(raw, "p5-efa")["instance_types"] = ["p5.24xlarge"]
    message = rejected(raw)
    assert "node_groups[1].instance_types" in message and "'p5.24xlarge' is not in the GPU catalogue" in message
    assert "p5.48xlarge" in message


def test_efa_group_mixing_instance_types():
    raw = prod()
    group(raw, "p5-efa")["instance_types"] = ["g6.12xlarge", "g6.24xlarge"]  # one GPU shape, two interface layouts
    message = rejected(raw)
    assert "node_groups[1].instance_types: an EFA group has one instance type" in message
    assert "['g6.12xlarge', 'g6.24xlarge']" in message and "Fix: split it into one EFA group per type" in message


def test_a_gpu_group_mixing_gpu_models_or_counts_is_split_by_the_fix():
    raw = prod()
    group(raw, "spot-l4")["instance_types"] = ["g6.12xlarge", "g5.12xlarge", "g6.xlarge"]
    message = rejected(raw)
    assert "the cluster-autoscaler sizes a group by its first type" in message
    assert "Fix: one node group per GPU model and count: [g5.12xlarge]; [g6.xlarge]; [g6.12xlarge]" in message


def test_a_gpu_group_whose_first_type_is_not_its_smallest_says_which_order():
    raw = prod()
    group(raw, "spot-l4")["instance_types"] = ["g6.24xlarge", "g6.12xlarge"]
    message = rejected(raw)
    assert "['g6.12xlarge'] are smaller than the first type g6.24xlarge" in message
    assert "Fix: list the smallest type first: ['g6.12xlarge', 'g6.24xlarge']" in message


def test_efa_group_without_an_availability_zone():
    raw = prod()
    del group(raw, "p5-efa")["availability_zone"]
    message = rejected(raw)
    assert "node_groups[1].availability_zone: an EFA group lives in one cluster placement group" in message
    assert "Fix: set availability_zone" in message


def test_efa_group_in_an_availability_zone_outside_the_stack():
    raw = prod()
    group(raw, "p5-efa")["availability_zone"] = "us-east-1f"
    message = rejected(raw)
    assert "node_groups[1].availability_zone: 'us-east-1f' is not in this stack's availability_zones" in message
    assert "Fix: use one of them" in message


def test_efa_group_on_spot_is_refused():
    raw = prod()
    group(raw, "p5-efa")["capacity"] = "spot"
    assert "node_groups[1].capacity: an EFA group runs tightly coupled jobs" in rejected(raw)


@pytest.mark.parametrize("group_name, change, message", [
    ("p5-efa", {"team_jobs": True}, "team_jobs: GPU groups always run teams' jobs"),
    ("cpu", {"capacity": "spot"}, "team_jobs: teams' CPU jobs run on on-demand nodes"),
    ("cpu", {"instance_types": ["t3.2xlarge"]}, "not in the CPU catalogue"),
])
def test_a_team_jobs_group_must_be_a_sized_on_demand_cpu_group(group_name, change, message):
    raw = prod()
    group(raw, group_name).update(change)
    assert message in rejected(raw)


def test_the_cpu_group_of_a_shipped_stack_is_the_cpu_flavour_and_the_system_one_is_not():
    from trainforge.contract import Flavour
    cfg = load_stack_file(STACKS / "Pulumi.prod.yaml")
    assert {g.name: g.flavour for g in cfg.node_groups if not g.has_gpus} == {"system": Flavour.SYSTEM, "cpu": Flavour.CPU}


@pytest.mark.parametrize("deployment, capacity, suggestion", [
    ("PERSISTENT_2", 3000, "2400 or 4800"),
    ("SCRATCH_2", 1000, "1200 or 2400"),
    ("SCRATCH_1", 4800, "3600 or 7200"),
])
def test_fsx_capacity_not_a_valid_step(deployment, capacity, suggestion):
    raw = prod()
    raw["fsx"].update(deployment_type=deployment, storage_capacity_gib=capacity)
    if deployment.startswith("SCRATCH"):
        raw["fsx"].pop("per_unit_storage_throughput")
        raw["fsx"].pop("data_repository")
    message = rejected(raw)
    assert f"fsx.storage_capacity_gib: {capacity} GiB is not a valid {deployment} capacity" in message
    assert f"Fix: e.g. {suggestion}" in message


def test_fsx_throughput_not_a_valid_tier():
    raw = prod()
    raw["fsx"]["per_unit_storage_throughput"] = 200
    message = rejected(raw)
    assert "fsx.per_unit_storage_throughput: 200 is not a PERSISTENT_2 tier" in message
    assert "Fix: one of [125, 250, 500, 1000]" in message


def test_fsx_throughput_on_scratch():
    raw = prod()
    raw["fsx"].update(deployment_type="SCRATCH_2", storage_capacity_gib=2400)
    assert "fsx.per_unit_storage_throughput: SCRATCH_2 has no throughput tiers, got 500" in rejected(raw)


def test_min_size_greater_than_max_size():
    raw = prod()
    group(raw, "spot-l4").update(min_size=5, max_size=2)
    message = rejected(raw)
    assert "node_groups[3]: min_size (5) > max_size (2). Fix: raise max_size or lower min_size" in message


def test_duplicate_team_names():
    raw = prod()
    raw["teams"][2]["name"] = "applied"
    message = rejected(raw)
    assert "teams: names ['applied'] are used twice" in message and "Fix: give every team its own name" in message


def test_team_quota_larger_than_the_flavour_can_ever_hold():
    raw = prod()
    raw["teams"][0]["gpu_quota"]["gpu-efa"] = 65  # 8 nodes x 8 GPUs = 64
    message = rejected(raw)
    assert "teams[0].gpu_quota.gpu-efa: team 'foundation' asks for 65 GPUs but node groups ['p5-efa'] reach at most 64 GPUs" in message
    assert "Fix: lower the quota to <= 64 or raise max_size of a gpu-efa group" in message


def test_team_quota_for_a_flavour_no_group_provides():
    raw = prod()
    raw["node_groups"] = [g for g in raw["node_groups"] if g["name"] != "gpu-ondemand"]
    message = rejected(raw)
    assert "teams[1].gpu_quota.gpu-ondemand: team 'applied' asks for 16 GPUs but no node group provides gpu-ondemand" in message


def test_missing_cost_centre():
    raw = prod()
    del raw["tags"]["cost_centre"]
    message = rejected(raw)
    assert "tags.cost_centre: Field required Fix: add this field to the stack file." in message


def test_missing_team_cost_centre():
    raw = prod()
    del raw["teams"][1]["cost_centre"]
    assert "teams[1].cost_centre: Field required" in rejected(raw)


def test_misspelt_field_is_not_silently_ignored():
    raw = prod()
    raw["fsx"]["storage_capacity"] = raw["fsx"].pop("storage_capacity_gib")
    message = rejected(raw)
    assert "fsx.storage_capacity_gib: Field required" in message
    assert "fsx.storage_capacity: Extra inputs are not permitted (got 4800)" in message


@pytest.mark.parametrize("cidrs, message", [
    (["203.0.113.0/24"], "203.0.113.0/24 is a documentation range (RFC 5737)"),
    (["198.51.100.7/32"], "documentation range"),
    (["10.0.0.0/8"], "10.0.0.0/8 is not a public internet range"),
    (["0.0.0.0/0"], "opens the API endpoint to the whole internet"),
    ([f"1.2.{i}.0/24" for i in range(41)], "at most 40"),
])
def test_the_api_allowlist_must_be_where_a_deployer_can_be(cidrs, message):
    raw = prod()
    raw["cluster"]["public_access_cidrs"] = cidrs
    assert "cluster.public_access_cidrs" in rejected(raw) and message in rejected(raw)


def test_a_private_only_endpoint_is_refused_because_the_deployer_is_outside_the_vpc_the_program_creates():
    raw = prod()
    raw["cluster"]["endpoint_public_access"] = False
    message = rejected(raw)
    assert "cluster.endpoint_public_access: false makes the API answer only inside the VPC" in message
    assert "Fix: endpoint_public_access: true with public_access_cidrs" in message


def test_a_stack_without_the_deployers_cidrs_parses_but_cannot_deploy():
    """The shipped stacks leave the allowlist to the deployer: a real `pulumi up` refuses with the command to set it."""
    cfg = parse(prod(), environment="prod", source="prod")
    (blocker,) = cfg.cluster.deploy_blockers()
    assert blocker.startswith("cluster.public_access_cidrs: not set") and "pulumi config set --path" in blocker
    raw = prod()
    raw["cluster"]["public_access_cidrs"] = ["1.2.3.4/32"]
    assert parse(raw, environment="prod", source="prod").cluster.deploy_blockers() == []


def test_no_system_group_for_the_add_ons():
    raw = prod()
    raw["node_groups"] = [g for g in raw["node_groups"] if g["name"] != "system"]
    assert "node_groups: no CPU group with min_size >= 1" in rejected(raw)


def test_every_problem_is_reported_at_once():
    raw = prod()
    group(raw, "spot-l4").update(min_size=5, max_size=2)
    raw["fsx"]["per_unit_storage_throughput"] = 200
    del raw["tags"]["cost_centre"]
    message = rejected(raw)
    assert message.count("\n  - ") == 3


def test_program_registers_nothing_when_the_config_is_bad():
    """Through the real Pulumi program: a RunError (no traceback in `pulumi up`), and zero resources."""
    import pulumi

    from trainforge.platform.components.offline import RecordingMocks, evaluate

    raw = prod()
    raw["teams"][0]["gpu_quota"]["gpu-efa"] = 1000
    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError, match=re.escape("teams[0].gpu_quota.gpu-efa")):
        evaluate({CONFIG_KEY: raw, "aws:region": "us-east-1"}, "prod", mocks)
    assert mocks.resources == []


def test_program_names_the_missing_config_key():
    import pulumi

    from trainforge.platform.components.offline import RecordingMocks, evaluate

    mocks = RecordingMocks()
    with pytest.raises(pulumi.RunError, match="no trainforge:platform key under config"):
        evaluate({"aws:region": "us-east-1"}, "staging", mocks)
    assert mocks.resources == []


def test_offline_command_exits_non_zero_without_a_traceback(tmp_path):
    raw = prod()
    group(raw, "p5-efa")["instance_types"] = ["g6.12xlarge", "g6.24xlarge"]
    bad = tmp_path / "Pulumi.prod.yaml"
    bad.write_text(yaml.safe_dump({"config": {CONFIG_KEY: raw}}))
    result = subprocess.run([sys.executable, "-m", "trainforge.platform.components.offline", str(bad)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "node_groups[1].instance_types: an EFA group has one instance type" in result.stderr


@pytest.mark.parametrize("gib, nearest", [(1000, "1200 or 2400"), (3000, "2400 or 4800"), (10**12 + 1, "999999998400 or 1000000000800")])
def test_an_fsx_capacity_between_the_steps_names_its_neighbours_at_any_size(gib, nearest):
    """A mistyped capacity of 10**12 GiB once built every multiple of 2400 up to it (tens of GB) to name its neighbours."""
    raw = prod()
    raw["fsx"]["storage_capacity_gib"] = gib
    message = rejected(raw)
    assert f"fsx.storage_capacity_gib: {gib} GiB is not a valid" in message and f"Fix: e.g. {nearest}" in message, message
