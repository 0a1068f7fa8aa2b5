"""`trainforge`: the researcher's front door. Starts fast: no torch, pulumi or mlflow on import."""

from __future__ import annotations

import json
import os
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


KIND_NAMES = {Kind.trainjob: "TrainJob", Kind.pytorchjob: "PyTorchJob"}


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


# ---- the local backend -----------------------------------------------------------------------------------------

def _job_cost(state) -> dict:
    """AWS-equivalent cost of the node-hours a job used: on-demand, spot, and as submitted.

    Priced in the region of the stack the job was admitted against; a job submitted without a stack has no
    region, so the price table's first (reference) region stands in, and the output says which was used.
    """
    from trainforge.trainer.pricing import PriceUnknown, price_table
    hours = state.nodes * state.run_seconds / 3600
    out = {"node_hours": round(hours, 4), "on_demand_usd": None, "spot_usd": None, "cost_usd": None, "priced_in": None}
    if state.instance_type:
        try:
            table = price_table()
            out["priced_in"] = state.region or table.regions[0]
            quote = table.quote(state.instance_type, out["priced_in"])
            on_demand, spot = quote.on_demand * hours, quote.spot * hours
        except PriceUnknown:
            return out
        out.update(on_demand_usd=round(on_demand, 4), spot_usd=round(spot, 4),
                   cost_usd=round(spot if state.capacity == "spot" else on_demand, 4), savings_usd=round(on_demand - spot, 4))
    return out


