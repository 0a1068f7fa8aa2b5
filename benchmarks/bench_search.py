"""Search quality, measured soundly: does TPE (with or without pruning) reach a good character LM in fewer training
steps than random search, and which sampler and pruner settings should be the defaults?

Three steps (issue 40, item 8):

1. `measure`: the search space below as a table. Every configuration on its grid is trained once to full length
   through the real runtime (`train`), and its evaluation curve is recorded in benchmarks/data/search_char_lm.json.
   This is the only step that trains; it takes minutes on two cores and is committed, so the replay is reproducible.
2. `replay` (the default): each arm is a sampler and a pruner built exactly as a sweep builds them (`sampler_for`,
   `make_pruner(pruner_config(...))`). It searches the space's own distributions; a sampled point takes the curve of
   the nearest measured configuration (the learning rate compared on its log scale). Every trial reports its curve's
   evaluations to the study and asks the pruner after each, as `TrialReporter` does in a worker. So:
   - every arm gets the same budget of training steps (not of trials); a pruned trial costs the steps it ran;
   - steps to target: the steps spent, over all trials so far, up to the evaluation that first reaches the target;
     a seed that does not reach it within the budget is censored at the budget (never charged its own arm's steps);
   - the target is fixed before any replay, by a rule on the table alone: the loss that the best TARGET_QUANTILE of
     the configurations reach;
   - paired seeds: seed s is the same sampler seed in every arm; the arms' medians are Kaplan-Meier medians, and the
     ratio random / arm gets a percentile bootstrap interval over the seeds (resampled in pairs).
   A claim of ">= 3x fewer steps" is made only when the interval's lower bound is >= 3.
3. `confirm`: a few seeds through the real `trainforge sweep` command (real local jobs, real pruning), the chosen
   default against random search, their steps to the target counted from the study the sweep wrote.

    .venv/bin/python benchmarks/bench_search.py                     # replay the committed table (about a minute)
    .venv/bin/python benchmarks/bench_search.py measure             # re-measure the table (minutes of CPU training)
    .venv/bin/python benchmarks/bench_search.py confirm --seeds 5   # live sweeps through the CLI
    .venv/bin/python benchmarks/bench_search.py --quick             # CI: a few seeds of the replay, one live check
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "benchmarks" / "data" / "search_char_lm.json"

# The search space: what a researcher tuning a small character LM would search.
LEARNING_RATES = [round(10 ** (-4 + i / 3), 8) for i in range(10)]  # 1e-4 .. 1e-1, three points a decade
WIDTHS = [32, 64, 128]
WARMUPS = [0, 50, 100]
MAX_STEPS = 200
EVAL_EVERY = 20
TASK_ARGS = {"layers": 2, "heads": 4, "context": 64}
HYPER = {"max_steps": MAX_STEPS, "batch_size": 32, "eval_every": EVAL_EVERY, "eval_batches": 4, "precision": "fp32",
         "log_every": 10_000}

TARGET_QUANTILE = 0.05       # the target: the loss that the best 5% of the configurations reach (fixed in advance)
BUDGET_TRIALS = 60           # every arm's budget: the steps of 60 full-length trials (--budget-trials for another)
BOOTSTRAP = 2000


def sweep_spec(sampler: str, pruner: dict[str, Any], seed: int, max_trials: int, max_parallel: int = 1) -> dict[str, Any]:
    """The sweep a researcher would write for this space: the replay's arms and the live confirmation both parse it."""
    return {"name": "search-lm", "seed": seed, "max_trials": max_trials, "max_parallel": max_parallel, "sampler": sampler, "pruner": pruner,
            "base": {"name": "lm", "team": "bench", "entry": {"task": "char_lm", "args": TASK_ARGS}, "hyperparameters": HYPER},
            "space": {"lr": {"type": "float", "low": LEARNING_RATES[0], "high": LEARNING_RATES[-1], "log": True},
                      "task_args.dim": {"type": "categorical", "choices": WIDTHS},
                      "warmup_steps": {"type": "int", "low": WARMUPS[0], "high": WARMUPS[-1], "step": WARMUPS[1] - WARMUPS[0]}},
            "objective": {"metric": "loss", "direction": "minimize"}}


