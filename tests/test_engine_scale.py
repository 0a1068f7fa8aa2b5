"""Evaluation that grows linearly with teams (issue 24): the program gives each team's objects only their own team's
dependencies, and the mock engine's stand-ins for two SDK functions record exactly what the SDK's own would.

The dependency graph is what the engine records (RegisterResource's dependencies), the same graph `pulumi up` orders
creation and deletion by. Counting its edges is the structural half of the benchmark (benchmarks/bench_stack_eval.py
prints the seconds): a quadratic fan-in shows here as edges per team that grow with the number of teams.
"""

from __future__ import annotations

import signal
import sys

import pulumi
import pytest
from support.evaluated import evaluated
from support.repo import REPO

from trainforge import contract
from trainforge.infra import engine
from trainforge.platform.components.offline import evaluate
from trainforge.stackconfig import read_stack_file

PROD = REPO / "stacks" / "Pulumi.prod.yaml"
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_stack_eval  # noqa: E402 - found once benchmarks/ is on the path


def with_teams(count: int) -> dict:
    """prod with `count` generated teams: the benchmark's own (benchmarks/bench_stack_eval.py), so the two measure the same."""
    return bench_stack_eval.with_teams(read_stack_file(PROD).config, count)


def edges(evaluation) -> int:
    return sum(len(r.dependencies) for r in evaluation.resources)


def graph(evaluation) -> set:
    return {(r.type, r.name, r.id, repr(sorted(r.inputs.items(), key=str)), r.provider, r.urn, r.parent, r.dependencies)
            for r in evaluation.resources}


@pytest.fixture(scope="module")
def by_teams():
    return {n: evaluated(with_teams(n), "prod") for n in (2, 4, 8)}  # once per run, whichever worker runs these tests


def test_each_added_team_adds_the_same_resources_and_edges(by_teams):
    """Linear structure: going from 4 to 8 teams adds exactly twice what going from 2 to 4 added, in resources and in
    dependency edges. Every team depending on every team's volumes (the fan-in this replaced) made the edges per team
    grow with the number of teams: 3960 of 7078 edges at 10 teams."""
    two, four, eight = (by_teams[n] for n in (2, 4, 8))
    assert len(eight.resources) - len(four.resources) == 2 * (len(four.resources) - len(two.resources)) > 0
    assert edges(eight) - edges(four) == 2 * (edges(four) - edges(two)) > 0


def team_of(resource, by_urn: dict) -> str | None:
    """The team whose Tenancy component a resource was registered under, if any."""
    while resource is not None:
        if resource.type == "trainforge:platform:Tenancy":
            return resource.name.split("-team-", 1)[1]  # Tenancy(f"{layer}-team-{team}")
        resource = by_urn.get(resource.parent)
    return None


def test_a_teams_objects_wait_for_its_own_volumes_only(by_teams):
    """A team's claims bind to its own volumes (volumeName): its objects wait for those, never for another team's."""
    evaluation = by_teams[4]
    by_urn = {r.urn: r for r in evaluation.resources}
    volume_team = {r.urn: r.inputs["metadata"]["labels"][contract.LABEL_TEAM] for r in evaluation.resources
                   if r.type == "kubernetes:core/v1:PersistentVolume" and contract.LABEL_TEAM in r.inputs["metadata"].get("labels", {})}
    assert len(volume_team) == 2 * 4, "a read-write and a read-only volume per team"
    waits = 0
    for r in evaluation.resources:
        team = team_of(r, by_urn)
        for dep in r.dependencies & volume_team.keys():
            assert team == volume_team[dep], f"{r.type} {r.name} (team {team}) waits for team {volume_team[dep]}'s volume"
            waits += 1
    assert waits >= 4 * 2, "each team's objects still wait for its own volumes"


def test_the_sdk_shortcuts_record_what_the_sdk_records():
    """The engine's stand-ins for pulumi's `_resolve_depends_on` and `declare_dependency` (infra/engine.py) change how
    fast, never what: the same resources, inputs and dependency edges as the SDK's own functions, on the real program."""
    if not engine.replacements_apply():
        pytest.skip("the installed pulumi SDK's functions differ from those the shortcuts stand in for: the SDK's own run")
    config = with_teams(3)
    assert graph(evaluate(config, "prod", sdk_shortcuts=True)) == graph(evaluate(config, "prod", sdk_shortcuts=False))


class _Component(pulumi.ComponentResource):
    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("test:index:Component", name, None, opts)


def _cycle_through_a_component() -> None:
    """a waits for component c; c's child b waits for a: a cycle the SDK refuses rather than deadlock on."""
    c = _Component("c")
    a = pulumi.CustomResource("test:index:A", "a", None, pulumi.ResourceOptions(depends_on=[c]))
    pulumi.CustomResource("test:index:B", "b", None, pulumi.ResourceOptions(parent=c, depends_on=[a]))


def _output_in_depends_on() -> None:
    a = pulumi.CustomResource("test:index:A", "a", None)
    b = pulumi.CustomResource("test:index:B", "b", {"x": a.urn})
    pulumi.CustomResource("test:index:C", "c", None, pulumi.ResourceOptions(depends_on=[pulumi.Output.from_input(b).apply(lambda r: r), a]))


def _outcome(program, shortcuts: bool):
    def timeout(*_):
        raise TimeoutError("the evaluation hung")
    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(60)
    try:
        evaluation = engine.evaluate(program, {}, "dev", sdk_shortcuts=shortcuts)
        return "ok", sorted((r.type, r.name, tuple(sorted(d.rsplit("::", 1)[-1] for d in r.dependencies))) for r in evaluation.resources)
    except TimeoutError:
        raise
    except Exception as exc:  # noqa: BLE001 - the SDK's refusal, compared between the two runs
        return "raised", type(exc).__name__
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("program", [_cycle_through_a_component, _output_in_depends_on], ids=["a cycle", "an Output in depends_on"])
def test_the_shortcuts_refuse_and_resolve_as_the_sdk_does(program):
    if not engine.replacements_apply():
        pytest.skip("the installed pulumi SDK's functions differ from those the shortcuts stand in for: the SDK's own run")
    upstream = _outcome(program, False)
    assert _outcome(program, True) == upstream
    if program is _output_in_depends_on:
        assert upstream[0] == "ok" and ("test:index:C", "c", ("a", "b")) in upstream[1]
