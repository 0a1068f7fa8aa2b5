"""How the CLI shows things: Rich tables, the progress bar, the end-of-run summary. Data in, nothing decided here."""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console
from rich.table import Table


def admission_json(decision) -> dict[str, Any]:
    cost = decision.cost
    return {"admitted": decision.admitted, "problems": decision.problems, "flavour": decision.flavour.value if decision.flavour else None,
            "candidate_flavours": [f.value for f in decision.placement.flavours],
            "gpus": decision.gpus, "estimate_usd": round(cost.expected_usd, 2) if cost else None,
            "on_demand_usd": round(cost.on_demand_usd, 2) if cost else None, "spot_usd": round(cost.spot_usd, 2) if cost else None,
            "prices_as_of": cost.as_of if cost else None}


def admission_table(spec, platform, decision) -> None:
    cost = decision.cost
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


class JobProgress:
    """The foreground submit's progress bar: steps done, loss, throughput, the supervisor's state."""

    def __init__(self, spec):
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
        self.spec = spec
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} steps"),
                            TextColumn("{task.fields[detail]}"), TimeRemainingColumn())
        self.task = self.bar.add_task(spec.name, total=int(spec.hyperparameters.get("max_steps", 200)), detail="starting workers")

    def __enter__(self) -> JobProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def update(self, info: dict[str, Any], state: str) -> None:
        if info.get("step"):
            rate = info["samples"] / info["step_s"] if info.get("step_s") else 0
            self.bar.update(self.task, completed=info["step"], detail=f"loss {info['loss']:.4f}  {rate:.0f} samples/s  [{state}]")


def run_summary(spec, report) -> None:
    """The end of a foreground run: wall time, steps, final eval, checkpoints, MLflow, AWS cost, and why it ended."""
    from trainforge.paths import JOB_CHECKPOINT_DIR, job_dir
    d = report.details
    info, cost = d["progress"], d["cost"]
    result = info.get("result") or {}
    table = Table(title=f"{spec.name}: {d['state']}", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("wall time", f"{d['run_seconds']:.1f} s over {d['attempts']} attempt(s), {d['restarts']} restart(s)")
    if info.get("step"):
        table.add_row("steps", f"{info['step']} (last loss {info['loss']:.4f}, {info['samples'] / info['step_s']:.0f} samples/s at the end)")
    if result.get("last_eval"):
        table.add_row("final eval", ", ".join(f"{k} {v:.4f}" for k, v in result["last_eval"].items()))
    table.add_row("checkpoints", f"{', '.join(info['checkpoints']) or 'none'} in {job_dir(spec.name) / JOB_CHECKPOINT_DIR}")
    if os.environ.get("MLFLOW_TRACKING_URI"):
        table.add_row("MLflow", f"{os.environ['MLFLOW_TRACKING_URI']}, experiment {spec.tracking.experiment!r}, tag trainforge.job_id={spec.name}")
    if cost["on_demand_usd"] is not None:
        table.add_row("on AWS", f"{cost['node_hours']:.3f} node-hours of {d['instance_type']}: ${cost['on_demand_usd']:.2f} on-demand, "
                      f"${cost['spot_usd']:.2f} spot ({cost['priced_in']} prices)")
    if d.get("reason"):
        table.add_row("note", d["reason"])
    Console().print(table)


def job_row(report) -> dict[str, Any]:
    d = report.details
    if "progress" not in d:  # a cluster job: its status is the controller's
        return {"name": report.name, "team": report.team, "state": report.state}
    return {"name": report.name, "team": report.team, "state": report.state, "attempts": d["attempts"], "restarts": d["restarts"],
            "step": d["progress"].get("step"), "run_s": round(d["run_seconds"], 1), **d["cost"]}


def jobs_table(rows: list[dict[str, Any]], where: str) -> None:
    table = Table(title=f"trainforge jobs ({where})", title_justify="left")
    columns = ("name", "team", "state", "attempts", "restarts", "step", "run s", "$ as submitted")
    for column in columns:
        table.add_column(column)
    for r in rows:
        money = r.get("cost_usd")
        table.add_row(r["name"], r["team"], r["state"], str(r.get("attempts", "-")), str(r.get("restarts", "-")), str(r.get("step") or "-"),
                      f"{r['run_s']:.1f}" if "run_s" in r else "-", f"{money:.2f}" if money is not None else "-")
    Console().print(table)


def cost_tables(report) -> None:
    def money(v):
        return f"{v:.2f}" if v is not None else "-"

    jobs_table_ = Table(title="cost per job (AWS-equivalent, dated price table)", title_justify="left")
    for column in ("job", "team", "state", "instance", "capacity", "region", "node-hours", "$ as submitted", "$ on-demand", "$ saved by spot"):
        jobs_table_.add_column(column)
    for r in report.jobs:
        jobs_table_.add_row(r["name"], r["team"], r["state"], r["instance_type"] or "-", r["capacity"], r["priced_in"] or "-", f"{r['node_hours']:.3f}",
                            money(r["cost_usd"]), money(r["on_demand_usd"]), money(r.get("savings_usd")))
    teams_table = Table(title="per team", title_justify="left")
    for column in ("team", "jobs", "node-hours", "$ spent", "$ saved"):
        teams_table.add_column(column)
    for t in report.teams:
        teams_table.add_row(t["team"], str(t["jobs"]), f"{t['node_hours']:.3f}", f"{t['cost_usd']:.2f}", f"{t['savings_usd']:.2f}")
    console = Console()
    console.print(jobs_table_)
    console.print(teams_table)


def prices_table(region: str, rows: list[dict[str, Any]]) -> None:
    view = Table(title=f"prices in {region} (USD per instance-hour)", title_justify="left")
    for column in ("instance", "on-demand", "spot", "spot discount", "as of", "source"):
        view.add_column(column)
    for r in rows:
        view.add_row(r["instance_type"], f"{r['on_demand_usd_per_hour']:.4f}", f"{r['spot_usd_per_hour']:.4f}",
                     f"{r['spot_discount']:.0%}", r["as_of"], r["source"])
    Console().print(view)


def refreshed_table(refresh, types: list[str], before, path) -> None:
    from trainforge.pricing import PriceUnknown
    region = refresh.region
    view = Table(title=f"refreshed {region} as of {refresh.as_of} -> {path}", title_justify="left")
    for column in ("instance", "on-demand", "was", "spot (median)", "spot low", "AZs"):
        view.add_column(column)
    for name in types:
        if name not in refresh.on_demand:
            continue
        try:
            was = f"{before.quote(name, region).on_demand:.4f}"
        except PriceUnknown:
            was = "-"
        spot = refresh.spot.get(name)
        view.add_row(name, f"{refresh.on_demand[name]:.4f}", was, f"{spot.median:.4f}" if spot else "-",
                     f"{spot.low:.4f}" if spot else "-", str(spot.zones) if spot else "0")
    console = Console()
    console.print(view)
    if refresh.not_offered:
        console.print(f"not offered in {region} (kept out of the file): {', '.join(refresh.not_offered)}")
