"""`trainforge plan`: preview a stack offline — resources, the policy pack's verdicts, the monthly cost, and the
difference against another stack or revision. The only command that loads pulumi, and only when it runs."""

from __future__ import annotations

import json
from typing import Optional

import typer

from trainforge.errors import EXIT_FAILED
from trainforge.trainer.cli.common import Output, STACK_NAME_OPTION, output_option


def plan(stack: str = STACK_NAME_OPTION,
         against: Optional[str] = typer.Option(None, help="compare with another stack (name or file)"),
         against_rev: Optional[str] = typer.Option(None, "--against-rev", help="compare with the same stack file at a git revision"),
         gpu_utilisation: float = typer.Option(0.25, min=0.0, max=1.0, help="share of each GPU group's range above min_size in use"),
         nat_gb: float = typer.Option(1000.0, min=0.0, help="GB each NAT gateway processes per month"),
         s3_gb: float = typer.Option(1000.0, min=0.0, help="GB stored per bucket"),
         output: Output = output_option()) -> None:
    """What `pulumi up` would create, whether the policy pack passes it, and what it costs per month. Exit 1 when a
    mandatory policy fails, 2 on a bad stack file."""
    # Imported here: pulumi, pulumi_aws and the whole program load only for this command (the CLI's one exception).
    from trainforge.platform.plan.costs import Assumptions
    from trainforge.platform.plan.plan import Plan, difference, make_plan, stack_file_at_revision, stack_path
    from trainforge.trainer.cli import views

    assumptions = Assumptions(gpu_utilisation=gpu_utilisation, nat_gb_per_month=nat_gb, s3_gb_per_bucket=s3_gb)
    path = stack_path(stack)
    current = make_plan(path, assumptions)
    base: Plan | None
    if against_rev and not against:
        with stack_file_at_revision(path, against_rev) as base_path:
            base = make_plan(base_path, assumptions)
    else:
        base = make_plan(stack_path(against), assumptions) if against else None
    diff = difference(base, current) if base else None
    if output is Output.json:
        document = current.to_json()
        if diff is not None and base is not None:
            document["against"] = {"stack": base.stack, "stack_file": str(against or f"{path}@{against_rev}"), **diff.to_json()}
        typer.echo(json.dumps(document, indent=2, default=str))
    else:
        views.plan_tables(current, diff, base)
    if current.mandatory_failures:
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    app.command()(plan)
