"""Where trainforge keeps things on a researcher's machine (`$TRAINFORGE_HOME`, default ~/.trainforge) and inside a
run's output directory. Every layer that reads or writes these paths asks here, so the layout is written once.

    $TRAINFORGE_HOME/
      jobs/<name>/            one local job: spec.yaml, state.json, job.log, supervisor.log, run/, checkpoints/, exit/
      prices/<region>.yaml    prices fetched by `trainforge prices refresh`, overriding the shipped table there
      sweeps/<name>/          one sweep started here: sweep.json (where its study lives), study.db (local sweeps), report/
"""

from __future__ import annotations

import os
from pathlib import Path

# Files the runtime writes into its output directory (`RunConfig.output_dir`); the local backend reads them.
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"
PREEMPTED_FILE = "preempted.json"
FINAL_MODEL_FILE = "final_model.pt"
PIDS_DIR = "pids"
# Inside a local job's directory.
JOB_SPEC_FILE = "spec.yaml"
JOB_STATE_FILE = "state.json"
JOB_LOG_FILE = "job.log"
SUPERVISOR_LOG_FILE = "supervisor.log"
JOB_RUN_DIR = "run"
JOB_CHECKPOINT_DIR = "checkpoints"
JOB_EXIT_DIR = "exit"


def home() -> Path:
    return Path(os.environ.get("TRAINFORGE_HOME", Path.home() / ".trainforge"))


def jobs_dir() -> Path:
    return home() / "jobs"


def job_dir(name: str) -> Path:
    return jobs_dir() / name


def refreshed_prices_dir() -> Path:
    return home() / "prices"


def sweep_dir(name: str) -> Path:
    return home() / "sweeps" / name
