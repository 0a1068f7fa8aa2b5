"""`trainforge sweep`: hyperparameter sweeps whose trials are real training jobs (trainer/sweeps/)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperGroup

from trainforge.errors import EXIT_FAILED, EXIT_NOT_ADMITTED
from trainforge.trainer.sweeps.outages import GIVE_UP_AFTER_S
from trainforge.trainer.sweeps.record import SweepRecord
from trainforge.trainer.cli.common import BackendName, CONTEXT_OPTION, KIND_OPTION, Kind, Output, output_option, valid_spend
from trainforge.trainer.sweeps.targets import SweepTarget, locate
from trainforge.trainer.sweeps.keys import StudyKey, TrialFact, TrialKey, fact_key


class RunByDefault(TyperGroup):
    """`trainforge sweep sweep.yaml` is `trainforge sweep run sweep.yaml`."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().resolve_command(ctx, args)


app = typer.Typer(cls=RunByDefault, no_args_is_help=True,
                  help="Hyperparameter sweeps: `trainforge sweep sweep.yaml` runs (or continues) one; status, report, best, cancel.")


@app.command()
def run(sweep_file: Path = typer.Argument(..., help="sweep spec (YAML)"),
        backend_name: BackendName = typer.Option(BackendName.local, "--backend", help="local: trials on this machine; kubernetes: a TrainJob per trial"),
        stack: Optional[Path] = typer.Option(None, help="stack file: every trial is admitted against its quota, cost limit and budget"),
        storage: Optional[str] = typer.Option(None, help="the study's storage URL (default: SQLite under $TRAINFORGE_HOME; the cluster "
                                              "needs the platform's PostgreSQL, e.g. postgresql://.../optuna)"),
        kind: Kind = KIND_OPTION,
        context: Optional[str] = CONTEXT_OPTION,
        poll: float = typer.Option(1.0, min=0.1, help="seconds between looks at the running trials"),
        resume: bool = typer.Option(False, "--resume", help="continue a cancelled sweep on purpose"),
        spent: Optional[float] = typer.Option(None, callback=valid_spend, help="local: the team's spend this month in USD, as "
                                              "`check --spent` (default: local jobs' cost this month)")) -> None:
    """Run a sweep, or continue it (same name, same spec): finished trials are kept, running ones adopted."""
    _run(sweep_file, backend_name, stack, storage, kind, context, poll, resume, spent)


