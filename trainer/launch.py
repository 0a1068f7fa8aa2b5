"""The node launcher: torchrun under a wrapper whose exit code tells the truth.

torchrun exits 1 whatever happened to its workers: a user's bug, a spot notice, a worker killed by the OOM
killer. Kubernetes restart rules read the container's exit code (PyTorchJob `restartPolicy: ExitCode`, the
Job `podFailurePolicy` of the `trainforge-torch` runtime), so a bare torchrun would turn every preemption
into a permanent failure. This wrapper is the container's command on the cluster and the supervisor's
command locally (one code path): each worker records its own exit code (`exits.record_exit`), and the
node exits with the contract's code for the attempt:

    0      every worker finished
    1-127  a worker's own error (user error: not retried), the first one recorded
    143    preempted: the node was told to stop (SIGTERM/SIGINT), or every worker that stopped took the
           emergency checkpoint (retried)
    137    a worker vanished without a record (SIGKILL, OOM, node loss), or workers failed only because a peer
           on another node did (they record exits.EXIT_PEER_LOST) or their GPU did (exits.EXIT_DEVICE_FAULT): retried

Once every worker of the node has recorded its exit and one failed, the outcome is known: an agent that lingers
(a survivor's rendezvous shutdown against a store that left with another node) is stopped after AGENT_EXIT_GRACE_S.

Usage:
    python -m trainforge.trainer.launch [--nproc-per-node N] [--exit-dir D] -- TORCHRUN_ARGS...
    python -m trainforge.trainer.launch --rank -- COMMAND...   (per-rank wrapper for `entry.command` jobs)

Light on purpose (no torch import): it only starts, forwards signals to, and judges processes.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainforge import exits
from trainforge.trainer import forkserver
from trainforge.trainer.forkserver import ForkedProcess
from trainforge.exits import EXIT_DIR_ENV, EXIT_WORKER_LOST, read_exits, record_exit

# Kubernetes shows this file's content as the container's termination message (`kubectl describe`, the job's
# status): the one line that says why a user error failed the job.
TERMINATION_LOG = Path("/dev/termination-log")


def classify(returncode: int, exit_dir: Path, world_size: int) -> tuple[exits.Outcome, int]:
    """('ok' | 'user_error' | 'retry', code) from torchrun's code and the codes its workers recorded.

    A worker with no record was killed (SIGKILL, OOM, node loss). That is the root cause: the errors its peers
    then hit in collectives ("connection reset by peer") are consequences, so the attempt is retried. Only
    when every worker recorded a code and one of them is 1-127 is it a user error.
    """
    if returncode == 0:
        return exits.Outcome.OK, 0
    codes = [r.code for r in read_exits(exit_dir)]
    if len(codes) < world_size:
        return exits.Outcome.RETRY, -signal.SIGKILL
    failures = [c for c in codes if c != 0]
    if not failures:
        # Every worker finished and said so; a crash after that (seen: SIGABRT "terminate called without an active
        # exception" in interpreter teardown after an FSDP run) must not re-run a finished job.
        return exits.Outcome.OK, 0
    user_errors = [c for c in failures if not exits.is_retryable(c)]
    if user_errors:
        return exits.Outcome.USER_ERROR, user_errors[0]
    # Preempted only when every worker that stopped was preempted. When one worker is killed (OOM, a signal)
    # torchrun stops the others with SIGTERM and they record 143 too: that attempt is a lost worker, which
    # the cluster counts against maxRestarts, not a preemption, which it does not (an OOM loop must end).
    if all(c == exits.EXIT_PREEMPTED for c in failures):
        return exits.Outcome.RETRY, exits.EXIT_PREEMPTED
    return exits.Outcome.RETRY, next((c for c in failures if c != exits.EXIT_PREEMPTED), returncode)


def user_error_message(exit_dir: Path) -> str:
    """The message of the first rank that failed with a user error (1-127), as 'rank R: message'; '' if none."""
    for record in read_exits(exit_dir):
        if record.code != 0 and not exits.is_retryable(record.code) and record.message:
            return f"rank {record.rank}: {record.message}"
    return ""


def report_user_error(exit_dir: Path) -> None:
    message = user_error_message(exit_dir)
    if not message:
        return
    print(f"trainforge: user error, not retried: {message}", file=sys.stderr)
    if TERMINATION_LOG.exists():
        try:
            TERMINATION_LOG.write_text(message)
        except OSError:
            pass  # read-only outside Kubernetes; the stderr line is enough


def node_exit_code(returncode: int, exit_dir: Path, world_size: int, told_to_stop: bool = False) -> int:
    """The one number Kubernetes and the supervisor read: 0, a user error 1-127, or a retryable >= 128.

    A node that was itself told to stop (kubelet on a spot notice or eviction, `trainforge cancel`) was
    preempted, even when the signal came before its workers were up to record it.
    """
    outcome, code = classify(returncode, exit_dir, world_size)
    if outcome is exits.Outcome.RETRY:
        return exits.EXIT_PREEMPTED if told_to_stop or code == exits.EXIT_PREEMPTED else EXIT_WORKER_LOST
    return code


class SignalForwarder:
    """Passes SIGTERM/SIGINT on to the child process, once, and remembers that they came.

    Installed before the child starts, so a signal that arrives while it is starting is held and passed on as
    soon as it exists, instead of killing this process with nobody told.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self._child: Any = None  # a subprocess.Popen or a forkserver.ForkedProcess
        self._forwarded = 0
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def start(self, command: list[str], **popen_kwargs) -> subprocess.Popen:
        return self.adopt(subprocess.Popen(command, **popen_kwargs))

    def adopt(self, child: Any) -> Any:
        """Take a child started elsewhere (a forked worker): a signal that came meanwhile is passed on now."""
        self._child = child
        self._forward()
        return child

    def _on_signal(self, signum: int, _frame) -> None:
        self.received.append(signum)
        self._forward()

    def _forward(self) -> None:
        while self._child is not None and self._forwarded < len(self.received):
            signum = self.received[self._forwarded]
            self._forwarded += 1  # before sending: a signal handled meanwhile must not send this one again
            # A forked child's send_signal checks its known end itself: its poll() reads the server's socket, which
            # the main thread may be reading when this handler runs.
            if isinstance(self._child, ForkedProcess) or self._child.poll() is None:
                self._child.send_signal(signum)


