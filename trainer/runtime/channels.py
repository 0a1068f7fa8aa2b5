"""A run's side channels, wired to its checkpointer: Prometheus metrics (served per local rank), the durable S3 tier
(rank 0 of each node syncs down; the job's rank 0 uploads every commit), and the MLflow run (rank 0), tagged with how
the run ran and where its newest checkpoint is. The loop only logs to them; what each one is told on a commit is
decided here."""

from __future__ import annotations

import logging
import os
import subprocess
import time

from trainforge import contract, run_tags
from trainforge.trainer.runtime.checkpoint import CheckpointManager
from trainforge.trainer.runtime.config import RunConfig
from trainforge.trainer.runtime.distributed import Distributed
from trainforge.trainer.runtime.metrics import RuntimeMetrics
from trainforge.trainer.runtime.precision import Precision
from trainforge.trainer.runtime.tasks import Task, data_checksum

log = logging.getLogger("trainforge.runtime")


def runtime_metrics(cfg: RunConfig, env: Distributed, checkpoints: CheckpointManager) -> RuntimeMetrics:
    """The rank's Prometheus metrics, served on the job's port + local rank when the run config asks for a port."""
    metrics = RuntimeMetrics(job=cfg.job_id, team=cfg.team, rank=env.rank)
    if cfg.metrics.port is not None:
        metrics.serve(cfg.metrics.port + env.local_rank, cfg.metrics.addr)
    metrics.checkpoint_interval_steps.set(cfg.checkpoint.interval_steps)
    if env.local_rank == 0 and os.environ.get(contract.NODE_PRICE_ENV):
        metrics.node_price.set(float(os.environ[contract.NODE_PRICE_ENV]))
    checkpoints.on_commit.append(lambda c, seconds: metrics.checkpoint_committed(c.step, c.committed_at, seconds))
    checkpoints.on_blocked.append(metrics.checkpoint_blocking_seconds.observe)
    return metrics


def durable_tier(cfg: RunConfig, env: Distributed, checkpoints: CheckpointManager, metrics: RuntimeMetrics):
    """The S3 tier behind the local one, on rank 0 (None without `checkpoint.s3_uri`, and on every other rank). The local
    tier is one directory every node shares (DCP's ranks write their shards side by side), so one rank fills it: a
    download on each node's first rank raced into the same directory, and the losers failed the job (exit 1)."""
    if cfg.checkpoint.s3_uri is None or not env.is_main:
        return None
    from trainforge.trainer.runtime.s3 import S3Tier
    tier = S3Tier(cfg.checkpoint.s3_uri, endpoint_url=cfg.checkpoint.s3_endpoint_url,
                  max_concurrency=cfg.checkpoint.s3_max_concurrency, on_event=metrics.s3_event)
    checkpoints.on_commit.append(lambda c, _: tier.enqueue(c))  # what every rank wrote to the shared local tier
    metrics.watch_s3_lag(tier.lag_seconds)
    return tier


def flush_within_grace(tier, guard, grace_s: float) -> None:
    """After an emergency checkpoint (rank 0): the node's disk may vanish with it, so spend what is left of the grace
    period getting the checkpoint out to S3."""
    if tier is None or guard.received_at is None:
        return
    left = grace_s - (time.monotonic() - guard.received_at) - 2.0
    if not tier.flush(max(0.0, left)):
        log.warning("emergency checkpoint not in S3 before the grace period ran out; it is on the local tier only")


def tracking_tags(cfg: RunConfig, env: Distributed, task: Task, precision: Precision) -> dict[str, str]:
    """What the run's MLflow run is tagged with at its start: whose it is, where it comes from, how it runs."""
    tags = {run_tags.TEAM: cfg.team, run_tags.WORLD_SIZE: str(env.world_size), run_tags.TASK: task.name,
            run_tags.PRECISION: f"{precision.chosen} ({precision.reason})", run_tags.GIT_COMMIT: git_commit(),
            run_tags.DATA_CHECKSUM: data_checksum(task), run_tags.IMAGE: os.environ.get("TRAINFORGE_IMAGE", "local")}
    if cfg.sweep:
        tags |= {run_tags.SWEEP: cfg.sweep.study, run_tags.TRIAL_ID: str(cfg.sweep.trial_id)}
        if cfg.sweep.trial_number is not None:
            tags[run_tags.TRIAL] = str(cfg.sweep.trial_number)
        if cfg.sweep.parent_run_id:
            tags[run_tags.MLFLOW_PARENT_RUN] = cfg.sweep.parent_run_id
    lineage = cfg.tracking.lineage
    tags |= {run_tags.lineage_tag(key): value for key, value in lineage.items()}
    if "parent_run_id" in lineage:  # a promoted trial nests under the run it was promoted from
        tags[run_tags.MLFLOW_PARENT_RUN] = lineage["parent_run_id"]
    return tags


def tracker(cfg: RunConfig, env: Distributed, task: Task, precision: Precision, checkpoints: CheckpointManager):
    """The MLflow run, on rank 0 (None without `tracking.uri`); every commit re-points its checkpoint tags."""
    if cfg.tracking.uri is None or not env.is_main:
        return None
    from trainforge.trainer.runtime.tracking import Tracker, flatten
    run = Tracker(cfg.tracking.uri, cfg.tracking.experiment, job_id=cfg.job_id, team=cfg.team, run_name=cfg.job_id,
                  params=flatten(cfg.model_dump(mode="json")), tags=tracking_tags(cfg, env, task, precision))
    # A foreign experiment fails the job before its first step; an unreachable server does not hold it up.
    run.wait_for_first_contact(timeout=30)

    def point_at(c, _):
        pointer = {run_tags.CHECKPOINT_LATEST: str(c.path.resolve()), run_tags.CHECKPOINT_STEP: str(c.step)}
        if cfg.checkpoint.s3_uri:
            pointer[run_tags.CHECKPOINT_S3_PREFIX] = cfg.checkpoint.s3_uri.rstrip("/") + "/" + c.path.name
        run.set_tags(pointer)
    checkpoints.on_commit.append(point_at)
    return run


def git_commit() -> str:
    """The code's version: in the image, the digest of the sources it was built from (TRAINFORGE_SOURCE_DIGEST, what its
    content tag abbreviates: the image carries no commit, so that the same sources always build the same tag); else the
    working tree's commit, else unknown."""
    if os.environ.get("TRAINFORGE_SOURCE_DIGEST", "unknown") != "unknown":
        return "source:" + os.environ["TRAINFORGE_SOURCE_DIGEST"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
