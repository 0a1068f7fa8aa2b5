"""Job commands: render, check, submit, status, list, logs, cancel."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from trainforge import paths
from trainforge.errors import EXIT_FAILED, EXIT_NOT_ADMITTED
from trainforge.exits import EXIT_OK
from trainforge.trainer.cli.common import (BACKEND_OPTION, BackendName, CONTEXT_OPTION, DEFAULT_STACK, KIND_OPTION, Kind,
                                            Output, TEAM_OPTION, backend, load_platform, load_spec, output_option, valid_spend)

def render(spec_file: Path = typer.Argument(..., help="job spec (YAML)"),
           kind: Kind = KIND_OPTION,
           stack: Optional[Path] = typer.Option(None, help="stack file: place the job on what the stack has, label its cost centre"),
           output: Output = output_option(Output.yaml)) -> None:
    """Print the Kubernetes manifest a job spec becomes."""
    import yaml

    from trainforge.trainer.backends import cost_centre_of
    from trainforge.trainer.placement import decide
    from trainforge.trainer.render import render as render_spec
    from trainforge.trainer.spec import with_image
    platform = load_platform(stack) if stack is not None else None
    original = load_spec(spec_file)
    spec = with_image(original, platform)
    placement = decide(spec, platform)
    manifest = render_spec(spec, placement, kind.value, cost_centre_of(spec, platform))
    if platform is None:
        typer.echo(assumed_without_a_stack(original, spec, placement), err=True)  # stderr: the manifest stays clean YAML
    typer.echo(json.dumps(manifest, indent=2) if output is Output.json else yaml.safe_dump(manifest, sort_keys=False))


def assumed_without_a_stack(original, spec, placement) -> str:
    """What only a stack knows and a preview without one had to assume, said so rather than invented silently."""
    assumed = []
    if placement.efa_devices_per_node:
        assumed.append(f"an EFA node group for {placement.instance_type} ({placement.efa_devices_per_node} EFA devices per node, "
                       "from the instance catalogue)")
    elif placement.instance_type:
        assumed.append(f"node groups offering {placement.instance_type} ({', '.join(f.value for f in placement.flavours)})")
    if not original.image:
        assumed.append(f"the public runtime image {spec.image}")
    assumed.append("no cost centre label, no region for prices")
    return ("note: rendered without --stack, so this assumed " + "; ".join(assumed) +
            ". The environment decides these: --stack stacks/Pulumi.<env>.yaml")


def check(spec_file: Path = typer.Argument(..., help="job spec (YAML)"),
          stack: Path = typer.Option(DEFAULT_STACK, help="the environment's stack file (team quotas, budgets, region)"),
          spent: Optional[float] = typer.Option(None, callback=valid_spend, help="what the team has spent this month, USD (default: local jobs' cost, "
                                                "or with --backend kubernetes the cluster's figure)"),
          backend_name: BackendName = typer.Option(BackendName.local, "--backend", help="kubernetes: the team's spend and budget "
                                                   "as the cluster's budget controller last recorded them"),
          context: Optional[str] = CONTEXT_OPTION,
          output: Output = output_option()) -> None:
    """Quota, cost limit and budget: would the cluster admit this job? Exit 0 yes, 3 no."""
    from trainforge.trainer.cli import views
    from trainforge.trainer.submission import admit_now
    spec, platform = load_spec(spec_file), load_platform(stack)
    target = backend(backend_name, team=spec.team, context=context) if backend_name is BackendName.kubernetes else None
    decision = admit_now(spec, platform, target, spent=spent)
    if output is Output.json:
        typer.echo(json.dumps(views.admission_json(decision), indent=2))
    else:
        views.admission_table(spec, platform, decision)
        for problem in decision.problems:
            typer.echo(f"  - {problem}", err=True)
    if not decision.admitted:
        raise typer.Exit(EXIT_NOT_ADMITTED)


def submit(spec_file: Path = typer.Argument(..., help="job spec (YAML)"),
           detach: bool = typer.Option(False, "--detach", "-d", help="local: return at once; watch with status/logs"),
           backend_name: BackendName = BACKEND_OPTION,
           kind: Kind = KIND_OPTION,
           context: Optional[str] = CONTEXT_OPTION,
           stack: Optional[Path] = typer.Option(None, help="stack file: quota, cost limit and budget are checked first (required for kubernetes)"),
           spent: Optional[float] = typer.Option(None, callback=valid_spend, help="team spend this month in USD (default: the cluster's figure on "
                                                 "kubernetes, local jobs' cost this month otherwise)")) -> None:
    """Run a job. Locally: torchrun on this machine, supervised; resubmitting a name resumes it."""
    from trainforge.errors import TrainforgeError
    from trainforge.trainer.admission import NotAdmitted, unchecked
    from trainforge.trainer.backends import JobPhase, cost_centre_of
    from trainforge.trainer.spec import with_image
    from trainforge.trainer.submission import admit_now
    spec = load_spec(spec_file)
    if backend_name is BackendName.kubernetes and stack is None:
        raise TrainforgeError("", ["the kubernetes backend checks quota and budget against the environment's stack before creating "
                                   "anything. Fix: --stack stacks/Pulumi.<env>.yaml"])
    platform = load_platform(stack) if stack is not None else None
    target = backend(backend_name, team=spec.team, kind=kind, context=context, cost_centre=cost_centre_of(spec, platform))
    spec = with_image(spec, platform, target.deployed_image(spec.team) if spec.image is None else None)
    if platform is None:
        decision = unchecked(spec)
    else:
        decision = admit_now(spec, platform, target, spent=spent)
    if not decision.admitted:
        raise NotAdmitted(spec.name, decision.problems, "created" if backend_name is BackendName.kubernetes else "started")
    if backend_name is BackendName.kubernetes or detach:
        typer.echo(target.submit(spec, decision, detach=True).summary)
        return
    from trainforge.trainer.backends.local import refuse_more_workers_than_this_machine_runs
    from trainforge.trainer.cli import views
    refuse_more_workers_than_this_machine_runs(spec)  # before the progress bar: nothing appears to start
    with views.JobProgress(spec) as bar:
        report = target.submit(spec, decision, on_progress=bar.update)
    views.run_summary(spec, report)
    raise typer.Exit(EXIT_OK if report.state == JobPhase.SUCCEEDED else EXIT_FAILED)


def status(name: str, output: Output = output_option(),
           backend_name: BackendName = BACKEND_OPTION,
           team: Optional[str] = TEAM_OPTION,
           kind: Kind = KIND_OPTION, context: Optional[str] = CONTEXT_OPTION) -> None:
    """State, attempts, progress and cost of a job."""
    report = backend(backend_name, team=team, kind=kind, context=context).status(paths.job_name(name))
    typer.echo(json.dumps(report.as_json(), indent=2, default=str) if output is Output.json else report.summary)


def list_jobs(output: Output = output_option(),
              backend_name: BackendName = BACKEND_OPTION,
              team: Optional[str] = TEAM_OPTION,
              kind: Kind = KIND_OPTION, context: Optional[str] = CONTEXT_OPTION) -> None:
    """Every job, newest last (kubernetes: the team's jobs of one kind)."""
    from trainforge.trainer.cli import views
    reports = backend(backend_name, team=team, kind=kind, context=context).list()
    rows = [views.job_row(r) for r in reports]
    if output is Output.json:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    views.jobs_table(rows, backend_name.value)


def logs(name: str, follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the job ends"),
         backend_name: BackendName = BACKEND_OPTION,
         team: Optional[str] = TEAM_OPTION,
         kind: Kind = KIND_OPTION, context: Optional[str] = CONTEXT_OPTION) -> None:
    """The job's log (all attempts)."""
    for chunk in backend(backend_name, team=team, kind=kind, context=context).logs(paths.job_name(name), follow=follow):
        sys.stdout.write(chunk)
        sys.stdout.flush()


def cancel(name: str, backend_name: BackendName = BACKEND_OPTION,
           team: Optional[str] = TEAM_OPTION,
           kind: Kind = KIND_OPTION, context: Optional[str] = CONTEXT_OPTION) -> None:
    """SIGTERM the job: workers write a checkpoint and stop; `submit` of the same spec resumes it."""
    typer.echo(backend(backend_name, team=team, kind=kind, context=context).cancel(paths.job_name(name)).summary)


def register(app: typer.Typer) -> None:
    for command in (render, check, submit, status, logs, cancel):
        app.command()(command)
    app.command("list")(list_jobs)