# --- 1. measure -----------------------------------------------------------------------------------------------------

def measure_one(config: dict[str, Any], workdir: str) -> dict[str, Any]:
    """Train one configuration to full length through the real runtime; its evaluation curve."""
    import logging
    logging.disable(logging.WARNING)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from trainforge.trainer.runtime.api import train
    from trainforge.trainer.runtime.config import RunConfig
    from trainforge.trainer.runtime.tasks import load_task

    curve: list[tuple[int, float | None]] = []

    class Recorder:
        name = "recorder"

        def on_eval(self, step: int, metrics: dict[str, float]) -> str | None:
            loss = float(metrics["loss"])
            curve.append((step, loss if math.isfinite(loss) else None))
            return None

    key = f"lr{config['lr']}-d{config['dim']}-w{config['warmup_steps']}"
    cfg = RunConfig.model_validate({**HYPER, "lr": config["lr"], "warmup_steps": config["warmup_steps"], "task": "char_lm",
                                    "task_args": {**TASK_ARGS, "dim": config["dim"]}, "seed": 0,
                                    "output_dir": f"{workdir}/{key}",
                                    "checkpoint": {"dir": f"{workdir}/{key}-ckpt", "interval_steps": 10_000, "async_save": False}})
    started = time.perf_counter()
    result = train(load_task(cfg.task, **cfg.task_args), cfg, eval_hooks=(Recorder(),))
    return {**config, "curve": curve, "steps_run": result.step, "seconds": round(time.perf_counter() - started, 2)}


def measure(workers: int) -> None:
    configs = [{"lr": lr, "dim": dim, "warmup_steps": warmup} for lr in LEARNING_RATES for dim in WIDTHS for warmup in WARMUPS]
    print(f"measuring {len(configs)} configurations of {MAX_STEPS} steps ({workers} processes)", flush=True)
    rows, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for n, row in enumerate(pool.map(measure_one, configs, [tmp] * len(configs)), 1):
            rows.append(row)
            finite = [loss for _, loss in row["curve"] if loss is not None]
            elapsed = time.perf_counter() - started
            print(f"[{n:>3}/{len(configs)}] lr {row['lr']:<10g} dim {row['dim']:<4} warm-up {row['warmup_steps']:<4}"
                  f"best loss {min(finite) if finite else float('nan'):.3f}  ({row['seconds']:.1f} s; "
                  f"about {elapsed / n * (len(configs) - n) / 60:.0f} min left)", flush=True)
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text(json.dumps({"task": "char_lm", "task_args": TASK_ARGS, "hyperparameters": HYPER, "max_steps": MAX_STEPS,
                                 "eval_every": EVAL_EVERY, "torch_threads": 1, "configs": rows}, indent=1) + "\n")
    print(f"wrote {TABLE.relative_to(REPO)} in {(time.perf_counter() - started) / 60:.1f} min")


# --- 2. replay ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Table:
    curves: dict[tuple[float, int, int], list[tuple[int, float | None]]]
    max_steps: int

    @classmethod
    def load(cls, path: Path = TABLE) -> Table:
        raw = json.loads(path.read_text())
        return cls({(c["lr"], c["dim"], c["warmup_steps"]): [(s, v) for s, v in c["curve"]] for c in raw["configs"]},
                   raw["max_steps"])

    def curve(self, params: dict[str, Any]) -> list[tuple[int, float | None]]:
        """The measured curve nearest to a sampled point: the learning rate on its log scale, the rest exactly."""
        lr = min(LEARNING_RATES, key=lambda x: abs(math.log(x) - math.log(params["lr"])))
        return self.curves[(lr, int(params["task_args.dim"]), int(params["warmup_steps"]))]

    def best_losses(self) -> list[float]:
        return sorted(min((v for _, v in c if v is not None), default=math.inf) for c in self.curves.values())

    def target(self) -> float:
        """The loss that the best TARGET_QUANTILE of the configurations reach at some evaluation."""
        best = self.best_losses()
        return best[max(0, math.ceil(TARGET_QUANTILE * len(best)) - 1)]


