"""`trainforge plan`: the real program offline, priced line by line (recomputed here by hand), judged by the policy
pack, and compared with another stack or revision."""

from __future__ import annotations

import copy
import json
import subprocess

import pytest
import yaml
from support import run_cache
from support.cli import run_cli
from support.evaluated import deployable
from support.repo import REPO, STACK_FILES

from trainforge.pricing import price_table, service_prices
from trainforge.stackconfig import CONFIG_KEY, read_stack_file

HOURS = 730


def cli(*argv: str, cwd=REPO) -> subprocess.CompletedProcess:
    return run_cli("plan", *argv, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Each shipped stack as its deployer plans it: with the API allowlist set (`pulumi config set`, README)."""
    from trainforge.platform.plan.plan import make_plan
    folder = tmp_path_factory.mktemp("stacks")
    out = {}
    for path in STACK_FILES:
        written = folder / path.name
        written.write_text(yaml.safe_dump({"config": deployable(path)}))
        # Once per run: both workers run tests of this module.
        out[path.name] = run_cache.once("plan", run_cache.digest(path.name, written.read_bytes()), lambda written=written: make_plan(written))
    return out


def test_the_resource_count_is_what_the_program_registers(plans, evaluations):
    for path in STACK_FILES:
        registered = [r for r in evaluations(path).resources if not r.type.startswith("pulumi:providers:")]
        assert len(plans[path.name].resources) == len(registered) > 100
        assert {r.type for r in plans[path.name].resources} == {r.type for r in registered}


def test_costs_recomputed_by_hand(plans):
    plan = plans["Pulumi.prod.yaml"]
    lines = plan.cost.by_item()
    services = service_prices()
    # spot-l40s: min 0, max 8, 25 % of the range in use, at the spot price of its first type (g6e.12xlarge)
    spot = price_table().quote("g6e.12xlarge", "us-east-1").spot
    assert lines["node group spot-l40s"].monthly_usd == pytest.approx(2 * spot * HOURS, abs=0.01)
    assert lines["node group spot-l40s"].at_max_usd == pytest.approx(8 * spot * HOURS, abs=0.01)
    assert lines["node group spot-l40s"].at_min_usd == 0
    # three NAT gateways (per-az), 730 h each and 1000 GB processed each
    assert lines["NAT gateways"].monthly_usd == pytest.approx(3 * (0.045 * HOURS + 0.045 * 1000), abs=0.01)
    # 4800 GiB PERSISTENT_2 at 500 MB/s/TiB
    assert lines["FSx for Lustre"].monthly_usd == pytest.approx(4800 * 0.290, abs=0.01)
    assert services["fsx_lustre_gb_month"]["PERSISTENT_2"][500] == 0.290 and services["nat_gateway_hour"] == 0.045
    assert plan.cost.monthly_usd == pytest.approx(sum(line.monthly_usd for line in plan.cost.lines), abs=0.05)
    assert plan.cost.unknown == [] and all(line.assumption for line in plan.cost.lines)


def test_an_unknown_price_is_named_never_zero(tmp_path):
    from trainforge.platform.plan.plan import make_plan
    raw = copy.deepcopy(read_stack_file(REPO / "stacks" / "Pulumi.dev.yaml").config[CONFIG_KEY])
    raw["kubernetes"] = {"mlflow": {"instance_class": "db.x9.huge"}}
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": {CONFIG_KEY: raw}}))
    plan = make_plan(path)
    assert plan.cost.unknown == ["RDS db.x9.huge"] and plan.cost.by_item()["RDS db.x9.huge"].monthly_usd is None


def write_stack(tmp_path, name, change) -> str:
    raw = deployable(REPO / "stacks" / "Pulumi.prod.yaml")[CONFIG_KEY]
    change(raw)
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump({"config": {CONFIG_KEY: raw}}))
    return str(path)


def test_adding_a_team_adds_exactly_its_resources_and_no_dollars(tmp_path):
    def add_team(raw):
        raw["teams"].append({"name": "robotics", "cost_centre": "cc-3001", "gpu_quota": {"gpu-spot": 8}, "monthly_budget_usd": 5000})
    result = cli("--stack", write_stack(tmp_path, "after", add_team), "--against", write_stack(tmp_path, "before", lambda raw: None), "-o", "json")
    assert result.returncode == 0, result.stderr[-2000:]
    diff = json.loads(result.stdout)["against"]
    assert diff["removed"] == [] and diff["changed"] == [] and diff["added"]
    assert all("robotics" in name for name in diff["added"]), diff["added"]
    assert {name.split()[0] for name in diff["added"]} >= {"trainforge:infra:TeamAccess", "aws:iam/role:Role", "kubernetes:core/v1:PersistentVolume"}
    assert diff["monthly_delta_usd"] == 0 and diff["cost"] == []


def test_resizing_a_node_group_changes_that_group_and_its_dollars(tmp_path):
    def grow(raw):
        next(g for g in raw["node_groups"] if g["name"] == "spot-l40s")["max_size"] = 12
    result = cli("--stack", write_stack(tmp_path, "after", grow), "--against", write_stack(tmp_path, "before", lambda raw: None), "-o", "json")
    assert result.returncode == 0, result.stderr[-2000:]
    diff = json.loads(result.stdout)["against"]
    assert diff["added"] == [] and diff["removed"] == []
    assert diff["changed"] == ["aws:eks/nodeGroup:NodeGroup trainforge-prod-spot-l40s"]
    spot = price_table().quote("g6e.12xlarge", "us-east-1").spot
    volume = 500 * service_prices()["ebs_gp3_gb_month"] + (6000 - 3000) * 0.005 + (500 - 125) * 0.040
    delta = {row["item"]: row["delta"] for row in diff["cost"]}
    assert delta == pytest.approx({"node group spot-l40s": 0.25 * 4 * spot * HOURS, "root volumes spot-l40s": 0.25 * 4 * volume}, abs=0.02)


def test_the_same_file_at_head_differs_in_nothing():
    result = cli("--stack", "dev", "--against-rev", "HEAD", "-o", "json")
    diff = json.loads(result.stdout)["against"]
    assert (diff["added"], diff["removed"], diff["changed"], diff["monthly_delta_usd"]) == ([], [], [], 0)


def test_a_shipped_stack_plans_but_names_what_its_deployer_must_set_first():
    """The shipped stacks leave the API allowlist to the deployer: the plan is whole, and fails on exactly that."""
    result = cli("--stack", "dev", "-o", "json")
    assert result.returncode == 1, result.stderr[-2000:]
    document = json.loads(result.stdout)
    assert [v["rule"] for v in document["policy"]["violations"] if v["level"] == "mandatory"] == ["cluster-endpoint-not-open-to-the-world"]
    assert document["deploy_blockers"] and "pulumi config set --path" in document["deploy_blockers"][0]
    assert document["resource_count"] > 100


def test_a_policy_violation_fails_the_plan_naming_the_rule(tmp_path):
    def one_spot_type(raw):
        next(g for g in raw["node_groups"] if g["name"] == "spot-l40s")["instance_types"] = ["g6e.12xlarge"]
    result = cli("--stack", write_stack(tmp_path, "bad", one_spot_type), "-o", "json")
    assert result.returncode == 1
    violations = json.loads(result.stdout)["policy"]["violations"]
    assert [v["rule"] for v in violations if v["level"] == "mandatory"] == ["spot-groups-diversified"]
    table = cli("--stack", write_stack(tmp_path, "bad-table", one_spot_type))
    assert table.returncode == 1 and "spot-groups-diversified" in table.stdout


def test_a_bad_stack_file_exits_2_with_the_config_error(tmp_path):
    def break_it(raw):
        raw["availability_zones"] = ["us-east-1a"]
    result = cli("--stack", write_stack(tmp_path, "broken", break_it))
    assert result.returncode == 2 and "availability_zones" in result.stderr and "Traceback" not in result.stderr


def test_json_output_has_the_documented_top_level(plans):
    document = plans["Pulumi.dev.yaml"].to_json()
    assert {"stack", "resource_count", "resources", "policy", "monthly_cost_usd", "breakdown", "assumptions"} <= set(document)
    assert document["policy"]["passed"] and isinstance(document["monthly_cost_usd"], float)
    assert {"type", "name", "component"} <= set(document["resources"][0])
