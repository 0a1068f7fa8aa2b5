"""Teams in their own stacks (issue 24, items 2 and 3): a team stack builds on the platform stack's real outputs (its
StackReference reads the platform program's evaluation), builds exactly what the platform stack builds for a team it
declares itself, so a deployed team moved out with `pulumi state move` is adopted rather than recreated, and the
cohort's rules (one name, one principal, quotas within capacity) hold across the stack files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pulumi
import pytest
import yaml
from support.cli import run_cli
from support.lanes import ITSELF, full
from support.repo import REPO, STACK_FILES, TEAM_STACK_FILES

from trainforge import contract
from trainforge.platform.components.offline import evaluate_stack_file
from trainforge.platform.components.team_stack import state_move_urns
from trainforge.stackconfig import (CONFIG_KEY, TEAM_CONFIG_KEY, ConfigError, load_cohort, load_stack_file, read_stack_file,
                                    team_stack_name)

STACKS = REPO / "stacks"


def read_inline_teams(path: Path) -> list:
    """The teams a platform stack file declares itself (not its team stacks')."""
    from trainforge.stackconfig import parse
    stack = read_stack_file(path)
    return parse(stack.config[CONFIG_KEY], environment=stack.environment, source=str(path)).teams


def engine_urn(urn: str) -> str:
    """The URN the Pulumi engine gives: the mock monitor puts the root stack's type in front of a top-level resource's."""
    return urn.replace("::pulumi:pulumi:Stack$", "::")


def move_out(platform_file: Path, team: str, into: Path) -> tuple[Path, Path]:
    """A checkout after moving `team` out of the platform stack: the platform file without it, and its team stack file
    (the team's fields as they were)."""
    into.mkdir(parents=True, exist_ok=True)
    document = yaml.safe_load(platform_file.read_text())
    teams = document["config"][CONFIG_KEY]["teams"]
    (fields,) = [t for t in teams if t["name"] == team]
    teams.remove(fields)
    platform = into / platform_file.name
    platform.write_text(yaml.safe_dump(document))
    environment = read_stack_file(platform_file).environment
    team_file = into / f"Pulumi.{team_stack_name(environment, team)}.yaml"
    team_file.write_text(yaml.safe_dump({"config": {TEAM_CONFIG_KEY: fields}}))
    return platform, team_file


def moved_closure(evaluation, top_urns: list[str]) -> list:
    """What `pulumi state move` moves: the given resources and every descendant (by parent)."""
    wanted = set(top_urns)
    moved = [r for r in evaluation.resources if engine_urn(r.urn) in wanted]
    assert {engine_urn(r.urn) for r in moved} == wanted, f"URNs the platform stack does not have: {wanted - {engine_urn(r.urn) for r in moved}}"
    frontier = {r.urn for r in moved}
    while frontier:
        children = [r for r in evaluation.resources if r.parent in frontier]
        moved += children
        frontier = {r.urn for r in children}
    return moved


def urn_after_move(old, moved_urns: set[str], by_urn: dict, destination: str) -> str:
    """The URN a moved resource (or a provider the move copies) has in the destination stack, as `pulumi state move`
    gives it (pulumi/pulumi pkg/cmd/pulumi/state/state_move.go) from CLI 3.226.0, the first that can move a team
    (pulumi/pulumi#22141): a resource whose parent stays behind goes under the root stack and its URN is rebuilt without
    the old parent's type (pulumi/pulumi#21953), and a moved child's URN follows its parent's."""
    def current(r) -> str:
        if r.parent in moved_urns:  # qualified by the parent's type, as the mock monitor qualifies it (its last type only)
            parent_type = current(by_urn[r.parent]).split("::")[2].rsplit("$", 1)[-1]
            return f"urn:pulumi:{destination}::{contract.PROJECT}::{parent_type}${r.type}::{r.name}"
        return f"urn:pulumi:{destination}::{contract.PROJECT}::{r.type}::{r.name}"
    return current(old)


def canonical(inputs: dict) -> str:
    return json.dumps(inputs, sort_keys=True, default=str)


INLINE_TEAMS = [(path.name, team.name) for path in STACK_FILES for team in read_inline_teams(path)]


def moved_team_variants() -> list:
    """Each stack file's first inline team in the default lane (three evaluations of the real program each, ~6 s of
    CPU); its other teams, the same move by the same code, in the full lane."""
    firsts = {f: t for f, t in reversed(INLINE_TEAMS)}
    return [pytest.param(f, t, id=f"{f}:{t}", marks=() if firsts[f] == t else
                         full("another team of the same stack moved out the same way", kept_by=ITSELF)) for f, t in INLINE_TEAMS]


@pytest.mark.parametrize("stack_file,team", moved_team_variants())
def test_a_deployed_team_moved_into_its_own_stack_is_adopted_not_recreated(tmp_path, stack_file, team):
    before = evaluate_stack_file(STACKS / stack_file)
    cfg = load_stack_file(STACKS / stack_file)
    (team_cfg,) = [t for t in cfg.teams if t.name == team]
    moved = moved_closure(before, state_move_urns(cfg, team_cfg))
    destination = team_stack_name(cfg.environment, team)

    platform_file, team_file = move_out(STACKS / stack_file, team, tmp_path)
    after_platform = evaluate_stack_file(platform_file)
    after_team = evaluate_stack_file(team_file, platform=after_platform)  # what it would evaluate first itself

    # What the state move leaves in the team stack (URNs rebuilt under the root stack), each claimed by one resource the
    # team program registers, under its own URN, with the same inputs: no create, no replace.
    claims = {}
    for r in after_team.resources:
        for urn in (engine_urn(r.urn), *r.aliases):
            claims[urn] = r
    providers = {r.provider.rsplit("::", 1)[0] for r in moved if r.provider}
    copied = [r for r in before.resources if r.type.startswith("pulumi:providers:") and r.urn in providers]
    assert {r.type for r in copied} == {"pulumi:providers:aws", "pulumi:providers:kubernetes"}
    moved_urns, by_urn = {r.urn for r in moved}, {r.urn: r for r in before.resources}
    adopted = set()
    for old in [*moved, *copied]:
        current = urn_after_move(old, moved_urns, by_urn, destination)
        assert current in claims, f"{old.type} {old.name}: the team stack would create it anew (nothing answers to {current})"
        new = claims[current]
        assert new.type == old.type
        assert canonical(new.inputs) == canonical(old.inputs), f"{old.type} {old.name}: its inputs differ, so it would be updated"
        adopted.add(id(new))
    # ... and the team stack registers nothing else but its reference to the platform.
    extra = [(r.type, r.name) for r in after_team.resources if id(r) not in adopted]
    assert extra == [("pulumi:pulumi:StackReference", f"{cfg.environment}-platform")]

    # The platform stack keeps every other resource with the same inputs and gains nothing.
    kept = {r.urn: r for r in before.resources if r.urn not in moved_urns}
    now = {r.urn: r for r in after_platform.resources}
    assert set(now) == set(kept)
    assert [u for u in kept if canonical(kept[u].inputs) != canonical(now[u].inputs)] == []
    assert team not in after_platform.outputs["team_role_arns"]
    assert after_team.outputs["role_arn"] == before.outputs["team_role_arns"][team]


def test_the_shipped_team_stacks_pass_the_policy_pack_and_join_their_cohort():
    from trainforge.platform.plan.plan import make_plan

    assert TEAM_STACK_FILES, "a shipped team stack shows the self-service path working end to end"
    for path in TEAM_STACK_FILES:
        plan = make_plan(path)
        assert plan.team is not None and plan.mandatory_failures == [], plan.violations
        cohort = load_cohort(path)
        assert cohort.declared_in(plan.team.name) == str(path)
        assert plan.team.name not in [t.name for t in read_inline_teams(cohort.source and Path(cohort.source))]
        assert len(plan.resources) == 43, sorted((r.type, r.name) for r in plan.resources)


def test_a_team_stack_builds_on_the_platform_stacks_real_outputs(tmp_path):
    platform_file, team_file = move_out(STACKS / "Pulumi.dev.yaml", "language", tmp_path)
    platform = evaluate_stack_file(platform_file)
    evaluation = evaluate_stack_file(team_file, platform=platform)  # what it would evaluate first itself
    (reference,) = evaluation.of_type("pulumi:pulumi:StackReference")
    assert reference.inputs["name"] == "organization/trainforge/dev"
    (role,) = evaluation.of_type("aws:iam/role:Role")
    issuer = platform.outputs["oidc_issuer_url"].removeprefix("https://")
    assert issuer in role.inputs["assumeRolePolicy"]  # trusts the platform cluster's OIDC provider
    (policy,) = evaluation.of_type("aws:iam/rolePolicy:RolePolicy")
    assert platform.outputs["bucket_arns"]["checkpoints"] in policy.inputs["policy"]
    volume = evaluation.named("kubernetes:core/v1:PersistentVolume", "persistentvolume-trainforge-fsx-language")
    assert volume.inputs["spec"]["csi"]["volumeHandle"].startswith(platform.outputs["fsx"]["id"])
    (provider,) = evaluation.of_type("pulumi:providers:kubernetes")
    assert provider.inputs["kubeconfig"]["value"] == platform.outputs["kubeconfig"]  # the provider marks it secret
    assert evaluation.outputs["namespace"] == "team-language"
    assert evaluation.outputs["gpu_quota"] == {"gpu-spot": 2}


def test_a_team_stack_refuses_a_platform_deployed_from_other_settings(tmp_path):
    platform_file, team_file = move_out(STACKS / "Pulumi.dev.yaml", "language", tmp_path)
    from trainforge.infra.engine import RecordingMocks

    deployed = evaluate_stack_file(platform_file)
    document = yaml.safe_load(platform_file.read_text())
    document["config"][CONFIG_KEY]["node_groups"][1]["max_size"] += 1  # the checkout moved on; the platform was not deployed
    platform_file.write_text(yaml.safe_dump(document))
    mocks = RecordingMocks("us-west-2")
    mocks.referenced["dev"] = deployed
    # offline.evaluate_stack_file would evaluate the changed file as the platform; here the platform is the deployed one.
    from trainforge.infra import engine
    from trainforge.platform.components.offline import program
    from trainforge.platform.components.program import STACKS_DIR
    from trainforge.stackconfig import read_team_stack_file

    token = STACKS_DIR.set(tmp_path)
    try:
        with pytest.raises(Exception, match="deployed from other settings.*pulumi up -s dev"):
            engine.evaluate(program, read_team_stack_file(team_file).config, "dev.team-language", mocks)
    finally:
        STACKS_DIR.reset(token)
    # Nothing that reads the platform was sent to the engine: every platform input waits for the check.
    created = sorted({r.type for r in mocks.resources})
    assert not [t for t in created if t.startswith(("kubernetes:", "aws:", "pulumi:providers:kubernetes"))], created


def test_the_deployers_cidr_set_at_deploy_does_not_count_as_other_settings():
    cfg = load_stack_file(STACKS / "Pulumi.dev.yaml")
    cidrs = cfg.cluster.model_copy(update={"public_access_cidrs": ["1.2.3.4/32"]})
    assert cfg.model_copy(update={"cluster": cidrs}).settings_digest() == cfg.settings_digest()
    larger = cfg.node_groups[1].model_copy(update={"max_size": cfg.node_groups[1].max_size + 1})
    assert cfg.model_copy(update={"node_groups": [cfg.node_groups[0], larger, *cfg.node_groups[2:]]}).settings_digest() != cfg.settings_digest()


def test_a_team_stack_under_a_name_that_is_not_a_team_stacks_is_told_how_to_name_it():
    from trainforge.platform.components.offline import evaluate

    with pytest.raises(pulumi.RunError, match="team stacks are named <env>.team-<team>"):
        evaluate({TEAM_CONFIG_KEY: {"cost_centre": "cc", "monthly_budget_usd": 1}}, "dev-audio")


def test_the_cohort_is_checked_across_stack_files(tmp_path):
    shutil.copy(STACKS / "Pulumi.dev.yaml", tmp_path)
    document = yaml.safe_load((STACKS / "Pulumi.dev.yaml").read_text())
    spot = document["config"][CONFIG_KEY]["teams"][0]["members"][0]

    def team_file(name: str, **fields) -> Path:
        path = tmp_path / f"Pulumi.dev.team-{name}.yaml"
        path.write_text(yaml.safe_dump({"config": {TEAM_CONFIG_KEY: {"cost_centre": f"cc-{name}", "monthly_budget_usd": 500, **fields}}}))
        return path

    fits = team_file("audio", gpu_quota={"gpu-spot": 2}, members=["arn:aws:iam::111122223333:role/sso-zoe"])
    cohort = load_cohort(tmp_path / "Pulumi.dev.yaml")
    assert [t.name for t in cohort.teams] == ["vision", "language", "audio"]
    assert cohort.declared_in("audio") == str(fits)
    assert load_stack_file(fits).teams == cohort.teams  # a team stack file names the same cohort

    # One more GPU than the spot groups reach, from a team in another file: refused, naming the files and the shares.
    over = team_file("speech", gpu_quota={"gpu-spot": 1})
    with pytest.raises(ConfigError, match=r"gpu-spot quotas add up to 9 GPUs \(vision 4, language 2, audio 2, speech 1\) but its node groups reach at most 8") as refused:
        load_cohort(tmp_path / "Pulumi.dev.yaml")
    assert str(refused.value).startswith(f"the teams of platform stack {tmp_path / 'Pulumi.dev.yaml'} and of its team stack files do not fit together")
    over.unlink()
    # The same principal in two teams, across files: one access entry per principal.
    twice = team_file("speech", members=[spot])
    with pytest.raises(ConfigError, match=rf"Pulumi.dev.team-speech.yaml: {TEAM_CONFIG_KEY}.members: .* also a member of team 'vision'"):
        load_cohort(tmp_path / "Pulumi.dev.yaml")
    twice.unlink()
    # A team declared in the platform stack and in its own: moved out but not removed from teams:.
    team_file("vision", gpu_quota={"gpu-spot": 1})
    with pytest.raises(ConfigError, match=r"names \['vision'\] are used twice"):
        load_cohort(tmp_path / "Pulumi.dev.yaml")


def test_bad_team_stack_files_name_the_field_and_the_fix(tmp_path):
    shutil.copy(STACKS / "Pulumi.dev.yaml", tmp_path)
    path = tmp_path / "Pulumi.dev.team-audio.yaml"
    cases = [
        ({TEAM_CONFIG_KEY: {"name": "speech", "cost_centre": "cc", "monthly_budget_usd": 1}}, "does not match the stack's team 'audio'"),
        ({TEAM_CONFIG_KEY: {"cost_centre": "cc", "monthly_budget_usd": 1, "gpu_qouta": {}}}, "trainforge:team.gpu_qouta"),
        ({TEAM_CONFIG_KEY: {"cost_centre": "cc", "monthly_budget_usd": 1}, CONFIG_KEY: {}}, "a team stack holds only trainforge:team"),
        ({}, "no trainforge:team key"),
    ]
    for config, message in cases:
        path.write_text(yaml.safe_dump({"config": config}))
        with pytest.raises(ConfigError, match=message):
            load_cohort(tmp_path / "Pulumi.dev.yaml")
    path.unlink()
    stray = tmp_path / "Pulumi.dev.team_audio.yaml"  # left out silently, its quota would escape the cohort's check
    stray.write_text(yaml.safe_dump({"config": {TEAM_CONFIG_KEY: {"cost_centre": "cc", "monthly_budget_usd": 1}}}))
    with pytest.raises(ConfigError, match=r"\['Pulumi.dev.team_audio.yaml'\] are named like neither .* Fix: rename them"):
        load_cohort(tmp_path / "Pulumi.dev.yaml")
    stray.unlink()
    # Given by name (plan --stack), a misnamed team stack file is told the team stacks' naming rule, not the platform's.
    team = {"config": {TEAM_CONFIG_KEY: {"cost_centre": "cc", "monthly_budget_usd": 1}}}
    for name in ("Pulumi.dev-team-audio.yaml", "Pulumi.dev.team-Audio.yaml"):
        (tmp_path / "given").mkdir(exist_ok=True)
        misnamed = tmp_path / "given" / name
        misnamed.write_text(yaml.safe_dump(team))
        with pytest.raises(ConfigError, match=r"team stack files are named Pulumi.<env>.team-<team>.yaml .* Fix: rename the file"):
            load_stack_file(misnamed)
        misnamed.unlink()
    lonely = tmp_path / "elsewhere" / "Pulumi.qa.team-audio.yaml"
    lonely.parent.mkdir()
    lonely.write_text(yaml.safe_dump({"config": {TEAM_CONFIG_KEY: {"cost_centre": "cc", "monthly_budget_usd": 1}}}))
    with pytest.raises(ConfigError, match="its platform stack file .*Pulumi.qa.yaml does not exist"):
        load_stack_file(lonely)


def test_the_platform_program_refuses_node_groups_too_small_for_its_team_stacks(tmp_path):
    platform_file, team_file = move_out(STACKS / "Pulumi.dev.yaml", "language", tmp_path)
    document = yaml.safe_load(platform_file.read_text())
    for group in document["config"][CONFIG_KEY]["node_groups"]:
        if group["capacity"] == "spot":
            group["max_size"] = 2  # 4 spot GPUs; vision (inline) 4 + language (its own stack) 2
    platform_file.write_text(yaml.safe_dump(document))
    with pytest.raises(pulumi.RunError, match="gpu-spot quotas add up to 6 GPUs"):
        evaluate_stack_file(platform_file)


def test_the_submitter_finds_a_team_declared_in_its_own_stack(tmp_path):
    platform_file, team_file = move_out(STACKS / "Pulumi.dev.yaml", "language", tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text((REPO / "examples" / "quickstart.yaml").read_text())
    document = yaml.safe_load(spec.read_text())
    document["team"] = "language"
    spec.write_text(yaml.safe_dump(document))
    for stack in (platform_file, team_file):
        result = run_cli("check", str(spec), "--stack", str(stack), home=tmp_path / "home")
        assert result.returncode == 0, result.stdout + result.stderr
        assert "language / gpu-spot" in result.stdout and "admitted" in result.stdout


def test_plan_of_a_team_stack_shows_its_quota_against_capacity_and_its_cost(tmp_path):
    platform_file, team_file = move_out(STACKS / "Pulumi.prod.yaml", "applied", tmp_path)
    result = run_cli("plan", "--stack", str(team_file), "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    plan = json.loads(result.stdout)
    assert plan["stack"] == "prod.team-applied" and plan["team"] == "applied"
    assert plan["policy"]["passed"], plan["policy"]["violations"]
    quota = {row["flavour"]: row for row in plan["quota"]}
    # applied: 32 spot (and may borrow 16 more), 16 on-demand; the cohort: foundation 16 + applied 32 + evaluation 8 spot.
    assert quota["gpu-spot"] == {"flavour": "gpu-spot", "team_gpus": 32, "borrowable": 16, "cohort_gpus": 56, "capacity": 64}
    assert quota["gpu-ondemand"]["cohort_gpus"] == 24 and quota["gpu-ondemand"]["capacity"] == 24
    lines = {line["item"]: line for line in plan["breakdown"]}
    assert lines["gpu-spot quota"]["at_max_usd"] > lines["gpu-spot quota"]["monthly_usd"] > 0
    # At most, what it may borrow runs too: 48 GPUs all month against a quarter of 32 expected.
    assert lines["gpu-spot quota"]["quantity"] == "32 GPUs + up to 16 borrowed"
    assert lines["gpu-spot quota"]["at_max_usd"] >= 48 / (0.25 * 32) * lines["gpu-spot quota"]["monthly_usd"]
    assert lines["monthly budget (cap)"]["at_max_usd"] == 40000
    assert "EKS control plane" not in lines  # the platform's costs are the platform stack's
    assert plan["resource_count"] < 60


def test_the_policy_pack_reads_the_platform_capacity_through_the_stack_reference(tmp_path):
    from trainforge.platform.plan.plan import policy_view
    from trainforge.policies.registry import check_stack, rules

    platform_file, team_file = move_out(STACKS / "Pulumi.prod.yaml", "applied", tmp_path)
    _, whole = policy_view(evaluate_stack_file(team_file))
    (rule,) = [r for r in rules() if r.name == "team-quota-within-platform-capacity"]
    assert list(check_stack(rule, whole)) == []
    shrunk = [r if r.resource_type != "pulumi:pulumi:StackReference" else
              type(r)(r.resource_type, r.name, r.urn, {**r.props, "outputs": {**r.props["outputs"], "gpu_capacity": {"gpu-spot": 16}}})
              for r in whole]
    (message, urn), *rest = check_stack(rule, shrunk)
    assert "asks for 32 gpu-spot GPUs, but the platform's node groups reach at most 16" in message
    assert rest == [(m, u) for m, u in rest if "gpu-ondemand" in m]


def test_plan_of_a_team_stack_against_a_revision_reads_that_revisions_platform():
    result = run_cli("plan", "--stack", "dev.team-audio", "--against-rev", "HEAD", "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    against = json.loads(result.stdout)["against"]
    assert against["added"] == [] and against["removed"] == [] and against["monthly_delta_usd"] == 0


def test_plan_against_another_checkout_names_the_teams_that_join_and_leave(tmp_path):
    from trainforge.platform.plan.plan import difference, make_plan

    platform_file, team_file = move_out(STACKS / "Pulumi.dev.yaml", "language", tmp_path / "with")
    without = tmp_path / "without"
    without.mkdir()
    shutil.copy(platform_file, without)
    diff = difference(make_plan(platform_file), make_plan(without / platform_file.name))
    assert diff.teams_removed == ["language"] and diff.teams_added == []
    assert diff.removed == []  # the platform stack's own resources are untouched: the team's are its stack's


def test_plan_of_the_platform_stack_shows_the_whole_cohorts_quotas_against_capacity(tmp_path):
    from trainforge.platform.plan.plan import make_plan

    platform_file, team_file = move_out(STACKS / "Pulumi.prod.yaml", "applied", tmp_path)
    plan = make_plan(platform_file).to_json()
    # The team stack's quota counts with the platform stack's own teams: foundation 16 + applied 32 + evaluation 8 spot.
    cohort = {row["flavour"]: row for row in plan["cohort_quota"]}
    assert cohort["gpu-spot"] == {"flavour": "gpu-spot", "teams": 3, "quota_gpus": 56, "capacity": 64, "free": 8}
    assert cohort["gpu-ondemand"]["free"] == 0
    stacks = {t["name"]: t["stack"] for t in plan["teams"]}
    assert stacks["applied"] == "prod.team-applied" and stacks["foundation"] == "prod"
    # The same numbers as the team stack's own plan reads.
    team_plan = make_plan(team_file).to_json()
    assert {r["flavour"]: r["cohort_gpus"] for r in team_plan["quota"]} == {f: r["quota_gpus"] for f, r in cohort.items()}


def test_a_capacity_problem_over_a_hundred_teams_names_the_largest_quotas_and_counts_the_rest():
    from trainforge.stackconfig.platform import SHARES_SHOWN, cohort_capacity_problems
    from trainforge.stackconfig.teams import TeamConfig

    cfg = load_stack_file(STACKS / "Pulumi.dev.yaml")  # 8 spot GPUs
    teams = [TeamConfig(name=f"t{i:03d}", cost_centre="cc", monthly_budget_usd=1, gpu_quota={"gpu-spot": 2 if i == 57 else 1})
             for i in range(100)]
    (problem,) = cohort_capacity_problems(cfg, teams)
    assert "add up to 101 GPUs (t057 2, t000 1, " in problem
    assert f", and {100 - SHARES_SHOWN} more teams) but its node groups reach at most 8" in problem
