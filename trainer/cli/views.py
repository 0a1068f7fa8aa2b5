"""How the CLI shows things: Rich tables, the progress bar, the end-of-run summary. Data in, nothing decided here."""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console
from rich.table import Table

from trainforge import run_tags
from trainforge.trainer.backends import LocalRun


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
    if not isinstance(d, LocalRun):
        return
    info = d.progress
    result = info.get("result") or {}
    table = Table(title=f"{spec.name}: {report.state}", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("wall time", f"{d.run_seconds:.1f} s over {d.attempts} attempt(s), {d.restarts} restart(s)")
    if info.get("step"):
        table.add_row("steps", f"{info['step']} (last loss {info['loss']:.4f}, {info['samples'] / info['step_s']:.0f} samples/s at the end)")
    if result.get("precision"):
        table.add_row("precision", f"{result['precision']} ({result.get('precision_reason', '')})")
    if result.get("last_eval"):
        table.add_row("final eval", ", ".join(f"{k} {v:.4f}" for k, v in result["last_eval"].items()))
    table.add_row("checkpoints", f"{', '.join(info['checkpoints']) or 'none'} in {job_dir(spec.name) / JOB_CHECKPOINT_DIR}")
    if os.environ.get("MLFLOW_TRACKING_URI"):
        table.add_row("MLflow", f"{os.environ['MLFLOW_TRACKING_URI']}, experiment {run_tags.team_experiment(spec.team, spec.tracking.experiment)!r}, "
                      f"tag {run_tags.JOB}={spec.name}")
    aws = on_aws_line(spec, d.instance_type, d.region)
    if aws:
        table.add_row("on AWS", aws)
    if d.reason:
        table.add_row("note", d.reason)
    Console().print(table)


def on_aws_line(spec, instance_type: str | None, region: str | None) -> str | None:
    """What the job's nodes cost per hour on AWS and what its limits allow: never this machine's wall time priced as GPU
    time (2 CPU cores emulating a GPU's work say nothing about how long the GPU takes)."""
    from trainforge.pricing import PriceUnknown, price_table
    if not instance_type:
        return None
    try:
        table = price_table()
        where = region or table.regions[0]
        quote = table.quote(instance_type, where)
    except PriceUnknown:
        return None
    nodes = spec.workers.nodes
    hourly = quote.hourly(spec.capacity) * nodes
    bound = hourly * spec.limits.max_runtime_hours
    limit = f", max_cost_usd ${spec.limits.max_cost_usd:.2f}" if spec.limits.max_cost_usd else ""
    return (f"{nodes} x {instance_type}: ${quote.on_demand * nodes:.2f}/h on-demand, ${quote.spot * nodes:.2f}/h spot ({where} prices); "
            f"at most ${bound:.2f} as submitted ({spec.capacity}) within max_runtime {spec.limits.max_runtime}{limit}. "
            "This machine's wall time is not an estimate of the time on that instance")


def job_row(report) -> dict[str, Any]:
    d = report.details
    if not isinstance(d, LocalRun):  # a cluster job: its status is the controller's
        return {"name": report.name, "team": report.team, "state": report.state}
    return {"name": report.name, "team": report.team, "state": report.state, "attempts": d.attempts, "restarts": d.restarts,
            "step": d.progress.get("step"), "run_s": round(d.run_seconds, 1), **d.cost}


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


KEY_PROPERTIES = {
    "aws:eks/nodeGroup:NodeGroup": lambda i: f"{', '.join(i.get('instanceTypes', []))} {i.get('capacityType')} "
                                             f"{i['scalingConfig']['minSize']:.0f}/{i['scalingConfig']['desiredSize']:.0f}/{i['scalingConfig']['maxSize']:.0f}",
    "aws:fsx/lustreFileSystem:LustreFileSystem": lambda i: f"{i.get('deploymentType')} {i.get('storageCapacity', 0):.0f} GiB"
                                                           + (f" {i['perUnitStorageThroughput']:.0f} MB/s/TiB" if i.get("perUnitStorageThroughput") else ""),
    "aws:rds/instance:Instance": lambda i: f"{i.get('instanceClass')} {i.get('allocatedStorage', 0):.0f} GB"
                                           + (" Multi-AZ" if i.get("multiAz") else ""),
    "aws:s3/bucket:Bucket": lambda i: "bucket",
    "kubernetes:helm.sh/v3:Release": lambda i: f"{i.get('chart')} {i.get('version')} in {i.get('namespace')}",
    "aws:eks/cluster:Cluster": lambda i: f"Kubernetes {i.get('version')}",
}


def verify_table(environment: str, report) -> None:
    console = Console()
    table = Table(title=f"trainforge platform verify: {environment}", title_justify="left")
    for column in ("", "check", "state", "fix"):
        table.add_column(column)
    for f in report.findings:
        table.add_row("[green]ok[/]" if f.ok else "[red]FAIL[/]", f.check, f.detail, f.fix)
    console.print(table)
    problems = len(report.problems)
    console.print(f"[green]all {len(report.findings)} checks passed[/] in {report.seconds:.1f} s" if not problems
                  else f"[red]{problems} of {len(report.findings)} checks failed[/] in {report.seconds:.1f} s")


def plan_tables(plan, diff=None, base=None) -> None:
    """The plan as tables: resources by component and type with key properties, teams, policy verdicts, cost, diff."""
    import sys
    from collections import Counter
    console = Console(width=None if sys.stdout.isatty() else 180)
    console.print(f"[bold]plan[/] of stack [cyan]{plan.stack}[/] ({plan.config.region}, {plan.path}): {len(plan.resources)} resources, "
                  f"evaluated offline in {plan.seconds:.1f} s")
    counts = Counter((plan.components.get(r.urn) or r.name, r.type) for r in plan.resources)
    table = Table(title="resources by component and type", title_justify="left")
    for column in ("component", "type", "count"):
        table.add_column(column, justify="right" if column == "count" else "left")
    for (component, type_token), n in sorted(counts.items()):
        table.add_row(component, type_token, str(n))
    console.print(table)
    key = Table(title="key properties", title_justify="left")
    for column in ("type", "name", "what"):
        key.add_column(column)
    for r in plan.resources:
        if r.type in KEY_PROPERTIES:
            key.add_row(r.type.rsplit(":", 1)[-1], r.name, KEY_PROPERTIES[r.type](r.inputs))
    console.print(key)
    if plan.team is not None:
        quota = Table(title=f"team {plan.team.name}: GPU quota against the cluster's capacity", title_justify="left")
        for column in ("flavour", "quota", "may borrow", "cohort's quotas (every team)", "capacity (node groups at max)"):
            quota.add_column(column, justify="left" if column == "flavour" else "right")
        for row in plan.quotas:
            quota.add_row(row.flavour, str(row.team_gpus), str(row.borrowable), str(row.cohort_gpus), str(row.capacity))
        console.print(quota)
    teams = Table(title="teams (the platform stack's and the team stacks')", title_justify="left")
    for column in ("team", "stack", "cost centre", "GPU quota", "FSx quota", "monthly budget"):
        teams.add_column(column)
    for team in plan.config.teams:
        gib = plan.config.fsx_quota_gib(team)
        teams.add_row(team.name, plan.declared_in.get(team.name, plan.stack), team.cost_centre,
                      ", ".join(f"{f.value}: {n}" for f, n in team.gpu_quota.items()),
                      "[red]none: can fill the file system[/]" if gib is None else f"{gib:,} GiB", f"${team.monthly_budget_usd:,.0f}")
    console.print(teams)
    fsx = plan.fsx_quotas
    console.print(f"FSx: the teams' quotas hold {fsx['quota_gib']:,} GiB of the file system's {fsx['capacity_gib']:,} GiB "
                  f"({fsx['free_gib']:,} GiB free for new quotas)" + (f"; [red]{len(fsx['unlimited'])} team(s) without a quota: "
                                                                      f"{', '.join(fsx['unlimited'])}[/]" if fsx["unlimited"] else ""))
    cohort = Table(title="the cohort's GPU quotas against the cluster's capacity (every team, every stack)", title_justify="left")
    for column in ("flavour", "teams", "quotas", "capacity (node groups at max)", "free for new quotas"):
        cohort.add_column(column, justify="left" if column == "flavour" else "right")
    for row in plan.cohort_quotas:
        cohort.add_row(row.flavour, str(row.teams), str(row.quota_gpus), str(row.capacity), str(row.free))
    console.print(cohort)
    if plan.violations:
        policy = Table(title="policy pack: violations", title_justify="left")
        for column in ("rule", "level", "resource", "what to change"):
            policy.add_column(column)
        for v in plan.violations:
            policy.add_row(v.rule, f"[red]{v.level}[/]" if v.level == "mandatory" else v.level, v.resource, v.message)
        console.print(policy)
    console.print("policy pack: [green]passed[/]" if not plan.mandatory_failures else f"policy pack: [red]{len(plan.mandatory_failures)} mandatory violation(s)[/]")
    for blocker in [] if plan.team else plan.config.cluster.deploy_blockers():
        console.print(f"[red]`pulumi up` refuses this stack until:[/] {blocker}")
    cost = Table(title=f"monthly cost (USD; instance prices of {plan.cost.as_of['instances']}, service prices of {plan.cost.as_of['services']})",
                 title_justify="left")
    for column in ("item", "quantity", "expected", "at min", "at max", "assumption"):
        cost.add_column(column, justify="right" if column in ("expected", "at min", "at max") else "left")
    money = lambda v: "[red]unknown[/]" if v is None else f"{v:,.2f}"  # noqa: E731
    for line in plan.cost.lines:
        cost.add_row(line.item, line.quantity, money(line.monthly_usd), "" if line.at_min_usd is None else money(line.at_min_usd),
                     "" if line.at_max_usd is None else money(line.at_max_usd), line.assumption)
    cost.add_row("[bold]total[/]", "", f"[bold]{plan.cost.monthly_usd:,.2f}[/]", "", "", "unknown prices: " + (", ".join(plan.cost.unknown) or "none"))
    console.print(cost)
    if diff is not None:
        changes = Table(title=f"against {base.stack} ({base.path}): +{len(diff.added)} -{len(diff.removed)} ~{len(diff.changed)} resources", title_justify="left")
        changes.add_column("")
        changes.add_column("resource")
        for mark, names in (("[green]+[/]", diff.added), ("[red]-[/]", diff.removed), ("[yellow]~[/]", diff.changed)):
            for name in names:
                changes.add_row(mark, name)
        console.print(changes)
        for verb, teams in (("joins", diff.teams_added), ("leaves", diff.teams_removed)):
            for team in teams:  # a team stack's own resources are not this stack's: say who comes and goes
                console.print(f"team [cyan]{team}[/] {verb} the cohort")
        for team in diff.teams_removed:  # Kueue's finalizer holds an admitting queue: the update would wait on it, half done
            console.print(f"  before the update that removes it: [bold]trainforge platform drain-team {team} --stack "
                          f"{plan.stack}[/] (its ClusterQueue cannot go while Kueue admits its workloads)")
        dollars = Table(title=f"cost difference: {diff.monthly_delta_usd:+,.2f} USD/month", title_justify="left")
        for column in ("item", "before", "after", "delta"):
            dollars.add_column(column, justify="left" if column == "item" else "right")
        for row in diff.cost:
            dollars.add_row(row["item"], money(row["before"]), money(row["after"]), "unknown" if row["delta"] is None else f"{row['delta']:+,.2f}")
        console.print(dollars)


def team_budget_table(spend) -> None:
    table = Table(title=f"team {spend.team}: budget for {spend.month} (the cluster's budget controller, from OpenCost)", title_justify="left")
    for column in ("budget", "spent", "left", "used", "as of", "queue"):
        table.add_column(column)
    used = spend.spent_usd / spend.budget_usd if spend.budget_usd else 1.0
    queue = "held: over budget" if spend.held_for_budget else "stopped by the platform team" if spend.held else "open"
    table.add_row(f"${spend.budget_usd:,.2f}", f"${spend.spent_usd:,.2f}", f"${spend.left_usd:,.2f}", f"{used:.0%}",
                  spend.as_of or "no figure yet this month", queue)
    Console().print(table)