def _summary(spec, state) -> None:
    from rich.console import Console
    from rich.table import Table

    from trainforge.trainer.local import job_dir, progress
    info = progress(spec.name)
    result = info.get("result") or {}
    cost = _job_cost(state)
    table = Table(title=f"{spec.name}: {state.state}", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("wall time", f"{state.run_seconds:.1f} s over {state.attempts} attempt(s), {state.restarts} restart(s)")
    if info.get("step"):
        table.add_row("steps", f"{info['step']} (last loss {info['loss']:.4f}, {info['samples'] / info['step_s']:.0f} samples/s at the end)")
    if result.get("last_eval"):
        table.add_row("final eval", ", ".join(f"{k} {v:.4f}" for k, v in result["last_eval"].items()))
    table.add_row("checkpoints", f"{', '.join(info['checkpoints']) or 'none'} in {job_dir(spec.name) / 'checkpoints'}")
    if os.environ.get("MLFLOW_TRACKING_URI"):
        table.add_row("MLflow", f"{os.environ['MLFLOW_TRACKING_URI']}, experiment {spec.tracking.experiment!r}, tag trainforge.job_id={spec.name}")
    if cost["on_demand_usd"] is not None:
        table.add_row("on AWS", f"{cost['node_hours']:.3f} node-hours of {state.instance_type}: ${cost['on_demand_usd']:.2f} on-demand, "
                      f"${cost['spot_usd']:.2f} spot ({cost['priced_in']} prices)")
    if state.reason:
        table.add_row("note", state.reason)
    Console().print(table)


class Backend(str, Enum):
    local = "local"
    kubernetes = "kubernetes"


def _admit_or_exit(spec, stack: Path, spent: float) -> str:
    """Check quota, max cost and budget against the stack; return the stack's region (where the job is priced)."""
    from trainforge.trainer.admission import admit
    platform = _platform(stack)
    decision = admit(spec, platform, spent_this_month_usd=spent)
    if not decision.admitted:
        for problem in decision.problems:
            typer.echo(f"  - {problem}", err=True)
        _fail(f"job {spec.name!r} not admitted; nothing was started", code=3)
    return platform.region


def _local_spent_this_month(team: str) -> float:
    import datetime

    from trainforge.trainer.local import all_jobs
    month = datetime.date.today().replace(day=1)
    start = datetime.datetime.combine(month, datetime.time()).timestamp()
    return sum(_job_cost(j)["cost_usd"] or 0.0 for j in all_jobs() if j.team == team and (j.started_at or j.created_at) >= start)


def _cluster(context: Optional[str]):
    from trainforge.trainer.kube import Cluster, ClusterError
    try:
        return Cluster(context)
    except ClusterError as exc:
        _fail(str(exc))


def _submit_kubernetes(spec, kind: Kind, context: Optional[str], stack: Optional[Path], spent: float) -> None:
    from trainforge.trainer.admission import admit
    from trainforge.trainer.kube import ClusterError
    from trainforge.trainer.render import render as render_spec
    if stack is None:
        _fail("the kubernetes backend checks quota and budget against the environment's stack before creating anything. "
              "Fix: --stack stacks/Pulumi.<env>.yaml")
    platform = _platform(stack)
    decision = admit(spec, platform, spent_this_month_usd=spent)
    cluster = _cluster(context)
    if decision.admitted and decision.flavour is not None:
        try:  # the live ClusterQueue wins over the stack file if they disagree
            live = cluster.gpu_quota(spec.team).get(decision.flavour.value)
        except ClusterError as exc:
            live = None
            typer.echo(f"warning: could not read the team's ClusterQueue ({exc}); using the stack's quota", err=True)
        if live is not None and decision.gpus > live:
            decision.problems.append(f"resources: {decision.gpus} {decision.flavour.value} GPUs needed, the cluster's quota for "
                                     f"team {spec.team!r} is {live}. Fix: fewer GPUs, or a larger quota")
    if not decision.admitted:
        for problem in decision.problems:
            typer.echo(f"  - {problem}", err=True)
        _fail(f"job {spec.name!r} not admitted; nothing was created", code=3)
    team = next(t for t in platform.teams if t.name == spec.team)
    manifest = render_spec(spec, kind.value, team.cost_centre)
    try:
        cluster.create(manifest)
    except ClusterError as exc:
        _fail(str(exc), code=1)
    cost = decision.cost
    typer.echo(f"created {manifest['kind']} {manifest['metadata']['namespace']}/{spec.name} on {decision.flavour.value if decision.flavour else 'cpu'}"
               + (f"; estimate ${cost.expected_usd:,.2f} for {spec.limits.max_runtime}" if cost else "")
               + ". Kueue admits it when the team's quota has room.")


@app.command()
def submit(spec_file: Path = typer.Argument(..., help="job spec (YAML)"),
           detach: bool = typer.Option(False, "--detach", "-d", help="local: return at once; watch with status/logs"),
           backend: Backend = typer.Option(Backend.local, help="local (this machine) or kubernetes (the kubeconfig's cluster)"),
           kind: Kind = typer.Option(Kind.trainjob, "--kind", help="kubernetes: TrainJob or PyTorchJob"),
           context: Optional[str] = typer.Option(None, help="kubernetes: kubeconfig context"),
           stack: Optional[Path] = typer.Option(None, help="stack file: quota, cost limit and budget are checked first (required for kubernetes)"),
           spent: Optional[float] = typer.Option(None, help="team spend this month in USD (default: local jobs' cost this month)")) -> None:
    """Run a job. Locally: torchrun on this machine, supervised; resubmitting a name resumes it."""
    import signal
    import threading

    spec = _spec(spec_file)
    spent_usd = spent if spent is not None else _local_spent_this_month(spec.team)
    if backend is Backend.kubernetes:
        _submit_kubernetes(spec, kind, context, stack, spent_usd)
        return
    region = _admit_or_exit(spec, stack, spent_usd) if stack is not None else None
    from trainforge.trainer.local import JobAlreadyActive, Supervisor, prepare, progress, start_detached
    try:
        state = prepare(spec, region)
    except JobAlreadyActive as exc:
        _fail(str(exc))
    if detach:
        pid = start_detached(spec, state)
        typer.echo(f"submitted {spec.name} (supervisor pid {pid}); `trainforge status {spec.name}`, `trainforge logs -f {spec.name}`")
        return

    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
    supervisor = Supervisor(spec, state)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, supervisor.cancel)
    runner = threading.Thread(target=supervisor.run, daemon=True)
    max_steps = int(spec.hyperparameters.get("max_steps", 200))
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} steps"),
                  TextColumn("{task.fields[detail]}"), TimeRemainingColumn()) as bar:
        task = bar.add_task(spec.name, total=max_steps, detail="starting workers")
        runner.start()
        while runner.is_alive():
            runner.join(0.5)
            info = progress(spec.name)
            if info.get("step"):
                rate = info["samples"] / info["step_s"] if info.get("step_s") else 0
                bar.update(task, completed=info["step"], detail=f"loss {info['loss']:.4f}  {rate:.0f} samples/s  [{supervisor.state.state}]")
    _summary(spec, supervisor.state)
    raise typer.Exit(0 if supervisor.state.state == "succeeded" else 1)