@dataclass(frozen=True)
class Arm:
    name: str
    sampler: str
    pruner: dict[str, Any]
    startup: int | None = None  # TPE's random start-up trials; None: the product's own rule


def arms() -> list[Arm]:
    """Random search; TPE with the product's start-up rule (study.tpe_startup_trials: 3 at these budgets) and with
    fixed start-ups (10 is Optuna's default and what the rule before it gave from 40 trials on); TPE under each pruner
    the spec offers, at the spec's defaults and with a later start."""
    median_late = {"type": "median", "warmup_steps": MAX_STEPS * 3 // 4}
    return [Arm("random", "random", {"type": "none"}),
            Arm("random+hyperband", "random", {"type": "hyperband", "reduction_factor": 3}),
            Arm("tpe", "tpe", {"type": "none"}),
            *[Arm(f"tpe(startup {n})", "tpe", {"type": "none"}, startup=n) for n in (2, 5, 10, 20)],
            Arm("tpe+median", "tpe", {"type": "median"}),
            Arm(f"tpe+median(warmup {MAX_STEPS // 2})", "tpe", {"type": "median", "warmup_steps": MAX_STEPS // 2}),
            Arm(f"tpe+median(warmup {MAX_STEPS * 3 // 4})", "tpe", median_late),
            Arm(f"tpe(startup 10)+median(warmup {MAX_STEPS * 3 // 4})", "tpe", median_late, startup=10),
            Arm("tpe+hyperband", "tpe", {"type": "hyperband", "reduction_factor": 3}),
            *[Arm(f"tpe+hyperband(min {n * EVAL_EVERY})", "tpe", {"type": "hyperband", "reduction_factor": 3, "min_resource": n * EVAL_EVERY})
              for n in (2, 3, 5)],
            Arm("tpe+successive_halving", "tpe", {"type": "successive_halving", "reduction_factor": 3})]


@dataclass(frozen=True)
class Search:
    """One arm's search for one seed: where it reached the target (None: not within the budget) and what it spent."""
    reached: int | None
    spent: int
    trials: int
    pruned: int


def replay(arm: Arm, seed: int, table: Table, target: float, budget: int) -> Search:
    """Trials one after another until an evaluation reaches `target` or the next evaluation would pass the budget."""
    import optuna

    from trainforge.trainer.runtime.pruning import make_pruner
    from trainforge.trainer.sweeps.spec import parse_sweep
    from trainforge.trainer.sweeps.study import distributions, pruner_config, sampler_for

    sweep = parse_sweep(sweep_spec(arm.sampler, arm.pruner, seed, budget // table.max_steps), "search-lm")
    sampler = sampler_for(sweep)
    if arm.startup is not None:
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=arm.startup)
    # Named: Hyperband assigns a trial to a bracket by a hash of the study's name and the trial's number, and an unnamed
    # in-memory study gets a random name, so the same seed would replay otherwise from one run to the next.
    study = optuna.create_study(study_name=sweep.name, sampler=sampler, pruner=make_pruner(pruner_config(sweep)), direction="minimize")
    space = distributions(sweep)
    spent = trials = pruned = 0
    while True:
        trial = study.ask(space)
        trials += 1
        ran, last, stopped = 0, None, False
        for step, loss in table.curve(trial.params):
            if spent + step > budget:
                return Search(None, spent + ran, trials, pruned)
            ran = step
            if loss is None:  # diverged: the reporter prunes it
                stopped = True
                break
            if loss <= target:
                return Search(spent + step, spent + step, trials, pruned)
            last = loss
            trial.report(loss, step)
            if trial.should_prune():
                stopped = True
                break
        spent += ran
        if stopped:
            pruned += 1
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, last)


def km_median(times: list[int | None]) -> float | None:
    """Kaplan-Meier median of steps to target, censored at the budget (None); None when over half never reach it."""
    at_risk, survival = len(times), 1.0
    for t in sorted({t for t in times if t is not None}):
        events = sum(1 for x in times if x == t)
        survival *= 1 - events / at_risk
        at_risk -= events
        if survival <= 0.5:
            return float(t)
    return None


def ratio(random_times: list[int | None], arm_times: list[int | None], budget: int) -> float:
    """random's median / the arm's; a median beyond the budget is taken as the budget. For random search that makes the
    ratio smaller, never larger, than the truth; an arm whose own median is beyond it gets a ratio of at most
    random's median / budget, an upper bound, but such an arm is far below 1x and never the one a claim rests on."""
    r, a = km_median(random_times), km_median(arm_times)
    return (r if r is not None else budget) / (a if a is not None else budget)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered))))]