STANDALONE = ["--standalone", "--nnodes=1"]
VIA_TORCHRUN_ENV = "TRAINFORGE_LAUNCH_VIA_TORCHRUN"  # 1: always through torchrun (the benchmark's baseline)
# A fork server's address (trainer/forkserver.py) that has imported the runtime: a worker launched directly is forked
# from it instead of paying torch's import; without one, or where it answers `cold`, the worker starts as before.
WORKER_FORKSERVER_ENV = "TRAINFORGE_WORKER_FORKSERVER"
WORKER_FORKSERVER_OFF = "off"  # every worker cold (to rule the server out when something looks odd)
# What a bundled task's worker imports before its first step (python -X importtime over a run), imported once by the
# worker fork server, and torchrun (a forked torchrun runs its module as `__main__` afresh, its imports warm). Not the
# runtime's __main__ itself: runpy warns when the module it is to run as __main__ was imported before.
TORCHRUN = "torch.distributed.run"
WORKER_MODULES = ["yaml", "argparse", "trainforge.trainer.runtime.api", "trainforge.trainer.runtime.s3", "torch._inductor.config",
                   "torch.distributed.checkpoint._fsspec_filesystem", "torch.utils.serialization", TORCHRUN,
                   "trainforge.trainer.warm_torchrun"]
# What a sweep trial's and a tracked job's worker import on top, where installed (the `sweep` and `tracking` extras):
# the study's storage (SQLAlchemy, and Alembic's schema check, 0.6 s of a trial's start on these machines) and the
# MLflow client (2.1 s). MLflow's import starts one native thread (jemalloc's, for pyarrow through pandas), not a
# Python one: a forked child runs without it, as jemalloc's own fork handlers provide, and frees memory inline.
OPTIONAL_WORKER_MODULES = {
    "optuna": ["optuna.storages._rdb.storage", "optuna.storages._rdb.models", "optuna.pruners", "sqlalchemy.orm",
               "alembic.config", "alembic.command", "alembic.migration"],
    "mlflow": ["mlflow.tracking.client", "mlflow.entities", "mlflow.exceptions"],
}


def worker_modules() -> list[str]:
    """WORKER_MODULES and the optional ones whose distribution is installed (found without importing it)."""
    import importlib.util
    return [*WORKER_MODULES, *(m for top, modules in OPTIONAL_WORKER_MODULES.items() if importlib.util.find_spec(top) for m in modules)]


def worker_directly(torchrun_args: list[str], nproc_per_node: int) -> list[str] | None:
    """One worker on one standalone node (a local job or sweep trial of one process) needs no elastic agent: its
    command, run as torchrun would run it, without torchrun's own interpreter and torch import before it (a
    second or more of every short trial). None where torchrun is needed."""
    if nproc_per_node != 1 or torchrun_args[:2] != STANDALONE or os.environ.get(VIA_TORCHRUN_ENV) == "1":
        return None
    return [sys.executable, *torchrun_args[2:]]


