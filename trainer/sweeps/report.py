"""`trainforge sweep report`: the study as pictures — optimisation history, parameter importances, parallel
coordinates, intermediate values — as PNG (matplotlib) and, where the plot is interactive, HTML (plotly)."""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

PLOTS = ("optimization_history", "param_importances", "parallel_coordinate", "intermediate_values")


def write_report(study: optuna.Study, out: Path) -> dict[str, list[str]]:
    """Every plot the study has data for; what was skipped and why."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna import visualization
    from optuna.visualization import matplotlib as static

    out.mkdir(parents=True, exist_ok=True)
    complete = [t for t in study.get_trials(deepcopy=False) if t.state is TrialState.COMPLETE]
    with_steps = [t for t in study.get_trials(deepcopy=False) if t.intermediate_values]
    written: list[str] = []
    skipped: list[str] = []
    for name in PLOTS:
        if name == "param_importances" and (len(complete) < 2 or not study.best_trial.params):
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
            axes = getattr(static, f"plot_{name}")(study)
            figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
            figure.set_size_inches(10, 6)
            figure.tight_layout()
            figure.savefig(out / f"{name}.png", dpi=110)
            plt.close(figure)
            getattr(visualization, f"plot_{name}")(study).write_html(out / f"{name}.html", include_plotlyjs="directory")
        written += [f"{name}.png", f"{name}.html"]
    return {"written": written + (["plotly.min.js"] if written else []), "skipped": skipped}