def replay_benchmark(seeds: int, table: Table, budget_trials: int = BUDGET_TRIALS, only: str | None = None) -> dict[str, Any]:
    from trainforge.trainer.sweeps.study import quiet_optuna
    quiet_optuna()
    target, budget = table.target(), budget_trials * table.max_steps
    best = table.best_losses()
    print(f"table: {len(best)} configurations of {table.max_steps} steps; best loss {best[0]:.3f}, median {best[len(best) // 2]:.3f}")
    print(f"target (fixed in advance: the best {TARGET_QUANTILE:.0%} of configurations reach it): loss <= {target:.3f}; "
          f"budget: {budget} steps ({budget_trials} full trials) per arm and seed; {seeds} paired seeds\n", flush=True)
    chosen = [a for a in arms() if only is None or a.name == "random" or only in a.name]
    times: dict[str, list[int | None]] = {}
    for arm in chosen:
        started = time.perf_counter()
        times[arm.name] = [replay(arm, seed, table, target, budget).reached for seed in range(seeds)]
        print(f"  replayed {arm.name:<38} {time.perf_counter() - started:5.1f} s", flush=True)
    rng = random.Random(0)
    draws = [[rng.randrange(seeds) for _ in range(seeds)] for _ in range(BOOTSTRAP)]
    rows = []
    for arm in chosen:
        t = times[arm.name]
        boot = [ratio([times["random"][i] for i in d], [t[i] for i in d], budget) for d in draws]
        rows.append({"arm": arm.name, "reached": sum(x is not None for x in t), "seeds": seeds, "median": km_median(t),
                     "ratio": ratio(times["random"], t, budget), "low": percentile(boot, 0.025), "high": percentile(boot, 0.975)})
    print(f"\n{'arm':<38}{'reached':>9}{'KM median steps':>17}{'random / arm':>14}{'95% bootstrap':>18}")
    for row in rows:
        median = f"{row['median']:.0f}" if row["median"] is not None else f"> {budget}"
        print(f"{row['arm']:<38}{row['reached']:>5}/{row['seeds']:<3}{median:>17}{row['ratio']:>13.2f}x"
              f"{row['low']:>9.2f}-{row['high']:.2f}x")
    best_row = max(rows[1:], key=lambda r: (r["low"], r["ratio"]))
    claim = "holds" if best_row["low"] >= 3 else "is not shown"
    print(f"\nbest arm by the interval's lower bound: {best_row['arm']} ({best_row['ratio']:.2f}x, 95% {best_row['low']:.2f}-"
          f"{best_row['high']:.2f}x): the claim '>= 3x fewer steps than random' {claim}")
    return {"target": target, "budget": budget, "rows": rows, "times": times}