def serve_workers_warm(wait: bool = True) -> subprocess.Popen | None:
    """From now on, a worker that this process or its children launch directly (one process on a standalone node: a
    local job's, a local sweep's trial) is forked from a server that has imported the runtime once, for as long as
    this process lives: it is named in this process's environment (WORKER_FORKSERVER_ENV), which children inherit.
    With `wait`, return once it listens (the import a first worker would have paid anyway); without, at once, and a
    worker launched before it listens starts cold (`warm_workers_ready` waits for it; call that before the first).
    Nothing where the environment already names one (or says `off`), the platform has none (forkserver.supported) or
    it cannot start (said on stderr: workers then start cold)."""
    if os.environ.get(WORKER_FORKSERVER_ENV) or not forkserver.supported():
        return None
    try:
        # The supervisor gives every worker PYTHONUNBUFFERED=1, which a fork cannot change: the server starts with it.
        address, server = forkserver.start(worker_modules(), env={**os.environ, "PYTHONUNBUFFERED": "1"}, wait=wait)
    except RuntimeError as exc:
        print(f"trainforge: workers start cold: {exc}", file=sys.stderr)
        return None
    _WARM_SERVERS.append(server)  # its stdin pipe is its lifeline: held open for as long as this process lives
    if not wait:
        _NOT_YET_READY.append(server)
    os.environ[WORKER_FORKSERVER_ENV] = address
    return server


_WARM_SERVERS: list[subprocess.Popen] = []
_NOT_YET_READY: list[subprocess.Popen] = []  # started without waiting, not yet seen to listen


def warm_workers_ready() -> bool:
    """Wait until the warm worker interpreter this process started without waiting listens, so that the next worker
    is forked, not started cold: call it right before the first worker's launch, after whatever may still refuse the
    run (a `trainforge sweep` refused for its warm start, its own USD budget or the team's then never waits for torch's
    import). False where it did not start: said on stderr, and workers start cold from then on. True at once where
    nothing is pending."""
    while _NOT_YET_READY:
        server = _NOT_YET_READY.pop()
        try:
            forkserver.await_ready(server, worker_modules())
        except RuntimeError as exc:
            print(f"trainforge: workers start cold: {exc}", file=sys.stderr)
            os.environ.pop(WORKER_FORKSERVER_ENV, None)
            return False
    return True


def worker_forkserver(env: dict[str, str]) -> str | None:
    """The address of the worker fork server `env` names; None where it names none or says `off`."""
    server = env.get(WORKER_FORKSERVER_ENV)
    return server if server and server != WORKER_FORKSERVER_OFF else None


def forked_worker(command: list[str], env: dict[str, str], what: str = "worker", tied: bool = False) -> ForkedProcess | None:
    """`command` (`python -m MODULE ...`) forked from the worker fork server the environment names, if there is one
    and it can stand in for a fresh interpreter; None: start it cold. `tied`: killed should this launcher vanish
    first, as a cold child in its process group would be (forkserver.spawn)."""
    server = worker_forkserver(env)
    if server is None or command[1:2] != ["-m"] or len(command) < 3:
        return None
    forked = forkserver.spawn(server, command[2], command[3:], env, tied=tied)
    if forked is not None:  # said, so that "why did my import-time setting not apply?" has an answer in the log
        print(f"trainforge: {what} {forked.pid} forked from the warm interpreter at {server}", file=sys.stderr, flush=True)
    return forked


RANK_PROXY = "trainforge.trainer.rank_proxy"


def through_rank_proxy(torchrun_args: list[str]) -> list[str]:
    """torchrun's arguments with its workers started through trainer/rank_proxy.py (each forked from the warm worker
    interpreter, where that can stand in for a fresh one): `... -m MODULE ARGV` becomes `... -m rank_proxy MODULE
    ARGV`. Unchanged where the workers are no `-m` module after torchrun's own options (a script, `--no-python`)."""
    if "-m" not in torchrun_args or "--no-python" in torchrun_args:
        return torchrun_args
    at = torchrun_args.index("-m")
    if at + 1 >= len(torchrun_args) or not all(a.startswith("-") for a in torchrun_args[:at]):
        return torchrun_args
    return [*torchrun_args[:at + 1], RANK_PROXY, *torchrun_args[at + 1:]]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Once every worker of this node has recorded a failure, how long torchrun's agent has to exit by itself.
AGENT_EXIT_GRACE_S = 30.0


