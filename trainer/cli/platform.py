"""`trainforge platform`: platform engineers' commands on a deployed stack — `verify` after a `pulumi up` (is the
platform working?), `drain-team` before a team's removal (so the `up` or `destroy` that deletes its queue goes through)."""

from __future__ import annotations

import json
from typing import Optional

import typer

from trainforge import contract
from trainforge.errors import EXIT_BAD_INPUT, EXIT_FAILED
from trainforge.trainer.cli.common import CONTEXT_OPTION, Output, STACK_NAME_OPTION, output_option

app = typer.Typer(no_args_is_help=True, help="Platform engineers: check a deployed stack; drain a team before removing it.")


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
                                  f"--region {cfg.region}` as one of the stack's admins", exit_code=EXIT_BAD_INPUT) from None
    console = Console(stderr=True)
    with console.status("verifying") as status:
        report = run(cfg, api, on_check=lambda step: status.update(f"checking {step}"))
    if output is Output.json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        from trainforge.trainer.cli import views
        views.verify_table(cfg.environment, report)
    if report.problems:
        raise typer.Exit(EXIT_FAILED)


@app.command("drain-team")
def drain_team(team: str = typer.Argument(..., help="the team to remove"),
               stack: str = STACK_NAME_OPTION,
               context: Optional[str] = CONTEXT_OPTION,
               timeout: str = typer.Option("15m", help="how long to wait for Kueue to evict the team's workloads")) -> None:
    """Before a team is removed: hold its ClusterQueue and evict what it admitted (stopPolicy HoldAndDrain), then wait
    until Kueue reports none admitted or reserving. Kueue holds a ClusterQueue with admitted workloads by its
    `resource-in-use` finalizer, so a removal without this waits on the queue until the update times out, half done.
    Then remove the team (its entry or its team stack) and `pulumi up` / `pulumi destroy`. Exit 0 once drained, 1 if
    workloads are still admitted at --timeout, 2 for a team the stack does not have."""
    import datetime
    import time

    from rich.console import Console

    from trainforge import durations
    from trainforge.errors import TrainforgeError
    from trainforge.stackconfig import load_stack_file
    from trainforge.stackconfig.loader import stack_path
    from trainforge.trainer.kube import Cluster

    cfg = load_stack_file(stack_path(stack))
    if team not in {t.name for t in cfg.teams}:
        raise TrainforgeError("", f"team {team!r} is not in stack {cfg.environment} (teams: {sorted(t.name for t in cfg.teams)}). "
                                  "Fix: drain the team before its entry or team stack file is removed", exit_code=EXIT_BAD_INPUT)
    try:
        wait_s = durations.seconds(timeout)
    except ValueError as exc:
        raise TrainforgeError("", f"--timeout: {exc}", exit_code=EXIT_BAD_INPUT) from None
    cluster = Cluster(context)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    cluster.drain_queue(team, f"drained {now} for the team's removal")
    console = Console(stderr=True)
    deadline = time.monotonic() + wait_s
    with console.status(f"draining ClusterQueue {contract.cluster_queue_name(team)}") as status:
        while True:
            held = _still_held(cluster.cluster_queue(team))
            if held == 0:
                break
            if time.monotonic() >= deadline:
                raise TrainforgeError("", f"ClusterQueue {contract.cluster_queue_name(team)} still holds {held} admitted or reserving "
                                          f"workloads after {timeout}. Fix: `kubectl get workloads -n {contract.namespace_name(team)}` "
                                          "shows them (a job that ignores its eviction); run this again to wait longer", exit_code=EXIT_FAILED)
            status.update(f"draining ClusterQueue {contract.cluster_queue_name(team)}: {held} workloads still admitted or reserving")
            time.sleep(2)
    typer.echo(f"ClusterQueue {contract.cluster_queue_name(team)} is drained (held, nothing admitted): the team's removal can "
               "delete it now.")
    typer.echo(f"Next: remove team {team} from {stack_path(stack)} (or its team stack), then `pulumi up -s {cfg.environment}` "
               f"(or `pulumi destroy -s {cfg.environment}.team-{team}`).")


def _still_held(queue: dict) -> int:
    """Workloads the queue still admits or reserves quota for: what keeps Kueue's finalizer on it."""
    status = queue.get("status") or {}
    return int(status.get("admittedWorkloads") or 0) + int(status.get("reservingWorkloads") or 0)
