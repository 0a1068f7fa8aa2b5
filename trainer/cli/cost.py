"""`trainforge cost`: what jobs cost (node-hours x price, spot vs on-demand) and a per-team summary."""

from __future__ import annotations

import json
from typing import Optional

import typer

from trainforge.trainer.cli.common import BackendName, CONTEXT_OPTION, Output, output_option


def cost(team: Optional[str] = typer.Option(None, help="only this team"),
         since: Optional[str] = typer.Option(None, help="only jobs started on or after this date (YYYY-MM-DD)"),
         backend_name: BackendName = typer.Option(BackendName.local, "--backend", help="kubernetes: the team's month-to-date "
                                                  "spend against its budget, as the cluster's budget controller recorded it"),
         context: Optional[str] = CONTEXT_OPTION,
         output: Output = output_option()) -> None:
    """What jobs cost (node-hours x price, spot vs on-demand) and a per-team summary."""
    import datetime

    from trainforge.errors import TrainforgeError
    if backend_name is BackendName.kubernetes:
        _cluster_budget(team, context, output)
        return
    from trainforge.trainer import ledger
    from trainforge.trainer.backends.local_records import all_jobs
    from trainforge.trainer.cli import views
    try:
        start = datetime.datetime.strptime(since, "%Y-%m-%d").timestamp() if since else 0.0
    except ValueError:
        raise TrainforgeError("", [f"--since: {since!r} is not a date. Fix: YYYY-MM-DD, e.g. 2026-11-01"]) from None
    jobs = [j for j in all_jobs() if (team is None or j.team == team) and ledger.started_at(j) >= start]
    report = ledger.cost_report(jobs, {j.name: j.effective_state for j in jobs})
    if output is Output.json:
        typer.echo(json.dumps({"jobs": report.jobs, "teams": report.teams}, indent=2))
        return
    views.cost_tables(report)


def _cluster_budget(team: Optional[str], context: Optional[str], output: Output) -> None:
    from dataclasses import asdict

    from trainforge.errors import TrainforgeError
    from trainforge.trainer.backends.kubernetes import KubernetesBackend
    from trainforge.trainer.cli import views
    if team is None:
        raise TrainforgeError("", ["--team: the cluster keeps one budget per team. Fix: --team <team>"])
    spend = KubernetesBackend(team, context=context).budget(team)
    if output is Output.json:
        typer.echo(json.dumps({**asdict(spend), "left_usd": round(spend.left_usd, 2)}, indent=2))
        return
    views.team_budget_table(spend)


def register(app: typer.Typer) -> None:
    app.command()(cost)
