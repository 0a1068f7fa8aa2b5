"""How long the prod stack takes to evaluate under the Pulumi mock engine: the AWS layer alone, the whole platform
(AWS + Kubernetes layers), and how that grows with teams.

Prints a table of wall times and ratios against the shipped prod stack measured in the same run (medians of
--repeats runs). A benchmark, not a test: it never fails on a time.

    python benchmarks/bench_stack_eval.py [--repeats 3] [--teams 10 50 100 200] [--no-sdk-shortcuts]

Then the marginal cost per added resource between successive team counts, and the growth check of issue 24: the
marginal seconds per resource from 100 to 200 teams against those from 10 to 50 (linear: about 1x; the goal: <= 1.5x).

Then the same teams each in its own team stack (README, "Teams in their own stacks"): the platform stack alone (its
cohort check reads every team stack file), one team stack (what onboarding or changing a team evaluates), and the
platform stack plus every team stack, with the seconds per team stack at each count against those at the smallest.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from rich.console import Console
from rich.table import Table

import pulumi

from trainforge.infra import engine
from trainforge.infra.layer import build_aws_layer
from trainforge.platform.components.offline import evaluate, evaluate_stack_file
from trainforge.platform.components.program import config_from_pulumi
from trainforge.stackconfig import CONFIG_KEY, TEAM_CONFIG_KEY, parse, read_stack_file, team_stack_name

PROD = Path(__file__).resolve().parents[1] / "stacks" / "Pulumi.prod.yaml"


def fitting_quota(i: int) -> dict[str, int]:
    """Team i's GPU quota: one GPU of a flavour while prod's node groups have one left for it (64 spot, 64 EFA, 24
    on-demand), so the cohort's quotas never add up to more than the capacity (the stack refuses that)."""
    for flavour, first, capacity in (("gpu-spot", 0, 64), ("gpu-efa", 64, 64), ("gpu-ondemand", 128, 24)):
        if first <= i < first + capacity:
            return {flavour: 1}
    return {}


