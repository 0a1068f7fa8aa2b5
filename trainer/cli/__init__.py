"""`trainforge`: the researcher's front door. Starts fast: no torch, pulumi or mlflow on import.

One module per command group (jobs, cost, prices); each only parses, calls the module that does the work, and
presents the result (views.py). Every error a user can fix is a `TrainforgeError`, handled once, in `main`.
"""

from __future__ import annotations

import typer

from trainforge.trainer.cli import budget, cost, jobs, plan, platform, prices, sweep

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Submit, watch and cost training jobs — on this machine or on the trainforge cluster.")
jobs.register(app)
cost.register(app)
plan.register(app)
app.add_typer(prices.app, name="prices")
app.add_typer(budget.app, name="budget")
app.add_typer(sweep.app, name="sweep")
app.add_typer(platform.app, name="platform")


def main() -> None:
    from trainforge.errors import TrainforgeError

    try:
        app()
    except TrainforgeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(exc.exit_code) from None
