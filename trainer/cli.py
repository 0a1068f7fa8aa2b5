"""`trainforge`: the researcher's front door. Starts fast: no torch, pulumi or mlflow on import."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Submit, watch and cost training jobs — on this machine or on the trainforge cluster.")
DEFAULT_STACK = Path("stacks/Pulumi.dev.yaml")


class Kind(str, Enum):
    trainjob = "trainjob"
    pytorchjob = "pytorchjob"


class Output(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _spec(path: Path):
    from trainforge.trainer.spec import SpecError, load_spec
    try:
        return load_spec(path)
    except SpecError as exc:
        _fail(str(exc))


def _platform(stack: Path):
    from trainforge.infra.config import ConfigError, load_stack_file
    try:
        return load_stack_file(stack)
    except ConfigError as exc:
        _fail(str(exc))
    except FileNotFoundError:
        _fail(f"no stack file {stack}. Fix: --stack stacks/Pulumi.<env>.yaml")


@app.command()
def render(spec_file: Path = typer.Argument(..., help="job spec (YAML)"),
           kind: Kind = typer.Option(Kind.trainjob, "--kind", help="TrainJob (Kubeflow Trainer v2) or PyTorchJob (training-operator v1)"),
           stack: Optional[Path] = typer.Option(None, help="stack file for the team's cost centre label"),
           output: Output = typer.Option(Output.yaml, "--output", "-o")) -> None:
    """Print the Kubernetes manifest a job spec becomes."""
    import yaml

    from trainforge.trainer.render import render as render_spec
    spec = _spec(spec_file)
    cost_centre = None
    if stack is not None:
        team = next((t for t in _platform(stack).teams if t.name == spec.team), None)
        cost_centre = team.cost_centre if team else None
    manifest = render_spec(spec, kind.value, cost_centre)
    typer.echo(json.dumps(manifest, indent=2) if output is Output.json else yaml.safe_dump(manifest, sort_keys=False))


@app.command()
def check(spec_file: Path = typer.Argument(..., help="job spec (YAML)"),
          stack: Path = typer.Option(DEFAULT_STACK, help="the environment's stack file (team quotas, budgets, region)"),
          spent: float = typer.Option(0.0, help="what the team has spent this month, USD"),
          output: Output = typer.Option(Output.table, "--output", "-o")) -> None:
    """Quota, cost limit and budget: would the cluster admit this job? Exit 0 yes, 3 no."""
    from trainforge.trainer.admission import admit
    spec, platform = _spec(spec_file), _platform(stack)
    decision = admit(spec, platform, spent_this_month_usd=spent)
    cost = decision.cost
    if output is Output.json:
        typer.echo(json.dumps({
            "admitted": decision.admitted, "problems": decision.problems, "flavour": decision.flavour.value if decision.flavour else None,
            "gpus": decision.gpus, "estimate_usd": round(cost.expected_usd, 2) if cost else None,
            "on_demand_usd": round(cost.on_demand_usd, 2) if cost else None, "spot_usd": round(cost.spot_usd, 2) if cost else None,
            "prices_as_of": cost.as_of if cost else None}, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table
        table = Table(title=f"{spec.name} on {platform.environment} ({platform.region})", title_justify="left")
        table.add_column("")
        table.add_column("")
        table.add_row("team / flavour", f"{spec.team} / {decision.flavour.value if decision.flavour else '-'}")
        table.add_row("GPUs", f"{decision.gpus} ({spec.workers.nodes} nodes x {spec.resources.gpus()})")
        if cost:
            table.add_row("instance", f"{cost.instance_type}: ${cost.on_demand_hourly:.2f}/h on-demand, ${cost.spot_hourly:.2f}/h spot (prices of {cost.as_of})")
            table.add_row(f"cost for {spec.limits.max_runtime}", f"${cost.expected_usd:,.2f} as submitted ({spec.capacity}); "
                          f"on-demand ${cost.on_demand_usd:,.2f}, spot ${cost.spot_usd:,.2f}")
        table.add_row("verdict", "[green]admitted[/]" if decision.admitted else "[red]rejected[/]")
        Console(stderr=False).print(table)
        for problem in decision.problems:
            typer.echo(f"  - {problem}", err=True)
    if not decision.admitted:
        raise typer.Exit(3)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