def _run(sweep_file: Path, backend_name: BackendName, stack: Optional[Path], storage: Optional[str], kind: Kind,
         context: Optional[str], poll: float, resume: bool, spent: Optional[float] = None) -> None:
    from trainforge import contract
    from trainforge.errors import TrainforgeError
    from trainforge.trainer.admission import unchecked
    from trainforge.trainer.cli.common import backend, load_platform
    from trainforge.trainer.spec import with_image
    from trainforge.trainer.submission import admit_now
    from trainforge.trainer.sweeps.spec import load_sweep
    from trainforge.trainer.backends import cost_centre_of
    from trainforge.trainer.sweeps.targets import local_study_url

    sweep = load_sweep(sweep_file)  # every problem of the spec, before anything is created
    platform = load_platform(stack) if stack is not None else None
    if backend_name is BackendName.kubernetes:
        if platform is None or stack is None:
            raise TrainforgeError("", ["--stack: a cluster sweep admits every trial against the stack's quota and budget. Fix: --stack stacks/Pulumi.<env>.yaml"])
        if storage is not None:
            raise TrainforgeError("", ["--storage: a cluster sweep's controller runs in the cluster and reads the team's study "
                                       f"database from its {contract.SWEEP_STORAGE_SECRET} Secret. Fix: leave --storage out"])
        from trainforge.trainer.sweeps.targets import ClusterSweep
        for line in ClusterSweep.start(sweep, stack, kind.value, context, resume):
            typer.echo(line)
        return
    else:
        processes = sweep.base.workers.nodes * sweep.base.workers.procs_per_node * sweep.spec.max_parallel
        if processes > (os.cpu_count() or 1):
            raise TrainforgeError(str(sweep_file), [f"max_parallel: {sweep.spec.max_parallel} trials x {processes // sweep.spec.max_parallel} "
                                                    f"worker processes need {processes} cores; this machine has {os.cpu_count()}. "
                                                    f"Fix: max_parallel: {max(1, (os.cpu_count() or 1) // (processes // sweep.spec.max_parallel))}"])
        if processes == sweep.spec.max_parallel:  # one-process trials, each launched directly: forked, not imported again
            from trainforge.trainer.launch import serve_workers_warm
            serve_workers_warm(wait=False)  # it imports while the study opens and the first trial is admitted
    target = backend(backend_name, team=sweep.base.team, kind=kind, context=context, cost_centre=cost_centre_of(sweep.base, platform))
    url = storage or SweepRecord.load(sweep.name).storage or local_study_url(sweep.name)
    SweepRecord(backend=backend_name.value, kind=kind.value, team=sweep.base.team, context=context, source=str(sweep_file.resolve()),
                stack=str(stack.resolve()) if stack else None, storage=url).save(sweep.name)

    deployed = target.deployed_image(sweep.base.team)

    def admission(spec):
        spec = with_image(spec, platform, deployed)
        if platform is None:
            return unchecked(spec)
        return admit_now(spec, platform, target, spent=spent)

    from trainforge.trainer.cli import sweep_views
    from trainforge.trainer.launch import warm_workers_ready  # a trial's worker is to fork from the warm interpreter
    from trainforge.trainer.sweeps.controller import SweepController
    with sweep_views.SweepProgress(sweep) as bar:
        controller = SweepController(sweep, target, admission, url, tracking_uri=os.environ.get("MLFLOW_TRACKING_URI"),
                                     poll_s=poll, on_change=bar.update, resume=resume, before_launch=warm_workers_ready)
        bar.update(controller)
        why = controller.run()
    sweep_views.sweep_summary(controller, why)
    from trainforge.trainer.sweeps.controller import CANCELLED
    from trainforge.trainer.sweeps.study import counted
    if why == CANCELLED:
        raise typer.Exit(EXIT_FAILED)  # stopped before its plan: not a finished sweep (continue it under another name)
    if counted(controller.study) == 0 and controller.stopped_because:
        raise typer.Exit(EXIT_NOT_ADMITTED)  # not one trial could start: the budget or the cluster refused them all


BACKEND_OPTION = typer.Option(None, "--backend", help="default: where this machine started it; kubernetes: a sweep in the cluster")
SWEEP_TEAM_OPTION = typer.Option(None, "--team", help="kubernetes: the sweep's team (default: as recorded on this machine)")


def _target(name: str, backend_name: Optional[BackendName], team: Optional[str], context: Optional[str],
            storage: Optional[str] = None) -> SweepTarget:
    return locate(name, backend_name.value if backend_name else None, team=team, context=context, storage=storage)


@app.command(hidden=True)
def controller(storage: str = typer.Option(None, help="default: the team's study database, mounted from its Secret"),
               poll: float = typer.Option(5.0, min=0.1),
               give_up_after: float = typer.Option(GIVE_UP_AFTER_S, min=1.0, help="seconds of a service outage before it exits for "
                                                   "the job to restart it")) -> None:
    """Inside the controller's pod (trainer/sweeps/cluster.py): run the sweep its TrainJob carries."""
    import logging

    from trainforge import contract
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # the pod's log
    from trainforge.trainer.controllers.sweep import run_in_cluster
    raise typer.Exit(run_in_cluster(storage or contract.SWEEP_STORAGE_FROM_FILE, poll, give_up_after))


@app.command()
def status(name: str, storage: Optional[str] = typer.Option(None, help="default: where this machine recorded it"),
           output: Output = output_option(), backend_name: Optional[BackendName] = BACKEND_OPTION,
           team: Optional[str] = SWEEP_TEAM_OPTION, context: Optional[str] = CONTEXT_OPTION) -> None:
    """Trials: state, value, parameters, cost, duration."""
    from dataclasses import asdict

    from trainforge.trainer.cli import sweep_views
    from trainforge.trainer.sweeps.study import primary_direction, rows
    target = _target(name, backend_name, team, context, storage)
    study = target.study()
    extra = target.facts()
    found = rows(study)
    if output is Output.json:
        typer.echo(json.dumps({"sweep": name, "direction": primary_direction(study), "directions": [d.name.lower() for d in study.directions],
                               "trials": [asdict(r) for r in found],
                               "finished_because": study.user_attrs.get(StudyKey.FINISHED_BECAUSE), **extra}, indent=2, default=str))
        return
    sweep_views.sweep_table(name, study, found)
    if extra:
        typer.echo(f"controller: {extra['controller']}; {extra['planned']} trials planned; ${extra['spent_usd']:,.4f} spent")
        if extra["holds"]:
            typer.echo(f"shown: {extra['holds']}. Every trial: `trainforge sweep status {name} --storage URL` with the team's study database")