# --- 3. confirm -----------------------------------------------------------------------------------------------------

def live_steps_to_target(storage: str, name: str, target: float) -> tuple[int | None, int]:
    """From a finished sweep's study: trials in the order they were asked, each costing the steps it ran."""
    import optuna
    study = optuna.load_study(study_name=name, storage=storage)
    spent = 0
    for trial in sorted(study.trials, key=lambda t: t.number):
        values = sorted(trial.intermediate_values.items())
        reached = [s for s, v in values if v <= target]
        if reached:
            return spent + reached[0], spent + (values[-1][0] if values else 0)
        spent += MAX_STEPS if trial.state is optuna.trial.TrialState.COMPLETE else (values[-1][0] if values else 0)
    return None, spent


def confirm(seeds: int, trials: int, target: float, arm: Arm) -> None:
    print(f"live: `trainforge sweep`, {trials} trials per sweep, {arm.name} against random, {seeds} seeds; target loss <= {target:.3f}")
    print(f"{'seed':>5}{'random':>12}{arm.name:>26}", flush=True)
    found: dict[str, list[int | None]] = {"random": [], arm.name: []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(seeds):
            row = []
            for sampler, pruner in (("random", {"type": "none"}), (arm.sampler, arm.pruner)):
                spec = sweep_spec(sampler, pruner, seed, trials, max_parallel=2)
                spec["name"] = f"search-lm-{sampler}-{seed}"
                path = Path(tmp, f"{spec['name']}.yaml")
                path.write_text(yaml.safe_dump(spec))
                home = Path(tmp, "home")
                env = {**os.environ, "TRAINFORGE_HOME": str(home), "OMP_NUM_THREADS": "1"}
                env.pop("MLFLOW_TRACKING_URI", None)
                storage = f"sqlite:///{Path(tmp, spec['name'] + '.db')}"
                done = subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", "sweep", str(path), "--storage", storage],
                                      env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(done.stdout + done.stderr)
                row.append(live_steps_to_target(storage, spec["name"], target))
            print(f"{seed:>5}" + "".join(f"{(str(s) if s is not None else f'> {spent}'):>{w}}" for (s, spent), w in zip(row, (12, 26))),
                  flush=True)
            for name, (reached, _) in zip(found, row):
                found[name].append(reached)
    medians = {name: km_median(times) for name, times in found.items()}
    print("KM median steps to target: " + ", ".join(f"{name} {m:.0f}" if m is not None else f"{name} > {trials * MAX_STEPS}"
                                                    for name, m in medians.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", nargs="?", choices=["replay", "measure", "confirm"], default="replay")
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2, help="measure: training processes at once")
    parser.add_argument("--trials", type=int, default=20, help="confirm: trials per live sweep")
    parser.add_argument("--budget-trials", type=int, default=BUDGET_TRIALS, help="replay: each arm's budget, in full-length trials")
    parser.add_argument("--only", help="replay: only the arms whose name holds this (and random)")
    parser.add_argument("--quick", action="store_true", help="CI: 8 seeds of the replay and no live sweep")
    args = parser.parse_args()
    if args.step == "measure":
        measure(args.workers)
        return
    table = Table.load()
    if args.step == "confirm":
        chosen = next(a for a in arms() if a.name == f"tpe+median(warmup {MAX_STEPS * 3 // 4})")
        confirm(args.seeds, args.trials, table.target(), chosen)
        return
    replay_benchmark(8 if args.quick else args.seeds, table, args.budget_trials, args.only)
    if args.quick:  # the measuring path still trains: one configuration, the smallest
        with tempfile.TemporaryDirectory() as tmp:
            row = measure_one({"lr": LEARNING_RATES[-1], "dim": WIDTHS[0], "warmup_steps": WARMUPS[0]}, tmp)
        print(f"measured one configuration again: {len(row['curve'])} evaluations in {row['seconds']:.1f} s")


if __name__ == "__main__":
    main()