def _state(name: str):
    from trainforge.trainer.local import JobState, job_dir
    if not (job_dir(name) / "state.json").exists():
        _fail(f"no local job named {name!r}. Fix: `trainforge list` shows the jobs")
    return JobState.load(name)


def _kube_target(team: Optional[str]):
    if team is None:
        _fail("the kubernetes backend needs the job's team (its namespace). Fix: --team <team>")


@app.command()
def status(name: str, output: Output = typer.Option(Output.table, "--output", "-o"),
           backend: Backend = typer.Option(Backend.local), team: Optional[str] = typer.Option(None, help="kubernetes: the job's team"),
           kind: Kind = typer.Option(Kind.trainjob, "--kind"), context: Optional[str] = typer.Option(None)) -> None:
    """State, attempts, progress and cost of a job."""
    from dataclasses import asdict

    if backend is Backend.kubernetes:
        from trainforge.trainer.kube import ClusterError, conditions
        _kube_target(team)
        try:
            obj = _cluster(context).get(KIND_NAMES[kind], team, name)
        except ClusterError as exc:
            _fail(str(exc), code=1)
        typer.echo(json.dumps(obj.get("status", {}), indent=2) if output is Output.json else f"{name}: {conditions(obj)}")
        return
    from trainforge.trainer.local import progress
    state = _state(name)
    report = {**asdict(state), "state": state.effective_state, "progress": progress(name), "cost": _job_cost(state)}
    if output is Output.json:
        typer.echo(json.dumps(report, indent=2, default=str))
        return
    info = report["progress"]
    typer.echo(f"{name}: {report['state']}  attempts {state.attempts}, restarts {state.restarts}"
               f"{', step ' + str(info['step']) if info.get('step') else ''}{', exit ' + str(state.exit_code) if state.exit_code is not None else ''}"
               f"{'  (' + state.reason + ')' if state.reason else ''}")


@app.command("list")
def list_jobs(output: Output = typer.Option(Output.table, "--output", "-o")) -> None:
    """Every local job, newest last."""
    from trainforge.trainer.local import all_jobs, progress
    jobs = all_jobs()
    rows = [{"name": j.name, "team": j.team, "state": j.effective_state, "attempts": j.attempts, "restarts": j.restarts,
             "step": progress(j.name).get("step"), "run_s": round(j.run_seconds, 1), **_job_cost(j)} for j in jobs]
    if output is Output.json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table
    table = Table(title="trainforge jobs (local)", title_justify="left")
    for column in ("name", "team", "state", "attempts", "restarts", "step", "run s", "$ as submitted"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["name"], r["team"], r["state"], str(r["attempts"]), str(r["restarts"]), str(r["step"] or "-"),
                      f"{r['run_s']:.1f}", f"{r['cost_usd']:.2f}" if r["cost_usd"] is not None else "-")
    Console().print(table)


