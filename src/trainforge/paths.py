"""Where trainforge keeps things on a researcher's machine (`$TRAINFORGE_HOME`, default ~/.trainforge) and inside a
run's output directory. Every layer that reads or writes these paths asks here, so the layout is written once.

    $TRAINFORGE_HOME/
      jobs/<name>/            one local job: spec.yaml, state.json, job.log, supervisor.log, run/, checkpoints/, exit/
      prices/<region>.yaml    prices fetched by `trainforge prices refresh`, overriding the shipped table there
      sweeps/<name>/          one sweep started here: sweep.json (where its study lives), study.db (local sweeps), report/
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from trainforge.errors import TrainforgeError

# Files the runtime writes into its output directory (`RunConfig.output_dir`); the local backend reads them.
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"
PREEMPTED_FILE = "preempted.json"
FINAL_MODEL_FILE = "final_model.pt"
PIDS_DIR = "pids"
# A checkpoint directory: one sub-directory per step, whole once its commit marker exists (runtime/checkpoint.py).
CHECKPOINT_STEP_PREFIX = "step-"
CHECKPOINT_COMMIT_MARKER = "COMMITTED"
SWEEP_STUDY_FILE = "study.db"  # in a sweep's directory: a local sweep's Optuna study (SQLite), beside its record
# Inside a local job's directory.
JOB_SPEC_FILE = "spec.yaml"
JOB_STATE_FILE = "state.json"
JOB_LOG_FILE = "job.log"
SUPERVISOR_LOG_FILE = "supervisor.log"
JOB_RUN_DIR = "run"
JOB_CHECKPOINT_DIR = "checkpoints"
JOB_EXIT_DIR = "exit"
# Space held back while a job runs, given up to record how it ended when the disk fills (a job is never left
# `running` because its last record could not be written).
JOB_RESERVE_FILE = "reserve"


def home() -> Path:
    return Path(os.environ.get("TRAINFORGE_HOME", Path.home() / ".trainforge"))


# Every name that becomes a path segment under home() is one of these; anything else ("../x", "a/b", "") could
# reach outside the directory it names, so it is refused before a path is built.
NAME = re.compile(r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$")  # job and sweep names: the job spec's DNS label
REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]$")  # an AWS region, e.g. us-east-1


def checked_segment(kind: str, value: str, pattern: re.Pattern[str], example: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise TrainforgeError("", f"{kind}: not a valid {kind} (got {value!r}). Fix: use a name like {example!r} "
                                  f"(lowercase letters, digits and '-')")
    return value


def job_name(name: str) -> str:
    """A job name given on the command line, checked before any backend uses it in a path or an API URL."""
    return checked_segment("job name", name, NAME, "my-job")


def jobs_dir() -> Path:
    return home() / "jobs"


# What a job's directory holds that trainforge writes, reads back or deletes in: none may be a symbolic link, or a
# job would write its checkpoints (and rank 0 delete `step-*` directories) wherever the link points, and `logs` would
# print any file the user may read (a shared machine's other users' files through a planted link).
JOB_ENTRIES = (JOB_SPEC_FILE, JOB_STATE_FILE, JOB_LOG_FILE, SUPERVISOR_LOG_FILE, JOB_RUN_DIR, JOB_CHECKPOINT_DIR, JOB_EXIT_DIR,
               JOB_RESERVE_FILE)


def job_dir(name: str) -> Path:
    """The job's directory under home(); refused if it or anything trainforge keeps in it is a symbolic link (home itself
    may be one: a link to a larger disk is how people place it)."""
    directory = jobs_dir() / job_name(name)
    for path in (directory, *(directory / entry for entry in JOB_ENTRIES)):
        if path.is_symlink():
            raise TrainforgeError("", f"{path} is a symbolic link (to {os.readlink(path)}): a job writes, reads and deletes "
                                      "only inside $TRAINFORGE_HOME. Fix: remove the link (rm it), or set TRAINFORGE_HOME "
                                      "to the directory itself")
    return directory


def refreshed_prices_dir() -> Path:
    return home() / "prices"


def refreshed_prices_file(region: str) -> Path:
    return refreshed_prices_dir() / f"{checked_segment('region', region, REGION, 'us-east-1')}.yaml"


def sweep_dir(name: str) -> Path:
    return home() / "sweeps" / checked_segment("sweep name", name, NAME, "my-sweep")