def wait_for_agent(agent: subprocess.Popen | ForkedProcess, exit_dir: Path, nproc_per_node: int, grace_s: float = AGENT_EXIT_GRACE_S) -> int:
    """torchrun's exit code. When every local worker has recorded its exit and one of them failed, the node's outcome
    is known; an agent that lingers then (seen: a survivor's rendezvous shutdown against a store whose host node is
    gone, for longer than a minute) is stopped after `grace_s`, so the pod ends and the job restarts now rather than
    minutes later. A node whose workers all succeeded is left to wait: its agent holds the exit barrier, and maybe the
    store, for the other nodes."""
    failed_at = None
    while True:
        try:
            return agent.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        codes = [r.code for r in read_exits(exit_dir)]
        if len(codes) < nproc_per_node or all(c == 0 for c in codes):
            continue
        failed_at = failed_at if failed_at is not None else time.monotonic()
        if time.monotonic() - failed_at >= grace_s:
            print(f"trainforge: every worker of this node has exited, one failed; torchrun's agent is still up after "
                  f"{grace_s:.0f} s and is stopped", file=sys.stderr)
            agent.terminate()
            try:
                return agent.wait(timeout=10)
            except subprocess.TimeoutExpired:
                agent.kill()
                return agent.wait()


def run_node(torchrun_args: list[str], nproc_per_node: int, exit_dir: Path | None = None) -> int:
    """Run torchrun with `nproc_per_node` workers; return the node's exit code (see the module doc). Without an
    `exit_dir`, the records and torchrun's own log directory live in a temporary directory removed afterwards: a
    laptop's or a sweep's hundreds of runs leave nothing in /tmp. How long torchrun waits for its workers after a
    SIGTERM comes with the environment (contract.torchrun_environment: the pods' and the local backend's)."""
    if exit_dir is None:
        with tempfile.TemporaryDirectory(prefix="trainforge-exit-") as scratch:
            return run_node(torchrun_args, nproc_per_node, Path(scratch))
    # torchrun makes a `torchelastic_*` directory in /tmp per run and never removes it, unless given one (a
    # `--log-dir` among torchrun_args still wins over this environment default).
    env = {"PET_LOG_DIR": str(exit_dir / "torchrun"), **os.environ, EXIT_DIR_ENV: str(exit_dir)}
    # With a warm worker interpreter named, torchrun itself and each of its workers are forked where the server can.
    workers = through_rank_proxy(torchrun_args) if worker_forkserver(env) is not None else torchrun_args
    command = [sys.executable, "-m", TORCHRUN, f"--nproc-per-node={nproc_per_node}", *workers]
    direct = worker_directly(torchrun_args, nproc_per_node)
    if direct is not None:  # the environment torchrun gives its one worker
        command = direct
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(_free_port()))
    signals = SignalForwarder()
    forked = forked_worker(command, env) if direct is not None else forked_worker(command, env, "torchrun", tied=True)
    agent = signals.adopt(forked) if forked is not None else signals.start(command, env=env)
    returncode = wait_for_agent(agent, exit_dir, nproc_per_node)
    code = node_exit_code(returncode, exit_dir, nproc_per_node, told_to_stop=bool(signals.received))
    if 0 < code < 128:
        report_user_error(exit_dir)
    return code


def run_rank(command: list[str]) -> int:
    """Run one rank's own command and record its exit code, as the bundled runtime records its own."""
    if command[0] in ("python", "python3"):  # the job's interpreter, not whichever python is first on PATH
        command = [sys.executable, *command[1:]]
    try:
        child = SignalForwarder().start(command)
    except OSError as exc:  # not found, not executable: the spec's fault
        message = f"entry.command {command[0]!r}: {exc.strerror}"
        print(f"error: {message}", file=sys.stderr)
        record_exit(127, message)
        return 127
    code = child.wait()
    if code < 0:  # killed by signal N: the shell's convention, 128 + N, keeps it retryable
        code = 128 - code
    record_exit(code, f"entry.command {' '.join(command)[:200]!r} exited {code}" if 0 < code < 128 else "")
    return code


def _nproc_from_env() -> int | None:
    value = os.environ.get("PET_NPROC_PER_NODE", "")  # set by both Kubeflow controllers from the job's spec
    return int(value) if value.isdigit() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainforge.trainer.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--nproc-per-node", type=int, default=None, help="workers on this node (default: $PET_NPROC_PER_NODE)")
    parser.add_argument("--exit-dir", type=Path, default=None, help="where workers record their exit codes (default: a temp dir)")
    parser.add_argument("--rank", action="store_true", help="wrap one rank's command instead of launching a node")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="after --: torchrun's arguments, or with --rank the command")
    args = parser.parse_args(argv)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if not rest:
        parser.error("nothing to run: give torchrun's arguments (or, with --rank, a command) after --")
    if args.rank:
        return run_rank(rest)
    nproc = args.nproc_per_node or _nproc_from_env()
    if not nproc or nproc < 1:
        parser.error("--nproc-per-node: give a positive number of workers (or set PET_NPROC_PER_NODE)")
    return run_node(rest, nproc, args.exit_dir)


if __name__ == "__main__":
    raise SystemExit(main())