@app.command()
def report(name: str, out: Optional[Path] = typer.Option(None, help="directory (default: $TRAINFORGE_HOME/sweeps/NAME/report)"),
           storage: Optional[str] = typer.Option(None), backend_name: Optional[BackendName] = BACKEND_OPTION,
           team: Optional[str] = SWEEP_TEAM_OPTION, context: Optional[str] = CONTEXT_OPTION) -> None:
    """Plots: optimisation history, parameter importances, parallel coordinates, intermediate values (PNG and HTML)."""
    from trainforge import paths
    from trainforge.trainer.sweeps.report import write_report
    directory = out or paths.sweep_dir(name) / "report"
    study = _target(name, backend_name, team, context, storage).study()
    done = write_report(study, directory)
    if study.user_attrs.get(StudyKey.STATUS_HOLDS):
        typer.echo(f"the plots show {study.user_attrs[StudyKey.STATUS_HOLDS]} (the controller's status object; every trial: --storage URL)")
    for file in done["written"]:
        typer.echo(f"wrote {directory / file}")
    for why in done["skipped"]:
        typer.echo(f"skipped {why}")


@app.command()
def best(name: str, write: Optional[Path] = typer.Option(None, help="write the best trial's job spec here (submit it as a job)"),
         storage: Optional[str] = typer.Option(None), output: Output = output_option(),
         backend_name: Optional[BackendName] = BACKEND_OPTION, team: Optional[str] = SWEEP_TEAM_OPTION,
         context: Optional[str] = CONTEXT_OPTION,
         pick: Optional[int] = typer.Option(None, "--trial", help="with a second objective: which trial of the Pareto front"),
         knee: bool = typer.Option(False, "--knee", help="with a second objective: the Pareto front's knee (the best trade-off)"),
         promote: bool = typer.Option(False, "--promote", help="continue the trial from its checkpoint as a full job (with --steps)"),
         steps: Optional[int] = typer.Option(None, "--steps", min=1, help="--promote: the full job's max_steps"),
         stack: Optional[Path] = typer.Option(None, help="--promote: the stack it is admitted against, as `submit --stack` "
                                              "(default: the one the sweep ran with)")) -> None:
    """The best trial (with a second objective, the Pareto front): its value, parameters, job, checkpoint and MLflow run."""
    import yaml

    from trainforge.errors import TrainforgeError
    from trainforge.trainer.sweeps.study import best_trials, is_multi_objective, knee_of, number_of, second_objective_name
    from trainforge.trainer.sweeps.trials import trial_job
    target = _target(name, backend_name, team, context, storage)
    study = target.study()
    front = best_trials(study)
    if not front:
        raise TrainforgeError("", [f"sweep {name!r} has no complete trial yet. Fix: `trainforge sweep status {name}`"], exit_code=EXIT_FAILED)
    trial = front[0]  # the best, or on a Pareto front the best primary value
    primary = json.loads(study.user_attrs.get(StudyKey.SPEC) or "{}").get("objective", {}).get("metric", "the objective")
    picked_by = f"the best {primary}" + (" on the Pareto front" if is_multi_objective(study) else "")
    if knee and pick is not None:
        raise TrainforgeError("", ["--knee and --trial each choose the trial. Fix: one of them"])
    if knee:
        if not is_multi_objective(study):
            raise TrainforgeError("", [f"--knee: sweep {name!r} has one objective, so no Pareto front. Fix: drop --knee"])
        trial, picked_by = knee_of(front, list(study.directions)), "the Pareto front's knee (--knee)"
    if pick is not None:
        chosen = [t for t in front if number_of(t) == pick]
        if not chosen:
            raise TrainforgeError("", [f"--trial {pick}: not " + ("on the Pareto front" if is_multi_objective(study) else "the best trial")
                                       + f" (it holds {[number_of(t) for t in front]}). Fix: one of those"])
        trial, picked_by = chosen[0], f"--trial {pick}"
    job = trial.user_attrs.get(TrialKey.JOB)
    found = {"trial": number_of(trial), "picked_by": picked_by, "value": trial.values[0], "params": trial.params, "job": job,
             "checkpoint": target.checkpoint_of(job),
             "mlflow_run": study.user_attrs.get(fact_key(trial.number, TrialFact.MLFLOW_RUN_ID)),
             "mlflow_parent_run": study.user_attrs.get(StudyKey.MLFLOW_RUN_ID)}
    if is_multi_objective(study):
        second = second_objective_name(study) or "second"
        found[second] = trial.values[1]
        found["pareto_front"] = [{"trial": number_of(t), "value": t.values[0], second: t.values[1], "params": t.params,
                                  "job": t.user_attrs.get(TrialKey.JOB)} for t in front]
    if promote and steps is None:
        raise TrainforgeError("", ["--promote: how long the full job trains. Fix: --steps N (beyond the trial's own max_steps)"])
    if write is not None or promote:
        sweep = target.base()
        spec = trial_job(sweep.base, f"{name}-best", trial.params, None)
        if promote:
            from trainforge.trainer.sweeps.promotion import promoted
            spec = promoted(spec, sweep, trial, int(steps or 0), study, name)  # steps: required above
            found["promoted"] = {"job": spec.name, "max_steps": steps, "starts_from": job}
        if write is not None:
            raw = spec.model_dump(mode="json", exclude_none=True)
            write.write_text(yaml.safe_dump(raw, sort_keys=False))
            found["written"] = str(write)
        if promote:
            from trainforge.trainer.spec import parse_spec
            spec = parse_spec(spec.model_dump(mode="json", exclude_none=True), "the promoted job")  # validated whole, like a file
            found["promoted"]["submitted"] = target.submit(spec, stack)
    typer.echo(json.dumps(found, indent=2, default=str) if output is Output.json else
               "\n".join(f"{k}: {v}" for k, v in found.items()))


