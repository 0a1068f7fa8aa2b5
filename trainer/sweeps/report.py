"""`trainforge sweep report`: the study as pictures — optimisation history, parameter importances, parallel
coordinates, intermediate values — as PNG (matplotlib) and, where the plot is interactive, HTML (plotly); and what
the search cost: the best value against the money and the time spent, every finished trial (pruned ones too) on it.
Axes name the objective's metric, not "Objective Value"."""

from __future__ import annotations

import datetime
import json
import warnings
from typing import Any
from pathlib import Path

import optuna
from optuna.trial import TrialState
from trainforge.trainer.sweeps.keys import StudyKey, TrialFact, fact_key

PLOTS = ("optimization_history", "param_importances", "parallel_coordinate", "intermediate_values")
TARGET_NAMED = {"optimization_history", "param_importances", "parallel_coordinate"}  # the plots that take target_name
COST_AND_TIME = "cost_and_time"
PARETO_FRONT = "pareto_front"  # a sweep with a second objective: the trade-off, the non-dominated trials marked


def objective_name(study: optuna.Study) -> str:
    """The metric the sweep optimises, from the spec the controller recorded in the study."""
    try:
        return json.loads(study.user_attrs[StudyKey.SPEC])["objective"]["metric"]
    except (KeyError, TypeError, ValueError):
        return "objective"


def plot_cost_and_time(study: optuna.Study, path: Path) -> bool:
    """Best value so far against cumulative cost (USD, as recorded per trial) and against time since the sweep
    started; every finished trial's own value as a point (pruned ones at their last evaluation)."""
    import matplotlib.pyplot as plt

    finished = sorted((t for t in study.get_trials(deepcopy=False) if t.datetime_complete is not None
                       and t.datetime_start is not None and t.state in (TrialState.COMPLETE, TrialState.PRUNED)),
                      key=lambda t: t.datetime_complete or datetime.datetime.min)
    if not finished:
        return False
    maximize = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
    started = min(t.datetime_start or datetime.datetime.max for t in finished)
    cost, best = 0.0, None
    xs_cost: list[float] = []
    xs_time: list[float] = []
    ys_best: list[float | None] = []
    points: list[tuple[float, float, float, bool]] = []
    for t in finished:
        cost += float(study.user_attrs.get(fact_key(t.number, TrialFact.COST_USD)) or 0.0)
        value = t.values[0] if t.state is TrialState.COMPLETE else (t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None)
        if t.state is TrialState.COMPLETE and value is not None:
            best = value if best is None else (max if maximize else min)(best, value)
        seconds = ((t.datetime_complete or started) - started).total_seconds()
        xs_cost.append(cost)
        xs_time.append(seconds)
        ys_best.append(best)
        if value is not None:
            points.append((cost, seconds, value, t.state is TrialState.PRUNED))
    unit, per = ("minutes", 60.0) if xs_time[-1] >= 120 else ("seconds", 1.0)
    xs_time = [x / per for x in xs_time]
    points = [(c, s / per, v, p) for c, s, v, p in points]
    metric = objective_name(study)
    figure, (by_cost, by_time) = plt.subplots(1, 2, figsize=(12, 5))
    for axis, xs, index, label in ((by_cost, xs_cost, 0, "spent (USD)"), (by_time, xs_time, 1, f"{unit} since the sweep started")):
        axis.step(xs, ys_best, where="post", color="tab:blue", label=f"best {metric}")
        for pruned in (False, True):
            chosen = [p for p in points if p[3] is pruned]
            axis.scatter([p[index] for p in chosen], [p[2] for p in chosen], s=18, alpha=0.7,
                         color="tab:gray" if pruned else "tab:orange", label="pruned (last eval)" if pruned else "complete")
        axis.set_xlabel(label)
        axis.set_ylabel(metric)
        axis.grid(alpha=0.3)
    by_cost.legend(loc="best")
    figure.suptitle(f"{study.study_name}: what the search cost")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def write_report(study: optuna.Study, out: Path) -> dict[str, list[str]]:
    """Every plot the study has data for; what was skipped and why."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna import visualization
    from optuna.visualization import matplotlib as static

    from trainforge.trainer.sweeps.study import best_trials, is_multi_objective, second_objective_name

    out.mkdir(parents=True, exist_ok=True)
    metric = objective_name(study)
    multi = is_multi_objective(study)
    complete = [t for t in study.get_trials(deepcopy=False) if t.state is TrialState.COMPLETE]
    with_steps = [t for t in study.get_trials(deepcopy=False) if t.intermediate_values]
    written: list[str] = []
    skipped: list[str] = []
    plots = (*PLOTS, PARETO_FRONT) if multi else PLOTS
    for name in plots:
        if name == PARETO_FRONT and not complete:
            skipped.append(f"{name}: no complete trial yet")
            continue
        if name == "param_importances" and (len(complete) < 2 or not best_trials(study)[0].params):
            skipped.append(f"{name}: needs 2 or more complete trials")
            continue
        if name in ("optimization_history", "parallel_coordinate") and not complete:
            skipped.append(f"{name}: no complete trial yet")
            continue
        if name == "intermediate_values" and not with_steps:
            skipped.append(f"{name}: no trial reported an evaluation")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # optuna marks its matplotlib backend experimental
            named: dict[str, Any] = {"target_name": metric} if name in TARGET_NAMED else {}
            if multi and name in TARGET_NAMED:
                named["target"] = lambda t: t.values[0]  # the objective; the second has the Pareto front
            if name == PARETO_FRONT:
                named = {"target_names": [metric, second_objective_name(study) or "second"]}
            axes = getattr(static, f"plot_{name}")(study, **named)
            figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
            figure.set_size_inches(10, 6)
            figure.tight_layout()
            figure.savefig(out / f"{name}.png", dpi=110)
            plt.close(figure)
            getattr(visualization, f"plot_{name}")(study, **named).write_html(out / f"{name}.html", include_plotlyjs="directory")
        written += [f"{name}.png", f"{name}.html"]
    if plot_cost_and_time(study, out / f"{COST_AND_TIME}.png"):
        written.append(f"{COST_AND_TIME}.png")
    else:
        skipped.append(f"{COST_AND_TIME}: no finished trial yet")
    return {"written": written + (["plotly.min.js"] if any(w.endswith(".html") for w in written) else []), "skipped": skipped}
