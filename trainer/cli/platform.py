"""`trainforge platform verify`: platform engineers, after a `pulumi up` — is the platform working?"""

from __future__ import annotations

import json
from typing import Optional

import typer

from trainforge.trainer.cli.common import CONTEXT_OPTION, Output, STACK_NAME_OPTION, output_option

app = typer.Typer(no_args_is_help=True, help="Platform engineers: check a deployed stack.")


@app.command()
def verify(stack: str = STACK_NAME_OPTION,
           context: Optional[str] = CONTEXT_OPTION,
           output: Output = output_option()) -> None:
    """Every release deployed, every platform Deployment and DaemonSet ready, each team's queue active, Kueue, DCGM,
    the budget controller and the training pods scraped, no alert firing, the budget controller passing recently, MLflow
    answering. Exit 0 when all hold, 1 when something does not (each with its fix), 2 on a bad stack or kubeconfig."""
    from rich.console import Console

    from trainforge.errors import TrainforgeError
    from trainforge.stackconfig import load_stack_file
    from trainforge.stackconfig.loader import stack_path
    # Imported here (the CLI's lazy rule): the platform layer's expectations and the Kubernetes client.
    from trainforge.platform.plan.verify import Api, verify as run

    cfg = load_stack_file(stack_path(stack))
    try:
        api = Api(context)
    except Exception as exc:  # noqa: BLE001 - the client raises several types for a bad kubeconfig
        raise TrainforgeError("", f"no usable kubeconfig: {exc}. Fix: `aws eks update-kubeconfig --name {cfg.cluster_name} "
                                  f"--region {cfg.region}` as one of the stack's admins", exit_code=2) from None
    console = Console(stderr=True)
    with console.status("verifying") as status:
        report = run(cfg, api, on_check=lambda step: status.update(f"checking {step}"))
    if output is Output.json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        from trainforge.trainer.cli import views
        views.verify_table(cfg.environment, report)
    if report.problems:
        raise typer.Exit(1)
