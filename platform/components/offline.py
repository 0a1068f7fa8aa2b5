"""What `pulumi up` would create for a stack file, offline: the real program (the composition root) under the
mock engine (infra/engine.py), shown as tables. No AWS account, no Pulumi CLI.

    python -m trainforge.platform.components.offline stacks/Pulumi.dev.yaml
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pulumi

from typing import Any

from trainforge.infra import engine
from trainforge.infra.engine import Evaluation, RecordingMocks
from trainforge.platform.components.program import STACKS_DIR, main as pulumi_main
from trainforge.stackconfig import CONFIG_KEY, ConfigError, is_team_stack_file, read_stack_file, read_team_stack_file


def program() -> None:
    """The composition root as `pulumi preview` runs it; deploy blockers are the caller's to show (plan does)."""
    pulumi_main(refuse_blockers=False)


def evaluate(config: dict[str, Any], environment: str, mocks: RecordingMocks | None = None, *, sdk_shortcuts: bool = True) -> Evaluation:
    """The trainforge program for stack `environment` with a stack file's `config:` map, under the mock engine. The config
    is the whole cohort: no team stack files are read."""
    stacks_dir = STACKS_DIR.set(None)
    try:
        return engine.evaluate(program, config, environment, mocks, sdk_shortcuts=sdk_shortcuts)
    finally:
        STACKS_DIR.reset(stacks_dir)


def evaluate_stack_file(path: str | Path, mocks: RecordingMocks | None = None, platform: Evaluation | None = None) -> Evaluation:
    """The trainforge program for one stack file under the mock engine. A team stack's StackReference reads the outputs
    of its platform stack's evaluation (`platform`, or the platform's own stack file, evaluated first)."""
    path = Path(path)
    stacks_dir = STACKS_DIR.set(path.parent)
    try:
        if not is_team_stack_file(path):
            return engine.evaluate_stack_file(program, path, mocks)
        team_stack = read_team_stack_file(path)
        platform = platform or engine.evaluate_stack_file(program, team_stack.platform_path)
        account = (read_stack_file(team_stack.platform_path).config.get(CONFIG_KEY) or {}).get("account_id")
        mocks = mocks or RecordingMocks(platform.outputs["region"], account=account)
        mocks.referenced[team_stack.environment] = platform
        return engine.evaluate(program, team_stack.config, team_stack.stack, mocks)
    finally:
        STACKS_DIR.reset(stacks_dir)


def report(evaluation: Evaluation) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 150)
    out = evaluation.outputs
    if "team" in out:  # a team stack: its own resources on the platform it references
        console.print(f"[bold]trainforge[/] team stack [cyan]{evaluation.environment}[/]: team {out['team']} "
                      f"(namespace {out['namespace']}, GPU quota {out['gpu_quota']}): {len(evaluation.resources)} resources "
                      f"registered in {evaluation.seconds:.2f} s under the Pulumi mock engine")
        _counts(console, evaluation)
        return
    console.print(f"[bold]trainforge[/] stack [cyan]{evaluation.environment}[/] ({out['region']}): "
                  f"{len(evaluation.resources)} resources registered in {evaluation.seconds:.2f} s under the Pulumi mock engine")

    pools = Table(title="Node groups", title_justify="left")
    for col in ("node group", "flavour", "capacity", "instance types", "min/desired/max", "GPUs/node", "EFA ifaces", "taints"):
        pools.add_column(col)
    for ng in evaluation.of_type("aws:eks/nodeGroup:NodeGroup"):
        lt = next(r for r in evaluation.of_type("aws:ec2/launchTemplate:LaunchTemplate") if r.name == ng.name)
        efa = sum(1 for i in lt.inputs.get("networkInterfaces") or [] if i["interfaceType"] != "interface")
        flavour = ng.inputs["labels"].get("trainforge.io/node-flavour", "")
        gpus = out["node_flavours"][flavour]["gpus_per_node"]
        s = ng.inputs["scalingConfig"]
        pools.add_row(ng.inputs["labels"]["trainforge.io/node-group"], flavour, ng.inputs["capacityType"], ", ".join(ng.inputs["instanceTypes"]),
                      f"{s['minSize']:.0f}/{s['desiredSize']:.0f}/{s['maxSize']:.0f}", str(gpus), str(efa or "-"),
                      ", ".join(f"{t['key']}:{t['effect']}" for t in ng.inputs.get("taints") or []) or "-")
    console.print(pools)

    fsx = evaluation.of_type("aws:fsx/lustreFileSystem:LustreFileSystem")[0].inputs
    throughput = fsx.get("perUnitStorageThroughput")
    console.print(f"FSx for Lustre: {fsx['deploymentType']} {fsx['storageCapacity']:.0f} GiB in {out['fsx']['availability_zone']}"
                  + (f", {throughput:.0f} MB/s/TiB" if throughput else "")
                  + f"; buckets: {', '.join(out['buckets'].values())}")
    console.print(f"GPU capacity by flavour: {out['gpu_capacity']}")

    charts = Table(title="Helm charts (the Kubernetes layer)", title_justify="left")
    for col in ("release", "chart", "version", "namespace"):
        charts.add_column(col)
    for release in evaluation.of_type("kubernetes:helm.sh/v3:Release"):
        charts.add_row(release.inputs["name"], release.inputs["chart"], release.inputs["version"], release.inputs["namespace"])
    console.print(charts)

    _counts(console, evaluation)


def _counts(console: Any, evaluation: Evaluation) -> None:
    from rich.table import Table

    counts = Table(title="Resources by type", title_justify="left")
    counts.add_column("type")
    counts.add_column("count", justify="right")
    for type_token, n in sorted(Counter(r.type for r in evaluation.resources).items()):
        counts.add_row(type_token, str(n))
    console.print(counts)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    paths = [Path(a) for a in args] or sorted(Path("stacks").glob("Pulumi.*.yaml"))  # platform and team stacks
    for path in paths:
        try:
            report(evaluate_stack_file(path))
        except (ConfigError, pulumi.RunError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
