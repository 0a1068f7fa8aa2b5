"""CLI start-up time against a bare interpreter, measured side by side (median of --repeats runs).

    python benchmarks/bench_cli_startup.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
CASES = {
    "python -c pass (baseline)": [sys.executable, "-c", "pass"],
    "trainforge --help": [sys.executable, "-m", "trainforge.trainer.cli", "--help"],
    "trainforge render examples/quickstart.yaml": [sys.executable, "-m", "trainforge.trainer.cli", "render", "examples/quickstart.yaml"],
    "trainforge check (reads the dev stack)": [sys.executable, "-m", "trainforge.trainer.cli", "check", "examples/quickstart.yaml",
                                               "--stack", "stacks/Pulumi.dev.yaml", "-o", "json"],
    "trainforge prices show": [sys.executable, "-m", "trainforge.trainer.cli", "prices", "show", "-o", "json"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="two repeats (CI runs this)")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 2
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeats):  # interleaved, so drift hits every case alike
        for name, cmd in CASES.items():
            started = time.perf_counter()
            subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times[name].append(time.perf_counter() - started)
    baseline = statistics.median(times["python -c pass (baseline)"])
    table = Table(title=f"CLI start-up, median of {args.repeats} (goal: <= 0.3 s)", title_justify="left")
    for column in ("command", "median s", "vs bare python"):
        table.add_column(column)
    for name, samples in times.items():
        median = statistics.median(samples)
        table.add_row(name, f"{median:.3f}", f"{median / baseline:.1f}x")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
