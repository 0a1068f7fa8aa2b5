"""The names trainforge gives things in MLflow: run tags, their prefixes, and a team's experiment names. Written by
the runtime (each job's run), the sweep controller (a sweep's parent run, and its trials' runs after the fact), read
by the CLI, the promotion of a sweep's best trial and the tests; a rename here reaches all of them."""

from __future__ import annotations

# A run is its job's within its team: two teams' jobs of one name are two runs, in two teams' experiments.
JOB = "trainforge.job_id"
TEAM = "trainforge.team"
SWEEP = "trainforge.sweep"  # on a sweep's parent run and on each of its trials' runs

# What every job's run says about how it ran.
WORLD_SIZE = "trainforge.world_size"
TASK = "trainforge.task"
PRECISION = "trainforge.precision"  # "<chosen> (<why>)"
GIT_COMMIT = "trainforge.git_commit"
DATA_CHECKSUM = "trainforge.data_checksum"
IMAGE = "trainforge.image"
LINEAGE_PREFIX = "trainforge.lineage."  # + each key of the job's tracking.lineage (a promoted trial's origin)
# Where the run's newest committed checkpoint is, re-tagged at every commit.
CHECKPOINT_LATEST = "trainforge.checkpoint.latest"
CHECKPOINT_STEP = "trainforge.checkpoint.step"
CHECKPOINT_S3_PREFIX = "trainforge.checkpoint.s3_prefix"

# A trial's run: set by its rank 0 when it starts (TRIAL_ID, TRIAL), by the controller when it settles (the rest).
TRIAL_ID = "trainforge.trial_id"  # Optuna's storage id
TRIAL = "trainforge.trial"  # the trial's number in its study, as `sweep status` shows it
TRIAL_STATE = "trainforge.trial.state"
TRIAL_COST_USD = "trainforge.trial.cost_usd"
TRIAL_VALUE = "trainforge.trial.value"

# A sweep's parent run, when the sweep finishes.
SWEEP_FINISHED_BECAUSE = "trainforge.sweep.finished_because"
SWEEP_BEST_TRIAL = "trainforge.sweep.best_trial"
SWEEP_BEST_JOB = "trainforge.sweep.best_job"

# MLflow's own tag that nests a run under another.
MLFLOW_PARENT_RUN = "mlflow.parentRunId"


def lineage_tag(key: str) -> str:
    return f"{LINEAGE_PREFIX}{key}"


def team_experiment(team: str, experiment: str) -> str:
    """The MLflow experiment a team's `tracking.experiment` names: under the team's name, so teams never share one."""
    return f"{team}/{experiment}"