@app.command()
def logs(name: str, follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the job ends"),
         backend: Backend = typer.Option(Backend.local), team: Optional[str] = typer.Option(None, help="kubernetes: the job's team"),
         kind: Kind = typer.Option(Kind.trainjob, "--kind"), context: Optional[str] = typer.Option(None)) -> None:
    """The job's log (all attempts)."""
    import time

    if backend is Backend.kubernetes:
        from trainforge.trainer.kube import ClusterError
        _kube_target(team)
        try:
            for pod, text in _cluster(context).logs(KIND_NAMES[kind], team, name).items():
                typer.echo(f"==> {pod} <==\n{text}")
        except ClusterError as exc:
            _fail(str(exc), code=1)
        return
    from trainforge.trainer.local import ACTIVE, job_dir
    _state(name)
    path = job_dir(name) / "job.log"
    position = 0
    while True:
        if path.exists():
            with open(path) as f:
                f.seek(position)
                chunk = f.read()
                position = f.tell()
            if chunk:
                sys.stdout.write(chunk)
                sys.stdout.flush()
        state = _state(name)
        if not follow or state.effective_state not in ACTIVE:
            break
        time.sleep(0.5)


@app.command()
def cancel(name: str, backend: Backend = typer.Option(Backend.local), team: Optional[str] = typer.Option(None, help="kubernetes: the job's team"),
           kind: Kind = typer.Option(Kind.trainjob, "--kind"), context: Optional[str] = typer.Option(None)) -> None:
    """SIGTERM the job: workers write a checkpoint and stop; `submit` of the same spec resumes it."""
    if backend is Backend.kubernetes:
        from trainforge.trainer.kube import ClusterError
        _kube_target(team)
        try:
            _cluster(context).cancel(KIND_NAMES[kind], team, name)
        except ClusterError as exc:
            _fail(str(exc), code=1)
        typer.echo(f"{name}: deleted; its pods checkpoint within their grace period")
        return
    from trainforge.trainer.local import cancel as cancel_job
    state = _state(name)
    if state.effective_state not in ("pending", "running", "restarting"):
        _fail(f"job {name!r} is {state.effective_state}; nothing to cancel", code=1)
    state = cancel_job(name)
    typer.echo(f"{name}: {state.state}{' (' + state.reason + ')' if state.reason else ''}")


