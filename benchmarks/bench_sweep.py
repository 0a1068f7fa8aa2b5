"""Sweep benchmarks of the machinery (numbers for the closing note; nothing here fails a build). How well the search
itself does is benchmarks/bench_search.py's question.

1. Parallelism: the wall time of 8 trials run by `trainforge sweep` (real local jobs) two at a time against one
   at a time, same sampler and seed, no pruning.
2. Trial start-up: the time from a trial's submission to its first training step, for short trials where it
   dominates: through torchrun, its one worker launched directly (cold), and forked from the warm interpreter a local
   sweep starts; and through torchrun with torchrun and its worker forked (trainer/rank_proxy.py), as each rank of a
   local job of several ranks starts.

    .venv/bin/python benchmarks/bench_sweep.py [--startup] [--quick]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SWEEP_FILE = REPO / "examples" / "sweeps" / "classifier-lr.yaml"


def trial_startup(workdir: Path, repeats: int = 3) -> dict[str, list[float]]:
    """Seconds from a one-process local job's submission to its first training step (its first metrics line's time
    less the steps before it), through torchrun (the baseline) and with its one worker launched directly."""
    import json
    import statistics as stats
    base = yaml.safe_load((REPO / "examples" / "sweep-base.yaml").read_text())
    base["hyperparameters"] = {**base["hyperparameters"], "max_steps": 20, "log_every": 1, "eval_every": 1000}
    from trainforge.trainer.launch import VIA_TORCHRUN_ENV, WORKER_FORKSERVER_ENV, WORKER_FORKSERVER_OFF, serve_workers_warm
    # Its own server, started as a local sweep starts one: one that the environment names already (a sweep's, the
    # test suite's) may have been started with other settings, and is not the thing measured.
    os.environ.pop(WORKER_FORKSERVER_ENV, None)
    server = serve_workers_warm()
    if server is None:
        raise SystemExit("no warm worker interpreter: this is not Linux, or it could not start (said above)")
    warm = os.environ[WORKER_FORKSERVER_ENV]
    found: dict[str, list[float]] = {"torchrun": [], "direct": [], "forked": [], "torchrun-forked": []}
    for attempt in range(repeats):
        for mode in found:
            name = f"startup-{mode}-{attempt}"
            path = workdir / f"{name}.yaml"
            path.write_text(yaml.safe_dump({**base, "name": name}))
            env = {**os.environ, "TRAINFORGE_HOME": str(workdir / "home-startup"), VIA_TORCHRUN_ENV: "1" if mode.startswith("torchrun") else "0",
                   WORKER_FORKSERVER_ENV: warm if mode.endswith("forked") else WORKER_FORKSERVER_OFF}
            env.pop("MLFLOW_TRACKING_URI", None)
            done = subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", "submit", str(path)], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(done.stdout + done.stderr)
            job = workdir / "home-startup" / "jobs" / name
            submitted = json.loads((job / "state.json").read_text())["submitted_at"]
            first = json.loads((job / "run" / "metrics.jsonl").read_text().splitlines()[0])
            found[mode].append(first["t"] - first["step_s"] * first["step"] - submitted)
    server.kill()
    for mode, values in found.items():
        print(f"trial start-up ({mode}): median {stats.median(values):.2f} s over {len(values)} jobs (submit to first step)")
    print(f"start-up, torchrun / direct: {stats.median(found['torchrun']) / stats.median(found['direct']):.2f}x; "
          f"direct / forked from the warm interpreter: {stats.median(found['direct']) / stats.median(found['forked']):.2f}x; "
          f"through torchrun, cold / torchrun and its worker forked: {stats.median(found['torchrun']) / stats.median(found['torchrun-forked']):.2f}x")
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
    parser.add_argument("--startup", action="store_true", help="only the trial start-up measurement")
    parser.add_argument("--quick", action="store_true", help="one start-up measurement of each kind, no parallel arm (CI runs this)")
    args = parser.parse_args()
    import logging
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        trial_startup(workdir, repeats=1 if args.quick else 3)
        if args.startup or args.quick:
            return
        one, two = parallel_wall(1, workdir), parallel_wall(2, workdir)
        print(f"8 trials, one at a time: {one:.1f} s; two at a time: {two:.1f} s; speed-up {one / two:.2f}x (on {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
