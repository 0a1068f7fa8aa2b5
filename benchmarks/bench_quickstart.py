"""The README's quickstart as a newcomer runs it: `trainforge submit examples/quickstart.yaml`, end to end (CLI start,
admission, supervisor, torchrun, two workers, checkpoints, summary), on this machine as it is and with native bf16
switched off (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2, the case of a CPU without AMX/AVX512_BF16).
Goal: <= 60 s on 2 cores either way (precision: auto must not pick emulated bf16). A benchmark: it never fails on a time.

    python benchmarks/bench_quickstart.py [--quick]     # --quick: 20 steps instead of 300 (CI runs this)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart.yaml"
CASES = {"this machine": {}, "no native bf16 (avx2 ISA)": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}
GOAL_S = 60.0


def run_quickstart(home: Path, spec: Path, variables: dict[str, str]) -> dict:
    env = {**os.environ, "TRAINFORGE_HOME": str(home), **variables}
    env.pop("MLFLOW_TRACKING_URI", None)
    cli = [sys.executable, "-m", "trainforge.trainer.cli"]
    started = time.perf_counter()
    done = subprocess.run([*cli, "submit", str(spec)], env=env, capture_output=True, text=True, cwd=REPO)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"the quickstart failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    name = yaml.safe_load(spec.read_text())["name"]
    status = json.loads(subprocess.run([*cli, "status", name, "-o", "json"], env=env, capture_output=True, text=True,
                                       cwd=REPO, check=True).stdout)
    result = status["progress"]["result"]
    return {"seconds": seconds, "precision": result["precision"], "loss": result["last_eval"].get("loss"),
            "steps": result["step"], "summary_has_node_hours": "node-hours" in done.stdout}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 steps: checks the path, not the time (CI runs this)")
    args = parser.parse_args()
    spec = yaml.safe_load(QUICKSTART.read_text())
    if args.quick:
        spec["hyperparameters"] = {**spec["hyperparameters"], "max_steps": 20, "warmup_steps": 5, "eval_every": 10, "log_every": 5}
        spec["checkpoint"] = {**spec["checkpoint"], "interval_steps": 10}
    table = Table(title=f"quickstart end to end on {os.cpu_count()} cores ({spec['hyperparameters']['max_steps']} steps; "
                        f"goal <= {GOAL_S:.0f} s for the shipped spec)", title_justify="left")
    for column in ("case", "precision chosen", "wall s", "final eval loss", "vs goal"):
        table.add_column(column)
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        for case, variables in CASES.items():
            path = Path(tmp) / f"quickstart-{len(variables)}.yaml"
            path.write_text(yaml.safe_dump(spec, sort_keys=False))
            with console.status(f"quickstart: {case} ..."):
                measured = run_quickstart(Path(tmp) / f"home-{len(variables)}", path, variables)
            if measured["summary_has_node_hours"]:
                raise SystemExit("the run summary prices local wall time as AWS node-hours")
            table.add_row(case, measured["precision"], f"{measured['seconds']:.1f}", f"{measured['loss']:.3f}",
                          f"{measured['seconds'] / GOAL_S:.2f}x")
    console.print(table)


if __name__ == "__main__":
    main()
