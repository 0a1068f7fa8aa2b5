"""How the CLI shows a sweep: the live progress line, the trials table (with the Pareto front of a cost-aware search)
and the end-of-sweep summary. Data in, nothing decided here."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from trainforge.trainer.sweeps.keys import StudyKey, TrialKey


class SweepProgress:
    """`trainforge sweep`'s live line: trials done of planned, running, best value, dollars spent."""

    def __init__(self, sweep):
        import sys

        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        self.sweep = sweep
        # Not a terminal (a log file, CI, `| tee`): one whole line per change, never a bar cut at 80 columns.
        self.plain = not sys.stdout.isatty()
        self.last_line = ""
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f} trials"),
                            TextColumn("{task.fields[detail]}"), TimeElapsedColumn())
        self.task = self.bar.add_task(sweep.name, total=sweep.planned_trials, detail="opening the study")

    def __enter__(self) -> SweepProgress:
        if not self.plain:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if not self.plain:
            self.bar.__exit__(*exc)

    def update(self, controller) -> None:
        from trainforge.trainer.sweeps.study import counted, rows
        found = rows(controller.study)
        pruned = sum(1 for r in found if r.state == "pruned")
        values = [r.value for r in found if r.value is not None]
        best = (max if self.sweep.direction == "maximize" else min)(values) if values else None
        detail = (f"{len(controller.running)} running, {pruned} pruned, best {self.sweep.spec.objective.metric} "
                  f"{best:.4g}" if best is not None else f"{len(controller.running)} running, {pruned} pruned") + \
            f", ${controller.spent_usd():,.2f} spent"
        done = counted(controller.study)
        if self.plain:
            line = f"{self.sweep.name}: {done}/{self.sweep.planned_trials} trials, {detail}"
            if line != self.last_line:
                print(line, flush=True)
                self.last_line = line
            return
        self.bar.update(self.task, completed=done, detail=detail)


def sweep_table(name: str, study, found) -> None:
    from trainforge.trainer.sweeps.study import best_trials, is_multi_objective, number_of, primary_direction, second_objective_name
    direction = primary_direction(study)
    second = second_objective_name(study) if is_multi_objective(study) else None
    title = f"sweep {name} ({direction}" + (f"; {second} minimised: the Pareto front in green" if second else "") + ")"
    if second == "cost_usd":
        second = None  # the cost column shows it already
    table = Table(title=title + (f": {study.user_attrs[StudyKey.FINISHED_BECAUSE]}" if study.user_attrs.get(StudyKey.FINISHED_BECAUSE) else ""),
                  title_justify="left")
    queued = any(r.queued_s is not None for r in found)  # a cluster sweep's trials: their queue time apart from their run
    for column in ("trial", "state", "value", *([second] if second else []), "params", "last step", "cost $", "run s",
                   *(["queued s"] if queued else []), "job"):
        table.add_column(column)
    front = {number_of(t) for t in best_trials(study)}
    for r in found:
        mark = "[green]" if r.number in front else ""
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.params.items())
        state = r.state + (f" (retry of {r.retry_of})" if r.retry_of is not None else "") + (f": {r.stopped}" if r.stopped else "") \
            + (f" (told from {r.transferred_from})" if r.transferred_from else "")
        table.add_row(str(r.number), state, f"{mark}{r.value:.5g}" if r.value is not None else "-",
                      *([f"{mark}{r.second:.5g}" if r.second is not None else "-"] if second else []), params,
                      str(r.last_step) if r.last_step is not None else "-", f"{r.cost_usd:.4f}" if r.cost_usd is not None else "-",
                      f"{r.duration_s:.1f}" if r.duration_s is not None else "-",
                      *([f"{r.queued_s:.1f}" if r.queued_s is not None else "-"] if queued else []), r.job or "-")
    import sys
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def sweep_summary(controller, why: str) -> None:
    from trainforge.trainer.sweeps.study import rows
    study, sweep = controller.study, controller.sweep
    sweep_table(sweep.name, study, rows(study))
    import sys
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(f"sweep {sweep.name}: {why}; ${controller.spent_usd():,.4f} spent"
                  + (f" of ${sweep.spec.budget.usd:,.2f}" if sweep.spec.budget.usd else ""))
    from trainforge.trainer.sweeps.study import best_trials, number_of, transferred
    front = best_trials(study)
    if not front:
        console.print("no complete trial")
    elif sweep.spec.second_objective is None:
        best = front[0]
        where = best.user_attrs.get(TrialKey.JOB) or f"told from {transferred(best)} by the warm start"
        console.print(f"best: trial {number_of(best)} ({where}) {sweep.spec.objective.metric} = {best.values[0]:.5g} "
                      f"with {best.params}. `trainforge sweep best {sweep.name} --write best.yaml` gives its job spec")
    else:
        console.print(f"Pareto front ({sweep.spec.objective.metric} vs {sweep.spec.second_objective.metric}): "
                      + "; ".join(f"trial {number_of(t)}: {t.values[0]:.5g} at {t.values[1]:.5g}" for t in front)
                      + f". `trainforge sweep best {sweep.name} --trial N --write best.yaml` gives one's job spec")
