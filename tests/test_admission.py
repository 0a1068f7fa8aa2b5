"""Quota, cost limit and budget are checked before anything starts, against the stack's teams, with the numbers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.repo import REPO, STACKS

from trainforge.contract import Flavour
from trainforge.stackconfig import load_stack_file
from trainforge.trainer.admission import admit
from trainforge.pricing import price_table
from trainforge.trainer.spec import load_spec

PROD = load_stack_file(STACKS / "Pulumi.prod.yaml")
DEV = load_stack_file(STACKS / "Pulumi.dev.yaml")
EFA_SPEC = load_spec(REPO / "examples" / "llm-pretrain-efa.yaml")
QUICKSTART = load_spec(REPO / "examples" / "quickstart.yaml")


def with_(spec, **changes):
    data = spec.model_dump()
    for path, value in changes.items():
        node = data
        *parents, leaf = path.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return type(spec).model_validate(data)


def test_a_job_within_quota_and_budget_is_admitted_on_the_efa_flavour():
    decision = admit(EFA_SPEC, PROD)
    assert decision.admitted, decision.problems
    assert decision.flavour is Flavour.GPU_EFA and decision.gpus == 32
    hourly = price_table().hourly("p5.48xlarge", "on-demand", "us-east-1")
    assert decision.cost.expected_usd == pytest.approx(4 * hourly * 12)


def test_a_job_that_can_never_fit_the_quota_is_rejected_with_the_numbers():
    decision = admit(with_(EFA_SPEC, workers__nodes=9, limits__max_cost_usd=None), PROD)
    assert not decision.admitted
    (problem,) = decision.problems
    assert "Kueue can never admit this job into the stack's ClusterQueue team-foundation" in problem
    assert "insufficient quota for nvidia.com/gpu in flavor gpu-efa, request > maximum capacity (72 > 64)" in problem
    assert "Fix:" in problem


def test_spot_fallback_takes_on_demand_when_spot_quota_is_too_small():
    spec = with_(QUICKSTART, team="applied", capacity="spot-fallback", workers__nodes=9, resources__instance_type="g6e.12xlarge",
                 limits__max_cost_usd=None)
    decision = admit(spec, PROD)  # applied: 32 spot GPUs + 16 it may borrow (the cohort lends 24), 16 on-demand -> 36 fit spot
    assert decision.admitted and decision.flavour is Flavour.GPU_SPOT, decision.problems
    decision = admit(with_(spec, workers__nodes=13), PROD)  # 52 fit neither 32 + 16 nor 16
    assert not decision.admitted
    assert "nvidia.com/gpu in flavor gpu-spot, request > maximum capacity (52 > 48)" in decision.problems[0]
    assert "nvidia.com/gpu in flavor gpu-ondemand, request > maximum capacity (52 > 16)" in decision.problems[0]
    decision = admit(with_(spec, workers__nodes=4), PROD)  # 16 GPUs: spot first
    assert decision.admitted and decision.flavour is Flavour.GPU_SPOT


def test_an_instance_type_no_group_of_the_flavour_offers_is_rejected():
    decision = admit(with_(QUICKSTART, resources__instance_type="p5.48xlarge", resources__gpus_per_node=8, limits__max_cost_usd=None), DEV)
    (problem,) = decision.problems
    assert "no node group can run a pod of this job" in problem
    assert "node group spot-l4 (g6.xlarge): nodeSelector k8s.amazonaws.com/accelerator=nvidia-h100 (node: nvidia-l4)" in problem


def test_max_cost_is_enforced_by_how_much():
    decision = admit(with_(EFA_SPEC, limits__max_cost_usd=1000.0), PROD)
    (problem,) = decision.problems
    expected = decision.cost.expected_usd
    assert f"the estimate is ${expected:,.2f}" in problem and f"${expected - 1000:,.2f} over the limit of $1,000.00" in problem


def test_the_team_budget_left_this_month_is_enforced():
    decision = admit(EFA_SPEC, PROD, spent_this_month_usd=248_000)
    assert any("team 'foundation' has $2,000.00 left of $250,000.00 this month" in p for p in decision.problems)


def test_an_unknown_team_is_named():
    decision = admit(with_(QUICKSTART, team="nobody"), DEV)
    assert "team: 'nobody' is not onboarded in the dev stack (teams: ['vision', 'language', 'audio'])" in decision.problems[0]  # audio: its own stack


def test_check_command_exit_codes_and_json(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", "check", "examples/quickstart.yaml", "--stack",
                         "stacks/Pulumi.dev.yaml", "-o", "json"], capture_output=True, text=True, cwd=REPO)
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["admitted"] and report["flavour"] == "gpu-spot" and report["spot_usd"] < report["on_demand_usd"]
    no = subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", "check", "examples/llm-pretrain-efa.yaml", "--stack",
                         "stacks/Pulumi.dev.yaml"], capture_output=True, text=True, cwd=REPO)
    assert no.returncode == 3 and "not onboarded in the dev stack" in no.stderr and "Traceback" not in no.stderr


def test_an_image_from_outside_the_platforms_registries_is_refused_before_anything_is_created():
    """The team pod policy admits only the platform's registries; `check` and `submit` say so first, with the fix."""
    from trainforge.stackconfig import load_stack_file
    from trainforge.trainer.admission import admit
    from trainforge.trainer.spec import load_spec
    cfg = load_stack_file(REPO / "stacks" / "Pulumi.dev.yaml")
    spec = load_spec(REPO / "examples" / "quickstart.yaml").model_copy(update={"team": cfg.teams[0].name})
    ours = spec.model_copy(update={"image": f"{cfg.account_id}.dkr.ecr.{cfg.region}.amazonaws.com/vision/custom:3"})
    assert not [p for p in admit(ours, cfg).problems if p.startswith("image:")]
    theirs = spec.model_copy(update={"image": "docker.io/someone/miner:latest"})
    (problem,) = [p for p in admit(theirs, cfg).problems if p.startswith("image:")]
    assert "kubernetes.image_registries" in problem and f"{cfg.account_id}.dkr.ecr" in problem
    opened = cfg.model_copy(update={"kubernetes": cfg.kubernetes.model_copy(update={"image_registries": ["docker.io/someone/"]})})
    assert not [p for p in admit(theirs, opened).problems if p.startswith("image:")]


@pytest.mark.parametrize("prefix", ["nvcr.io", "nvcr.io/nvidia", "*", "docker.io/../x/"])
def test_an_image_registry_that_could_admit_more_than_it_names_is_refused(prefix):
    from trainforge.stackconfig.kubernetes import KubernetesConfig
    with pytest.raises(ValueError, match="ending in '/'"):
        KubernetesConfig.model_validate({"image_registries": [prefix]})
