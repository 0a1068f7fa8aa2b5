"""The benchmarks still run: each in its --quick mode (seconds), checked only for a clean exit and its table or
report. Their numbers are for the closing notes, never a pass/fail here."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from support.lanes import TIMING, full
from support.repo import REPO

pytestmark = pytest.mark.slow
QUICK_MODE = full("a benchmark's quick mode: it proves the script still runs; its numbers are for closing notes")

# benchmark -> what its output always shows
BENCHMARKS = {
    "bench_cli_startup.py": "CLI start-up",
    "bench_stack_eval.py": "Stack evaluation",
    "bench_runtime.py": "trainforge runtime benchmarks",
    "bench_sweep.py": "start-up, torchrun / direct",
    "bench_search.py": "random / arm",
    "bench_gpu.py": "char_lm",
    "bench_quickstart.py": "quickstart end to end",
    "bench_checkpoint_hash.py": "speed-up vs before",
    "bench_mlflow_auth.py": "speed-up vs before",
}


def test_every_benchmark_is_listed_here():
    assert {p.name for p in (REPO / "benchmarks").glob("bench_*.py")} == set(BENCHMARKS)


@QUICK_MODE
@TIMING
@pytest.mark.parametrize("script", BENCHMARKS)
def test_the_benchmark_runs_in_quick_mode(script, tmp_path):
    if script in ("bench_runtime.py", "bench_sweep.py", "bench_search.py", "bench_gpu.py", "bench_quickstart.py"):
        pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")
    if script == "bench_mlflow_auth.py":
        pytest.importorskip("mlflow.server", reason="the full mlflow package (tracking server) is not installed")
    if script == "bench_stack_eval.py":
        pytest.importorskip("pulumi", reason="the platform extra (pulumi) is not installed")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--quick"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600, env={**os.environ, "COLUMNS": "200", "TRAINFORGE_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert BENCHMARKS[script] in done.stdout, done.stdout[-3000:]


# ---- the search benchmark's statistics (bench_search.py): what its table's verdict rests on -------------------------

def search_bench():
    pytest.importorskip("optuna", reason="the sweep extra (optuna) is not installed")
    spec = importlib.util.spec_from_file_location("bench_search", REPO / "benchmarks" / "bench_search.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_search"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_kaplan_meier_median_counts_a_seed_that_never_reached_the_target_as_still_searching():
    km = search_bench().km_median
    assert km([100, 200, 300, None]) == 200, "S drops to 0.75, then 0.5 at 200"
    assert km([100, None, None, None]) is None, "three of four never reached it: the median is past the budget"
    assert km([50, 50, 400, None]) == 50, "ties count together"


def test_a_random_search_that_misses_makes_the_ratio_smaller_never_larger():
    bench = search_bench()
    assert bench.ratio([None, None, None], [100, 100, 100], budget=1000) == 10.0, "the budget stands in for random's median"
    assert bench.ratio([400, 400, None], [100, 100, None], budget=1000) == 4.0


def synthetic_table(bench, good_lr: float):
    """Every configuration flat at loss 3.0 for the whole run, except those at `good_lr`, which reach 1.0 at step 100."""
    flat = [(step, 3.0) for step in range(20, 201, 20)]
    good = [(step, 3.0 if step < 100 else 1.0) for step in range(20, 201, 20)]
    curves = {(lr, dim, warmup): good if lr == good_lr else flat
              for lr in bench.LEARNING_RATES for dim in bench.WIDTHS for warmup in bench.WARMUPS}
    return bench.Table(curves, max_steps=200)


def test_the_replay_charges_every_trial_its_steps_up_to_the_evaluation_that_reaches_the_target():
    bench = search_bench()
    table = synthetic_table(bench, bench.LEARNING_RATES[5])
    random_arm = next(a for a in bench.arms() if a.name == "random")
    for seed in range(5):
        found = bench.replay(random_arm, seed, table, target=1.5, budget=60 * 200)
        assert found.reached == 200 * (found.trials - 1) + 100, found  # whole trials of 200 steps, then 100 of the good one
    missed = bench.replay(random_arm, 0, table, target=0.5, budget=10 * 200)
    assert missed.reached is None and missed.spent == 10 * 200 and missed.trials == 11, "censored at the budget, never past it"
    assert table.target() == 1.0, "the best 5% of 90 configurations (the 5th best): 9 configurations reach 1.0"


def test_a_pruned_trial_costs_only_the_steps_it_ran():
    bench = search_bench()
    # Nothing reaches the target; a higher learning rate is a worse curve from its first evaluation on, so the median
    # pruner stops the worse half of the trials after its start-up trials.
    curves = {(lr, dim, warmup): [(step, 3.0 + lr) for step in range(20, 201, 20)]
              for lr in bench.LEARNING_RATES for dim in bench.WIDTHS for warmup in bench.WARMUPS}
    table = bench.Table(curves, max_steps=200)
    arm = bench.Arm("random+median", "random", {"type": "median", "warmup_steps": 0})
    found = bench.replay(arm, 0, table, target=0.5, budget=20 * 200)
    assert found.reached is None and found.pruned > 0
    whole = found.trials - 1 - found.pruned  # the last trial is the one the budget cut short
    last = found.spent - 200 * whole - 20 * found.pruned  # curves are flat: a pruned trial stops at its first evaluation
    assert 0 <= last < 200 and found.spent <= 20 * 200, found
    assert found.trials > 20, "pruned trials cost 20 steps, not 200: more trials fit the same budget"