def with_teams(config: dict, count: int) -> dict:
    """prod with `count` teams, each with a one-GPU quota while the node groups have GPUs left (fitting_quota) and an
    equal share of the FSx file system (the stack refuses quotas that add up to more)."""
    config = copy.deepcopy(config)
    share = max(1, config[CONFIG_KEY]["fsx"]["storage_capacity_gib"] // max(1, count))
    config[CONFIG_KEY]["teams"] = [
        {"name": f"team-{i:03d}", "cost_centre": f"cc-{i:04d}", "monthly_budget_usd": 1000 + i,
         "gpu_quota": fitting_quota(i), "fsx_quota_gib": share,
         "members": [f"arn:aws:iam::444455556666:role/sso-user{i}"]}  # members are IAM roles (stack config refuses e-mails)
        for i in range(count)
    ]
    return config


def aws_layer_only() -> None:
    """The program without its Kubernetes layer: the baseline the platform layer's cost is measured against."""
    for name, value in build_aws_layer(config_from_pulumi()).outputs.items():
        pulumi.export(name, value)


def measure(config: dict, repeats: int, aws_only: bool = False, shortcuts: bool = True) -> tuple[float, float, int]:
    """Median seconds for config validation alone, for the program, and the resource count."""
    validate, whole, resources = [], [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        parse(config[CONFIG_KEY], environment="prod", source="bench")
        validate.append(time.perf_counter() - started)
        evaluation = (engine.evaluate(aws_layer_only, config, "prod", sdk_shortcuts=shortcuts) if aws_only
                      else evaluate(config, "prod", sdk_shortcuts=shortcuts))
        whole.append(evaluation.seconds)
        resources = len(evaluation.resources)
    return statistics.median(validate), statistics.median(whole), resources


def team_stacks_checkout(directory: Path, base: dict, count: int) -> tuple[Path, list[Path]]:
    """prod with no inline teams and `count` team stack files next to it (with_teams' teams, each in its own stack)."""
    platform = copy.deepcopy(base)
    teams = with_teams(base, count)[CONFIG_KEY]["teams"]
    platform[CONFIG_KEY]["teams"] = []
    platform_file = directory / "Pulumi.prod.yaml"
    platform_file.write_text(yaml.safe_dump({"config": platform}))
    team_files = []
    for team in teams:
        path = directory / f"Pulumi.{team_stack_name('prod', team['name'])}.yaml"
        path.write_text(yaml.safe_dump({"config": {TEAM_CONFIG_KEY: team}}))
        team_files.append(path)
    return platform_file, team_files


def measure_team_stacks(base: dict, counts: list[int], repeats: int, console: Console) -> None:
    table = Table(title=f"Teams in their own stacks (median of {repeats})", title_justify="left")
    for column in ("team stacks", "platform stack s", "one team stack s", "team stack resources", "platform + every team stack s",
                   "s per team stack", "ratio vs fewest"):
        table.add_column(column, justify="right")
    first = None
    for count in counts:
        with tempfile.TemporaryDirectory(prefix="trainforge-bench-") as scratch:
            platform_file, team_files = team_stacks_checkout(Path(scratch), base, count)
            platform_s, team_s, total_s, resources = [], [], [], 0
            for _ in range(repeats):
                platform = evaluate_stack_file(platform_file)
                seconds = [evaluate_stack_file(path, platform=platform).seconds for path in team_files]
                resources = len(evaluate_stack_file(team_files[0], platform=platform).resources)
                platform_s.append(platform.seconds)
                team_s.append(statistics.median(seconds))
                total_s.append(platform.seconds + sum(seconds))
        per_stack = (statistics.median(total_s) - statistics.median(platform_s)) / count
        first = first or per_stack
        table.add_row(str(count), f"{statistics.median(platform_s):.3f}", f"{statistics.median(team_s):.3f}", str(resources),
                      f"{statistics.median(total_s):.2f}", f"{per_stack:.3f}", f"{per_stack / first:.2f}x")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--teams", type=int, nargs="+", default=[10, 50, 100, 200])
    parser.add_argument("--no-sdk-shortcuts", action="store_true", help="the SDK's own dependency resolution (infra/engine.py)")
    parser.add_argument("--quick", action="store_true", help="one repeat, prod + 2 teams (CI runs this)")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.teams = 1, [2, 4]
    shortcuts = not args.no_sdk_shortcuts and engine.replacements_apply()

    base = read_stack_file(PROD).config
    evaluate(base, "prod")  # warm imports (pulumi_aws alone takes seconds) so they are not charged to the baseline
    cases = [("prod, AWS layer only", base, True), ("prod as shipped (AWS + Kubernetes)", base, False)] + \
        [(f"prod + {n} teams", with_teams(base, n), False) for n in args.teams]
    table = Table(title=f"Stack evaluation under the Pulumi mock engine (median of {args.repeats})", title_justify="left")
    for column in ("case", "teams", "resources", "config validation ms", "program s", "ratio vs AWS layer only"):
        table.add_column(column, justify="right" if column != "case" else "left")
    baseline = None
    by_teams: dict[int, tuple[int, float]] = {}
    for label, config, aws_only in cases:
        validate, whole, resources = measure(config, args.repeats, aws_only, shortcuts)
        baseline = baseline or whole
        table.add_row(label, str(len(config[CONFIG_KEY]["teams"])), str(resources), f"{validate * 1000:.2f}", f"{whole:.3f}", f"{whole / baseline:.2f}x")
        if label.startswith("prod + "):
            by_teams[len(config[CONFIG_KEY]["teams"])] = (resources, whole)
    console = Console(width=140)
    console.print(table)
    console.print(f"SDK shortcuts (infra/engine.py): {'on' if shortcuts else 'off: the SDK own dependency resolution'}")
    marginal = Table(title="Marginal cost per added resource", title_justify="left")
    for column in ("teams", "resources added", "seconds added", "ms per resource"):
        marginal.add_column(column, justify="right")
    counts = sorted(by_teams)
    per_resource: dict[tuple[int, int], float] = {}
    for low, high in zip(counts, counts[1:]):
        (r0, s0), (r1, s1) = by_teams[low], by_teams[high]
        per_resource[low, high] = (s1 - s0) / (r1 - r0)
        marginal.add_row(f"{low} -> {high}", str(r1 - r0), f"{s1 - s0:.3f}", f"{per_resource[low, high] * 1000:.2f}")
    console.print(marginal)
    if (10, 50) in per_resource and (100, 200) in per_resource:
        ratio = per_resource[100, 200] / per_resource[10, 50]
        console.print(f"growth: ms per resource 100->200 teams / 10->50 teams = {ratio:.2f}x (linear ~1x; goal <= 1.5x); "
                      f"prod + 100 teams {by_teams[100][1]:.1f} s (goal <= 10 s)")
    measure_team_stacks(base, args.teams, args.repeats, console)


if __name__ == "__main__":
    main()