@app.command()
def cancel(name: str, storage: Optional[str] = typer.Option(None), backend_name: Optional[BackendName] = BACKEND_OPTION,
           team: Optional[str] = SWEEP_TEAM_OPTION, context: Optional[str] = CONTEXT_OPTION) -> None:
    """Stop the sweep: its controller stops launching and cancels running trials (each checkpoints first)."""
    for line in _target(name, backend_name, team, context, storage).cancel():
        typer.echo(line)


@app.command()
def resume(name: str, poll: float = typer.Option(1.0, min=0.1, help="seconds between looks at the running trials"),
           backend_name: Optional[BackendName] = BACKEND_OPTION, team: Optional[str] = SWEEP_TEAM_OPTION,
           context: Optional[str] = CONTEXT_OPTION) -> None:
    """Continue a sweep this machine started, as it was started: a cancelled one on purpose (its stopped trials run
    again), one stopped by its budget or wall time after `extend`."""
    def run_here(record: SweepRecord, poll: float) -> None:
        _run(Path(record.source or ""), BackendName(record.backend), Path(record.stack) if record.stack else None,
             record.storage, Kind(record.kind), record.context, poll, True)

    for line in _target(name, backend_name, team, context).resume(poll, run_here):
        typer.echo(line)


@app.command()
def extend(name: str,
           trials: int = typer.Option(0, "--trials", min=0, help="more trials, e.g. +16"),
           usd: float = typer.Option(0.0, "--usd", min=0.0, help="more budget in USD, e.g. +50"),
           wall_time: Optional[str] = typer.Option(None, "--wall-time", help="more wall time, e.g. +2h"),
           storage: Optional[str] = typer.Option(None, help="default: where this machine recorded it"),
           backend_name: Optional[BackendName] = BACKEND_OPTION, team: Optional[str] = SWEEP_TEAM_OPTION,
           context: Optional[str] = CONTEXT_OPTION) -> None:
    """Raise a sweep's limits: more trials, budget or wall time (its search stays the same). A running controller takes
    them up at its next look; a finished one continues with `trainforge sweep resume NAME`."""
    from trainforge.errors import TrainforgeError
    from trainforge.trainer.sweeps.spec import parse_duration
    seconds = parse_duration(wall_time.lstrip("+"), "--wall-time") if wall_time else 0
    if not (trials or usd or seconds):
        raise TrainforgeError("", ["nothing to extend. Fix: --trials +N, --usd +X or --wall-time +2h"])
    for line in _target(name, backend_name, team, context, storage).extend(trials=trials, usd=usd, wall_time_s=seconds):
        typer.echo(line)
