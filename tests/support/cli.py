"""The real `trainforge` CLI in a child process, as a user runs it.

Each call is one real process with its own pid, environment, working directory, exit code, stdout and stderr. By
default it is forked from a server that has already imported the CLI (trainforge.trainer.forkserver: about 0.05 s a call
instead of a cold interpreter's 0.5 s); `cold_cli` starts a fresh interpreter. An environment that changes how the
interpreter itself starts (a PYTHON* variable) always gets a cold start, and TRAINFORGE_TEST_COLD_CLI=1 makes every
call cold (to rule the server out when something looks odd).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from support.forked import run_forked
from support.repo import REPO
from trainforge.trainer import forkserver

MODULE = "trainforge.trainer.cli"


def run_cli(*argv: str, home: Path | None = None, env: dict | None = None, cwd: Path = REPO, timeout: float = 300,
            cold: bool = False) -> subprocess.CompletedProcess:
    """`trainforge ARGV` with TRAINFORGE_HOME = `home` when given and `env` over this process's environment."""
    environment = {**os.environ, **({"TRAINFORGE_HOME": str(home)} if home is not None else {}), **(env or {})}
    if cold or os.environ.get("TRAINFORGE_TEST_COLD_CLI") == "1" or _changes_interpreter_start(environment):
        return cold_cli(*argv, env=environment, cwd=cwd, timeout=timeout)
    return _server().run(list(argv), environment, Path(cwd), timeout)


def run_command(command: list[str], env: dict, cwd: Path = REPO, timeout: float = 300) -> subprocess.CompletedProcess:
    """A container's command as its pod runs it (`env`: the whole environment). `python -m MODULE ARGS` is forked from
    the same warm interpreter as the CLI's, MODULE imported afresh in the child as a new interpreter would; any other
    command, or one the server cannot stand in for, runs as it is."""
    if command[:2] in (["python", "-m"], ["python3", "-m"]) and len(command) > 2 and os.environ.get("TRAINFORGE_TEST_COLD_CLI") != "1" \
            and not _changes_interpreter_start(env):
        forked = run_forked(_server().address, command[2], command[3:], env, cwd, timeout)
        if forked is not None:
            return forked
    return subprocess.run([sys.executable if part in ("python", "python3") else part for part in command],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


class StartedCli:
    """`subprocess.Popen([python, -m, trainforge.trainer.cli, *argv], stdout=<output>, stderr=STDOUT, text=True)` for a
    command a test lets run while it acts (a sweep controller it kills, a Job's pod): forked from the same warm
    interpreter as run_cli where it can be, else cold. Its output goes to `output` (read while it runs), or to a
    temporary file that `communicate` returns. The parts of Popen the tests use: pid, poll, wait, send_signal, kill,
    returncode, communicate."""

    def __init__(self, argv: list[str], env: dict, cwd: Path = REPO, output: Path | None = None):
        self._output = output
        self._out = open(output, "w") if output is not None else tempfile.TemporaryFile("w+")
        self._process: forkserver.ForkedProcess | subprocess.Popen | None = None
        if os.environ.get("TRAINFORGE_TEST_COLD_CLI") != "1" and not _changes_interpreter_start(env):
            with open(os.devnull) as stdin:
                # Tied: a test that dies or is interrupted takes the command with it, as a child in its process
                # group would have gone (a cancelled sweep's controller runs trials of 100,000 steps).
                self._process = forkserver.spawn(_server().address, MODULE, list(argv), env, cwd,
                                                 (stdin.fileno(), self._out.fileno(), self._out.fileno()), tied=True)
        if self._process is None:
            self._process = subprocess.Popen([sys.executable, "-m", MODULE, *argv], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                             stdout=self._out, stderr=subprocess.STDOUT)
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    def poll(self) -> int | None:
        return self._process.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._process.wait(timeout)

    def send_signal(self, signum: int) -> None:
        self._process.send_signal(signum)

    def kill(self) -> None:
        self._process.kill()

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        self.wait(timeout)
        if self._output is not None:
            return self._output.read_text(), None
        self._out.seek(0)
        return self._out.read(), None


def start_cli(*argv: str, env: dict, cwd: Path = REPO, output: Path | None = None) -> StartedCli:
    """`trainforge ARGV` started, not waited for (StartedCli); `env`: the whole environment."""
    return StartedCli(list(argv), env, cwd, output)


def cold_cli(*argv: str, env: dict, cwd: Path = REPO, timeout: float = 300) -> subprocess.CompletedProcess:
    """A fresh interpreter: `python -m trainforge.trainer.cli ARGV`."""
    return subprocess.run([sys.executable, "-m", MODULE, *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def _changes_interpreter_start(environment: dict) -> bool:
    return any(environment.get(k) != os.environ.get(k) for k in environment.keys() | os.environ.keys() if k.startswith("PYTHON"))


# Imported once by the server; commands import the others lazily, and a child that needs them finds them loaded.
# The third-party ones are what the cluster and sweep commands import (py-spy over tests/test_sweep*.py: 100 s of the
# forked children's CPU was importing the Kubernetes client, optuna with its SQL storage and Alembic, ~4 s in the
# server); optuna.importance (4.4 s) and MLflow (3.6 s) are imported by few commands and stay lazy.
PRELOAD = [MODULE, "trainforge.trainer.sweeps.targets", "trainforge.trainer.cli.sweep_views", "trainforge.trainer.spec",
           "trainforge.trainer.sweeps.spec", "trainforge.stackconfig", "trainforge.trainer.kube", "trainforge.trainer.backends.kubernetes",
           "trainforge.trainer.tracking_users"]
OPTIONAL_PRELOAD = {"kubernetes": ["kubernetes"],
                    "optuna": ["optuna", "optuna.storages._rdb.models", "alembic.command", "alembic.config", "alembic.migration",
                               "sqlalchemy.dialects.sqlite", "trainforge.trainer.sweeps.study", "trainforge.trainer.sweeps.controller"]}


def preload() -> list[str]:
    """PRELOAD and the optional modules whose distribution is installed (found without importing it)."""
    import importlib.util
    return [*PRELOAD, *(m for top, modules in OPTIONAL_PRELOAD.items() if importlib.util.find_spec(top) for m in modules)]


class _ForkServer:
    def __init__(self) -> None:
        self.address, self.process = forkserver.start(preload())  # it exits when our end of its stdin closes

    def run(self, argv: list[str], env: dict, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        forked = run_forked(self.address, MODULE, argv, env, cwd, timeout)
        # None: the server cannot stand in for a fresh interpreter here
        return forked if forked is not None else cold_cli(*argv, env=env, cwd=cwd, timeout=timeout)


_SERVERS: dict[int, _ForkServer] = {}
_STARTING = threading.Lock()  # a test's background thread (a Job runner) may ask for it at the same moment as the test


def _server() -> _ForkServer:
    """One server per test process (an xdist worker's own), started on first use."""
    pid = os.getpid()
    with _STARTING:
        if pid not in _SERVERS:
            _SERVERS[pid] = _ForkServer()
        return _SERVERS[pid]