@app.command()
def cost(team: Optional[str] = typer.Option(None, help="only this team"),
         since: Optional[str] = typer.Option(None, help="only jobs started on or after this date (YYYY-MM-DD)"),
         output: Output = typer.Option(Output.table, "--output", "-o")) -> None:
    """What jobs cost (node-hours x price, spot vs on-demand) and a per-team summary."""
    import datetime

    from trainforge.trainer.local import all_jobs
    start = datetime.datetime.strptime(since, "%Y-%m-%d").timestamp() if since else 0.0
    jobs = [j for j in all_jobs() if (team is None or j.team == team) and (j.started_at or j.created_at) >= start]
    per_job = [{"name": j.name, "team": j.team, "state": j.effective_state, "instance_type": j.instance_type, "capacity": j.capacity,
                **_job_cost(j)} for j in jobs]
    teams: dict[str, dict] = {}
    for r in per_job:
        t = teams.setdefault(r["team"], {"team": r["team"], "jobs": 0, "node_hours": 0.0, "cost_usd": 0.0, "on_demand_usd": 0.0})
        t["jobs"] += 1
        t["node_hours"] += r["node_hours"]
        t["cost_usd"] += r["cost_usd"] or 0.0
        t["on_demand_usd"] += r["on_demand_usd"] or 0.0
    summary = [{**t, "savings_usd": round(t["on_demand_usd"] - t["cost_usd"], 4)} for t in teams.values()]
    if output is Output.json:
        typer.echo(json.dumps({"jobs": per_job, "teams": summary}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table
    jobs_table = Table(title="cost per job (AWS-equivalent, dated price table)", title_justify="left")
    for column in ("job", "team", "state", "instance", "capacity", "region", "node-hours", "$ as submitted", "$ on-demand", "$ saved by spot"):
        jobs_table.add_column(column)
    for r in per_job:
        money = lambda v: f"{v:.2f}" if v is not None else "-"  # noqa: E731
        jobs_table.add_row(r["name"], r["team"], r["state"], r["instance_type"] or "-", r["capacity"], r["priced_in"] or "-", f"{r['node_hours']:.3f}",
                           money(r["cost_usd"]), money(r["on_demand_usd"]), money(r.get("savings_usd")))
    teams_table = Table(title="per team", title_justify="left")
    for column in ("team", "jobs", "node-hours", "$ spent", "$ saved"):
        teams_table.add_column(column)
    for t in summary:
        teams_table.add_row(t["team"], str(t["jobs"]), f"{t['node_hours']:.3f}", f"{t['cost_usd']:.2f}", f"{t['savings_usd']:.2f}")
    console = Console()
    console.print(jobs_table)
    console.print(teams_table)


# ---- prices -------------------------------------------------------------------------------------------------------

prices_app = typer.Typer(no_args_is_help=True, help="The price table estimates use: show it, refresh it from AWS.")
app.add_typer(prices_app, name="prices")


@prices_app.command("show")
def prices_show(region: str = typer.Option("us-east-1", help="AWS region"),
                output: Output = typer.Option(Output.table, "--output", "-o")) -> None:
    """Per instance type: on-demand and spot USD per hour in a region, and where each number comes from."""
    from trainforge.trainer.pricing import PriceUnknown, price_table
    table = price_table()
    fresh = table.refreshed.get(region)
    names = sorted(set(table.on_demand) | set(fresh.on_demand if fresh else ()))
    rows = []
    for name in names:
        try:
            quote = table.quote(name, region)
        except PriceUnknown:
            continue
        rows.append({"instance_type": name, "on_demand_usd_per_hour": quote.on_demand, "spot_usd_per_hour": round(quote.spot, 6),
                     "spot_discount": round(1 - quote.spot / quote.on_demand, 3), "as_of": quote.as_of,
                     "source": "refreshed" if quote.refreshed else "shipped table"})
    if not rows:
        _fail(f"no prices for region {region!r}. Fix: `trainforge prices refresh --region {region}`")
    if output is Output.json:
        typer.echo(json.dumps({"region": region, "prices": rows}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table
    view = Table(title=f"prices in {region} (USD per instance-hour)", title_justify="left")
    for column in ("instance", "on-demand", "spot", "spot discount", "as of", "source"):
        view.add_column(column)
    for r in rows:
        view.add_row(r["instance_type"], f"{r['on_demand_usd_per_hour']:.4f}", f"{r['spot_usd_per_hour']:.4f}",
                     f"{r['spot_discount']:.0%}", r["as_of"], r["source"])
    Console().print(view)


@prices_app.command("refresh")
def prices_refresh(region: str = typer.Option("us-east-1", help="AWS region to price"),
                   instance_type: Optional[list[str]] = typer.Option(None, "--instance-type", help="repeatable; default: every type in the table"),
                   lookback_hours: float = typer.Option(24.0, min=0.1, help="spot price history window")) -> None:
    """Fetch on-demand prices (AWS Pricing API) and spot prices (EC2 spot price history) for a region."""
    import datetime as dt

    from rich.console import Console
    from rich.progress import Progress

    from trainforge.trainer import price_refresh
    from trainforge.trainer.pricing import PriceUnknown, price_table
    types = list(dict.fromkeys(instance_type or price_refresh.default_instance_types()))
    before = price_table()
    with Progress(transient=True) as progress:
        task = progress.add_task(f"pricing {len(types)} instance types in {region}", total=len(types) + 1)
        try:
            refresh = price_refresh.fetch(region, types, dt.timedelta(hours=lookback_hours),
                                          on_progress=lambda what: progress.update(task, advance=1, description=f"{region}: {what}"))
        except price_refresh.PriceRefreshError as exc:
            progress.stop()
            _fail(f"{exc}. Nothing was changed.", code=1)
    path = price_refresh.save(refresh)
    from rich.table import Table
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
