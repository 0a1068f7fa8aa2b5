"""The runtime under the node launcher on this machine (torchrun, gloo), as every pod and the local supervisor run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.waiting import wait_until
from support.forked import run_forked
from trainforge.trainer.launch import STANDALONE, worker_forkserver

RUNTIME = "trainforge.trainer.runtime"


BASE = ["max_steps=60", "checkpoint.interval_steps=10", "eval_every=20", "batch_size=32", "checkpoint.keep_last=3"]


def command(workdir: Path, overrides: list[str], nproc: int | None = 2) -> list[str]:
    sets = [a for o in [*BASE, *overrides] for a in ("--set", o)]
    # Under the node launcher, as every pod and the local supervisor run it: its exit code is the contract's.
    launcher = [sys.executable, "-m", "trainforge.trainer.launch", f"--nproc-per-node={nproc}", "--", *STANDALONE] if nproc \
        else [sys.executable]
    return [*launcher, "-m", RUNTIME, *sets]


def run(workdir: Path, *overrides: str, nproc: int | None = 2, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """The runtime under the launcher with `nproc` workers (1: launched directly, as a local job's), or alone (None:
    forked from the warm interpreter where there is one, as the launcher would), in `env` (default: this process's)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = command(workdir, list(overrides), nproc)
    environment = dict(os.environ) if env is None else env
    server = worker_forkserver(environment) if nproc is None else None
    result = run_forked(server, RUNTIME, cmd[3:], environment, workdir, 300) if server else None
    if result is None:
        result = subprocess.run(cmd, cwd=workdir, env=environment, capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def start(workdir: Path, *overrides: str, nproc: int | None = 2) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(command(workdir, list(overrides), nproc), cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_step(workdir: Path, step: int, timeout: float = 120) -> None:
    """Until the run's metrics log holds a training step at or past `step`."""
    metrics = workdir / "run" / "metrics.jsonl"

    def reached() -> bool:
        return metrics.exists() and any(json.loads(line).get("step", 0) >= step and "loss" in json.loads(line)
                                        for line in metrics.read_text().splitlines() if line)
    wait_until(reached, timeout, interval=0.05, what=f"step {step} in {metrics}")


def result(workdir: Path) -> dict:
    return json.loads((workdir / "run" / "result.json").read_text())
