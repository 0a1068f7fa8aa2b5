"""Sweep benchmarks (numbers for the closing note; nothing here fails a build).

1. Search efficiency: training steps spent until some trial's evaluation reaches a target, per search arm, several
   seeds each. Trials run one after another in this process through the real runtime (`train`) and the real trial
   reporter against a SQLite study, so only the search differs between arms.
   - `--task classifier` (default): TPE + Hyperband against random search without pruning, on the classifier of
     examples/sweeps/classifier-lr.yaml (which saturates quickly: search barely pays there).
   - `--task char_lm`: the bundled character language model's learning rate, width and warm-up (where search pays):
     random, TPE, TPE + median pruning and TPE + Hyperband at an equal trial budget; steps to the target loss and the
     best loss after half and all of the budget. Goal: >= 3x fewer steps than random search.
2. Parallelism: the wall time of 8 trials run by `trainforge sweep` (real local jobs) two at a time against one
   at a time, same sampler and seed, no pruning.
3. Trial start-up: the time from a trial's submission to its first training step, split into process start,
   imports and the run's set-up (from its log), for short trials where it dominates.

    .venv/bin/python benchmarks/bench_sweep.py [--task char_lm] [--seeds 5] [--target 2.6] [--skip-parallel]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SWEEP_FILE = REPO / "examples" / "sweeps" / "classifier-lr.yaml"
MAX_TRIALS = 60
MAX_STEPS = 300  # each trial's full length: what pruning saves on a bad one


def search_cost(sampler: str, pruner: str, seed: int, target: float, workdir: Path) -> dict:
    """Steps spent (over all trials, pruned ones included) until an evaluation reaches `target`."""
    import optuna

    from trainforge.trainer.runtime.api import train
    from trainforge.trainer.runtime.config import RunConfig
    from trainforge.trainer.runtime.pruning import TrialReporter
    from trainforge.trainer.runtime.tasks import load_task
    from trainforge.trainer.runtime.pruning import make_pruner
    from trainforge.trainer.sweeps.study import distributions, pruner_config, quiet_optuna, sampler_for
    from trainforge.trainer.sweeps.optuna_access import trial_id
    from trainforge.trainer.sweeps.spec import parse_sweep
    from trainforge.trainer.sweeps.trials import apply_params

    raw = yaml.safe_load(SWEEP_FILE.read_text())
    raw.update(sampler=sampler, pruner={"type": pruner, "reduction_factor": 3}, seed=seed, max_trials=20)  # TPE: 5 random startup trials
    # A haystack: most of this space trains badly (tiny or huge learning rates, long warm-ups, heavy weight decay),
    # so finding a good corner takes search; the example's own space is easy enough that a first random guess often wins.
    raw["space"] = {**raw["space"], "lr": {"type": "float", "low": 1e-6, "high": 1.0, "log": True},
                    "warmup_steps": {"type": "int", "low": 0, "high": 250, "step": 10},
                    "weight_decay": {"type": "float", "low": 1e-4, "high": 30.0, "log": True}}
    raw["base"] = {**yaml.safe_load((REPO / "examples" / "sweep-base.yaml").read_text())}
    # The whole eval set (2048 samples, not the example's 256): a pruner deciding on noisy evaluations prunes good trials.
    raw["base"]["hyperparameters"] = {**raw["base"]["hyperparameters"], "max_steps": MAX_STEPS, "eval_batches": None}
    sweep = parse_sweep(raw, str(SWEEP_FILE), SWEEP_FILE.parent)
    quiet_optuna()
    storage = f"sqlite:///{workdir / f'{sampler}-{pruner}-{seed}.db'}"
    study = optuna.create_study(study_name="bench", storage=storage, sampler=sampler_for(sweep),
                                pruner=make_pruner(pruner_config(sweep)), direction=sweep.direction)
    study.set_user_attr("pruner", pruner_config(sweep))
    steps = trials = 0
    for _ in range(MAX_TRIALS):
        trial = study.ask(distributions(sweep))
        args, hyper = apply_params(sweep.base, trial.params)
        link = {"storage": storage, "study": "bench", "trial_id": trial_id(trial), "metric": "accuracy", "heartbeat_s": 60}
        cfg = RunConfig.model_validate({**hyper, "task": sweep.base.entry.task, "task_args": args, "seed": seed * 1000 + trial.number,
                                        "output_dir": str(workdir / f"run-{sampler}-{seed}-{trial.number}"),
                                        "checkpoint": {"dir": str(workdir / f"ckpt-{sampler}-{seed}-{trial.number}"), "interval_steps": 10_000,
                                                       "async_save": False},
                                        "sweep": link})
        reporter = TrialReporter(cfg.sweep)
        result = train(load_task(cfg.task, **cfg.task_args), cfg, eval_hooks=(reporter,))  # train() leaves no group behind
        reporter.finish(result.exit_code, result.stopped_because, result.last_eval)
        trials += 1
        history = study.trials[trial.number].intermediate_values
        reached = [s for s, v in sorted(history.items()) if v >= target]
        if reached:
            return {"steps": steps + reached[0], "trials": trials, "reached": True}
        steps += result.step
    return {"steps": steps, "trials": trials, "reached": False}


CHAR_LM_ARMS = {"random": ("random", "none"), "tpe": ("tpe", "none"), "tpe+median": ("tpe", "median"), "tpe+hyperband": ("tpe", "hyperband")}
CHAR_LM_STEPS = 240


def char_lm_sweep(sampler: str, pruner: str, seed: int, trials: int):
    """The character LM's learning rate (1e-5..1), width (32/64/128) and warm-up (0..200): most of the space trains
    badly, a good corner trains well in a few hundred steps."""
    from trainforge.trainer.sweeps.spec import parse_sweep
    raw = {"name": "bench-lm", "base": {"name": "lm", "team": "bench", "entry": {"task": "char_lm", "args": {"layers": 2, "heads": 4, "context": 64}},
                                        "hyperparameters": {"max_steps": CHAR_LM_STEPS, "batch_size": 32, "eval_every": 40, "eval_batches": 8,
                                                            "precision": "fp32", "log_every": 1000}},
           "space": {"lr": {"type": "float", "low": 1e-5, "high": 1.0, "log": True},
                     "task_args.dim": {"type": "categorical", "choices": [32, 64, 128]},
                     "warmup_steps": {"type": "int", "low": 0, "high": 200, "step": 10}},
           "objective": {"metric": "loss", "direction": "minimize"}, "sampler": sampler,
           "pruner": {"type": pruner, **({"startup_trials": 3, "warmup_steps": 40} if pruner == "median" else {}),
                      **({"reduction_factor": 3} if pruner == "hyperband" else {})},
           "max_trials": trials, "seed": seed}
    return parse_sweep(raw, "bench-lm")


def char_lm_search(sampler: str, pruner: str, seed: int, target: float, trials: int, workdir: Path) -> dict:
    """A whole trial budget: steps spent until an evaluation reaches `target` (None if none did), and the best final
    loss after half and all of the budget."""
    import optuna
    from optuna.trial import TrialState

    from trainforge.trainer.runtime.api import train
    from trainforge.trainer.runtime.config import RunConfig
    from trainforge.trainer.runtime.pruning import TrialReporter
    from trainforge.trainer.runtime.tasks import load_task
    from trainforge.trainer.runtime.pruning import make_pruner
    from trainforge.trainer.sweeps.study import distributions, pruner_config, quiet_optuna, sampler_for
    from trainforge.trainer.sweeps.optuna_access import trial_id
    from trainforge.trainer.sweeps.trials import apply_params

    sweep = char_lm_sweep(sampler, pruner, seed, trials)
    quiet_optuna()
    storage = f"sqlite:///{workdir / f'lm-{sampler}-{pruner}-{seed}.db'}"
    study = optuna.create_study(study_name="bench", storage=storage, sampler=sampler_for(sweep),
                                pruner=make_pruner(pruner_config(sweep)), direction="minimize")
    study.set_user_attr("pruner", pruner_config(sweep))
    steps, to_target, best, best_at = 0, None, float("inf"), {}
    for number in range(trials):
        trial = study.ask(distributions(sweep))
        args, hyper = apply_params(sweep.base, trial.params)
        link = {"storage": storage, "study": "bench", "trial_id": trial_id(trial), "metric": "loss", "heartbeat_s": 60}
        cfg = RunConfig.model_validate({**hyper, "task": "char_lm", "task_args": args, "seed": seed * 1000 + number,
                                        "output_dir": str(workdir / f"lm-{sampler}-{pruner}-{seed}-{number}"),
                                        "checkpoint": {"dir": str(workdir / f"lmc-{sampler}-{pruner}-{seed}-{number}"),
                                                       "interval_steps": 10_000, "async_save": False},
                                        "sweep": link})
        reporter = TrialReporter(cfg.sweep)
        result = train(load_task(cfg.task, **cfg.task_args), cfg, eval_hooks=(reporter,))
        reporter.finish(result.exit_code, result.stopped_because, result.last_eval)
        frozen = study.trials[number]
        reached = [s for s, v in sorted(frozen.intermediate_values.items()) if v <= target]
        if to_target is None and reached:
            to_target = steps + reached[0]
        steps += result.step
        if frozen.state is TrialState.COMPLETE:
            best = min(best, frozen.value)
        best_at[number + 1] = best
    return {"to_target": to_target, "steps": steps, "half": best_at[trials // 2], "all": best_at[trials]}


def char_lm_benchmark(seeds: int, target: float, trials: int, workdir: Path) -> None:
    print(f"char LM: lr x width x warm-up, {trials} trials of up to {CHAR_LM_STEPS} steps per arm; steps until an eval loss <= {target}")
    print(f"{'arm':<15}{'seed':>5}{'to target':>11}{'all steps':>11}{'best@' + str(trials // 2):>9}{'best@' + str(trials):>9}")
    found: dict[str, list[dict]] = {arm: [] for arm in CHAR_LM_ARMS}
    for seed in range(seeds):
        for arm, (sampler, pruner) in CHAR_LM_ARMS.items():
            row = char_lm_search(sampler, pruner, seed, target, trials, workdir)
            found[arm].append(row)
            print(f"{arm:<15}{seed:>5}{row['to_target'] if row['to_target'] is not None else '-':>11}{row['steps']:>11}"
                  f"{row['half']:>9.3f}{row['all']:>9.3f}", flush=True)
    print(f"\n{'arm':<15}{'reached':>9}{'mean steps to target*':>23}{'mean best@' + str(trials // 2):>14}{'mean best@' + str(trials):>14}")
    # A seed that never reached the target counts the whole budget's steps (a lower bound on what it would have taken).
    means = {}
    for arm, rows in found.items():
        charged = [r["to_target"] if r["to_target"] is not None else r["steps"] for r in rows]
        means[arm] = statistics.mean(charged)
        print(f"{arm:<15}{sum(r['to_target'] is not None for r in rows):>6}/{len(rows):<2}{means[arm]:>23.0f}"
              f"{statistics.mean(r['half'] for r in rows):>14.3f}{statistics.mean(r['all'] for r in rows):>14.3f}")
    for arm in CHAR_LM_ARMS:
        if arm != "random":
            print(f"steps to target, random / {arm}: {means['random'] / means[arm]:.2f}x (goal >= 3x)")
    print("* a seed that never reached the target is charged its whole budget's steps")


def trial_startup(workdir: Path, repeats: int = 3) -> dict[str, list[float]]:
    """Seconds from a one-process local job's submission to its first training step (its first metrics line's time
    less the steps before it), through torchrun (the baseline) and with its one worker launched directly."""
    import json
    import statistics as stats
    base = yaml.safe_load((REPO / "examples" / "sweep-base.yaml").read_text())
    base["hyperparameters"] = {**base["hyperparameters"], "max_steps": 20, "log_every": 1, "eval_every": 1000}
    found: dict[str, list[float]] = {"torchrun": [], "direct": []}
    for attempt in range(repeats):
        for mode in found:
            name = f"startup-{mode}-{attempt}"
            path = workdir / f"{name}.yaml"
            path.write_text(yaml.safe_dump({**base, "name": name}))
            env = {**os.environ, "TRAINFORGE_HOME": str(workdir / "home-startup"), "TRAINFORGE_LAUNCH_VIA_TORCHRUN": "1" if mode == "torchrun" else "0"}
            env.pop("MLFLOW_TRACKING_URI", None)
            done = subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", "submit", str(path)], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(done.stdout + done.stderr)
            job = workdir / "home-startup" / "jobs" / name
            submitted = json.loads((job / "state.json").read_text())["submitted_at"]
            first = json.loads((job / "run" / "metrics.jsonl").read_text().splitlines()[0])
            found[mode].append(first["t"] - first["step_s"] * first["step"] - submitted)
    for mode, values in found.items():
        print(f"trial start-up ({mode}): median {stats.median(values):.2f} s over {len(values)} jobs (submit to first step)")
    print(f"start-up, torchrun / direct: {stats.median(found['torchrun']) / stats.median(found['direct']):.2f}x")
    return found


def parallel_wall(parallel: int, workdir: Path) -> float:
    raw = yaml.safe_load(SWEEP_FILE.read_text())
    raw.update(name=f"wall-{parallel}", base=str(REPO / "examples" / "sweep-base.yaml"), sampler="random",
               pruner={"type": "none"}, max_trials=8, max_parallel=parallel, seed=7)
    path = workdir / f"wall-{parallel}.yaml"
    path.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "TRAINFORGE_HOME": str(workdir / f"home-{parallel}")}
    env.pop("MLFLOW_TRACKING_URI", None)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", "sweep", str(path)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--skip-parallel", action="store_true")
    parser.add_argument("--quick", action="store_true", help="one seed, a low target, no parallel arm (CI runs this)")
    parser.add_argument("--task", choices=["classifier", "char_lm"], default="classifier")
    parser.add_argument("--trials", type=int, default=12, help="char_lm: the trial budget of each arm")
    parser.add_argument("--startup", action="store_true", help="only the trial start-up measurement")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.skip_parallel, args.trials = 1, True, 2
        args.target = 0.6 if args.task == "classifier" else 3.2
    import logging
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.startup:
            trial_startup(workdir, repeats=1 if args.quick else 3)
            return
        if args.task == "char_lm":
            char_lm_benchmark(args.seeds, args.target, args.trials, workdir)
            return
        arms = {"tpe+hyperband": ("tpe", "hyperband"), "random, no pruning": ("random", "none")}
        found: dict[str, list[dict]] = {arm: [] for arm in arms}
        print(f"steps until an eval reaches accuracy >= {args.target} (classifier, {SWEEP_FILE.name} space)")
        print(f"{'arm':<22}{'seed':>5}{'steps':>8}{'trials':>8}  reached")
        for seed in range(args.seeds):
            for arm, (sampler, pruner) in arms.items():
                row = search_cost(sampler, pruner, seed, args.target, workdir)
                found[arm].append(row)
                print(f"{arm:<22}{seed:>5}{row['steps']:>8}{row['trials']:>8}  {row['reached']}", flush=True)
        means = {arm: statistics.mean(r["steps"] for r in rows) for arm, rows in found.items()}
        for arm, mean in means.items():
            print(f"mean steps, {arm}: {mean:.0f}")
        ratios = [r["steps"] / t["steps"] for r, t in zip(found["random, no pruning"], found["tpe+hyperband"])]
        print(f"ratio of means, random / tpe+hyperband: {means['random, no pruning'] / means['tpe+hyperband']:.2f}x (goal >= 3x); "
              f"per seed: median {statistics.median(ratios):.2f}x, range {min(ratios):.2f}-{max(ratios):.2f}x")
        if not args.skip_parallel:
            one, two = parallel_wall(1, workdir), parallel_wall(2, workdir)
            print(f"8 trials, one at a time: {one:.1f} s; two at a time: {two:.1f} s; speed-up {one / two:.2f}x (on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
