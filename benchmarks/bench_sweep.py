"""Sweep benchmarks (numbers for the closing note; nothing here fails a build).

1. Search efficiency: training steps spent until some trial's eval accuracy reaches a target, TPE + Hyperband
   (pruned from inside the runtime, runtime/pruning.py) against random search without pruning, on the bundled
   classifier of examples/sweeps/classifier-lr.yaml, several seeds each. Trials run one after another in this
   process through the real runtime (`train`) and the real trial reporter against a SQLite study, so only the
   search differs between the two arms. The ratio is random's steps over TPE+Hyperband's (goal: >= 3x).
2. Parallelism: the wall time of 8 trials run by `trainforge sweep` (real local jobs) two at a time against one
   at a time, same sampler and seed, no pruning.

    .venv/bin/python benchmarks/bench_sweep.py [--seeds 8] [--target 0.97] [--skip-parallel]
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
    from trainforge.trainer.sweeps.controller import distributions, make_pruner, pruner_config, quiet_optuna, sampler_for
    from trainforge.trainer.sweeps.spec import _with, parse_sweep

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
        args, hyper = _with(sweep.base, trial.params)
        link = {"storage": storage, "study": "bench", "trial_id": trial._trial_id, "metric": "accuracy", "heartbeat_s": 60}
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
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.target, args.skip_parallel = 1, 0.6, True
    import logging
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
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
