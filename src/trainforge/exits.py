"""How a worker's end is told: its exit code (the supervisor of a local job and a cluster job's restart policy act on
it) and, for its node launcher, a record per rank of the code and the one line a researcher should see."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from trainforge.files import write_whole

# The supervisor (local backend) and the job's restart policy (cluster) act on them.
# training-operator's `restartPolicy: ExitCode` retries 128-255 and fails fast on 1-127, so "preempted" must
# be >= 128: 143 is also what an unhandled SIGTERM gives, and both mean "interrupted, resume me".
EXIT_OK = 0
EXIT_USER_ERROR = 2  # bad config, bad code: retrying cannot help (as is any other code from 1 to 127)
EXIT_PREEMPTED = 143  # interrupted (SIGTERM: spot notice, eviction, cancel); the checkpoint is taken — resume me
EXIT_PEER_LOST = 200  # a collective failed because another rank or the network went away — not this rank's fault: retry
EXIT_SERVICES_DOWN = 201  # a service it needs (API server, database, MLflow) stayed unreachable past its patience: retry
EXIT_DEVICE_FAULT = 202  # the GPU failed (uncorrectable ECC or NVLink error, gone, driver or fabric manager not ready):
# retry, counted against the job's restarts; another node is chosen only where the NVIDIA device plugin marked the
# GPU unhealthy (it does on critical Xid events: ECC, NVLink, fallen off the bus; not for a fabric manager that is down)


EXIT_WORKER_LOST = 128 + signal.SIGKILL  # 137: a worker vanished without a record (SIGKILL, OOM, node loss)


class ServicesDown(Exception):
    """A needed service (the API server, a database, MLflow, the checkpoints' file system) stayed unreachable past the
    patience of the process that needed it (a sweep controller, a trial, a worker reading its checkpoint)."""

    exit_code = EXIT_SERVICES_DOWN


def is_retryable(exit_code: int) -> bool:
    """Killed by a signal or preempted: restart from the last checkpoint. 1-127: a user error, do not retry."""
    return exit_code >= 128 or exit_code < 0  # Popen reports death by signal N as -N


class Outcome(StrEnum):
    """What an attempt's end means, for the node launcher, the local supervisor and the cluster's restart rules alike."""

    OK = "ok"  # every worker finished
    USER_ERROR = "user_error"  # a worker's own error (1-127): retrying cannot help
    RETRY = "retry"  # preempted, or a worker lost: restart from the last checkpoint


def outcome_of(code: int) -> Outcome:
    """An attempt's exit code says it all: 0 done, 1-127 a user error, >= 128 (or death by a signal) retry."""
    if code == 0:
        return Outcome.OK
    return Outcome.RETRY if is_retryable(code) else Outcome.USER_ERROR


# How a worker tells its node launcher why it stopped: the launcher points EXIT_DIR_ENV at a directory, and each
# rank writes `rank<R>.code` (its exit code) and, for a failure, `rank<R>.error` (one line the researcher should
# see: the exception, not "see job.log"). A rank with no code file was killed before it could write one.
EXIT_DIR_ENV = "TRAINFORGE_EXIT_DIR"
ERROR_MESSAGE_MAX_CHARS = 500


@dataclass(frozen=True)
class ExitRecord:
    rank: int
    code: int
    message: str = ""


def record_exit(code: int, message: str = "") -> None:
    """Called by each worker as it exits. A rank with no record was killed: the launcher treats that as the cause."""
    directory = os.environ.get(EXIT_DIR_ENV)
    if not directory:
        return
    rank = os.environ.get("RANK", "0")
    Path(directory).mkdir(parents=True, exist_ok=True)
    # Written whole: the node launcher polls the records while its workers write them, and a rank may write twice (the
    # preemption watcher thread records 143 when the grace runs out, while the main thread may be recording its own
    # code). A launcher that read an empty file crashed with exit 1, which the cluster takes for a user error and never
    # retries.
    if message:  # written before the code: a reader that sees the code sees the message too
        write_whole(Path(directory, f"rank{rank}.error"), message[:ERROR_MESSAGE_MAX_CHARS])
    write_whole(Path(directory, f"rank{rank}.code"), str(code))


def read_exits(directory: Path) -> list[ExitRecord]:
    """Every rank's record in `directory`, by rank."""
    if not directory.exists():
        return []
    out = []
    for path in directory.glob("rank*.code"):
        rank = int(path.stem.removeprefix("rank"))
        error = path.with_suffix(".error")
        out.append(ExitRecord(rank, int(path.read_text()), error.read_text() if error.exists() else ""))
    return sorted(out, key=lambda r: r.rank)
