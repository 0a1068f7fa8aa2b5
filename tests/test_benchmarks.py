"""The benchmarks still run: each in its --quick mode (seconds), checked only for a clean exit and its table or
report. Their numbers are for the closing notes, never a pass/fail here."""

from __future__ import annotations

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
    "bench_sweep.py": "ratio of means",
    "bench_gpu.py": "char_lm",
    "bench_quickstart.py": "quickstart end to end",
    "bench_checkpoint_hash.py": "speed-up vs before",
}


def test_every_benchmark_is_listed_here():
    assert {p.name for p in (REPO / "benchmarks").glob("bench_*.py")} == set(BENCHMARKS)


@QUICK_MODE
@TIMING
@pytest.mark.parametrize("script", BENCHMARKS)
def test_the_benchmark_runs_in_quick_mode(script, tmp_path):
    if script in ("bench_runtime.py", "bench_sweep.py", "bench_gpu.py", "bench_quickstart.py"):
        pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")
    if script == "bench_stack_eval.py":
        pytest.importorskip("pulumi", reason="the platform extra (pulumi) is not installed")
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--quick"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600, env={**os.environ, "COLUMNS": "200", "TRAINFORGE_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert BENCHMARKS[script] in done.stdout, done.stdout[-3000:]


@QUICK_MODE
@TIMING
def test_the_char_lm_search_benchmark_and_the_start_up_measurement_run_in_quick_mode(tmp_path):
    pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")
    for extra, shows in ((["--task", "char_lm"], "steps to target, random / tpe+hyperband"), (["--startup"], "start-up, torchrun / direct")):
        done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_sweep.py"), "--quick", *extra], capture_output=True,
                              text=True, cwd=tmp_path, timeout=600, env={**os.environ, "TRAINFORGE_HOME": str(tmp_path / "home")})
        assert done.returncode == 0 and shows in done.stdout, (done.stdout + done.stderr)[-3000:]
