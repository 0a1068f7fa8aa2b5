"""`trainforge prices show | refresh`: the price table estimates use, and fetching a region's current prices."""

from __future__ import annotations

import json
from typing import Optional

import typer

from trainforge import paths
from trainforge.trainer.cli.common import Output, output_option

app = typer.Typer(no_args_is_help=True, help="The price table estimates use: show it, refresh it from AWS.")


@app.command("show")
def show(region: str = typer.Option("us-east-1", help="AWS region"),
         output: Output = output_option()) -> None:
    """Per instance type: on-demand and spot USD per hour in a region, and where each number comes from."""
    from trainforge.errors import TrainforgeError
    from trainforge.pricing import region_prices
    from trainforge.trainer.cli import views
    rows = region_prices(region)
    if not rows:
        raise TrainforgeError("", [f"no prices for region {region!r}. Fix: `trainforge prices refresh --region {region}`"])
    if output is Output.json:
        typer.echo(json.dumps({"region": region, "prices": rows}, indent=2))
        return
    views.prices_table(region, rows)


@app.command("refresh")
def refresh(region: str = typer.Option("us-east-1", help="AWS region to price"),
            instance_type: Optional[list[str]] = typer.Option(None, "--instance-type", help="repeatable; default: every type in the table"),
            lookback_hours: float = typer.Option(24.0, min=0.1, help="spot price history window")) -> None:
    """Fetch on-demand prices (AWS Pricing API) and spot prices (EC2 spot price history) for a region."""
    import datetime as dt

    from rich.progress import Progress

    from trainforge.pricing import price_table
    from trainforge.trainer import price_refresh
    from trainforge.trainer.cli import views
    paths.refreshed_prices_file(region)  # the region names a file: refused before AWS is asked if it is not a region
    types = list(dict.fromkeys(instance_type or price_refresh.default_instance_types()))
    before = price_table()
    with Progress(transient=True) as progress:
        task = progress.add_task(f"pricing {len(types)} instance types in {region}", total=len(types) + 1)
        try:
            fetched = price_refresh.fetch(region, types, dt.timedelta(hours=lookback_hours),
                                          on_progress=lambda what: progress.update(task, advance=1, description=f"{region}: {what}"))
        except price_refresh.PriceRefreshError as exc:
            progress.stop()
            raise price_refresh.PriceRefreshError(f"{exc}. Nothing was changed.") from None
    path = price_refresh.save(fetched)
    views.refreshed_table(fetched, types, before, path)
