"""The real `trainforge` CLI in a child process, as a user runs it.

Each call is one real process with its own pid, environment, working directory, exit code, stdout and stderr. By
default it is forked from a server that has already imported the CLI (tests/support/forkserver.py: about 0.05 s a call
instead of a cold interpreter's 0.5 s); `cold_cli` starts a fresh interpreter. An environment that changes how the
interpreter itself starts (a PYTHON* variable) always gets a cold start, and TRAINFORGE_TEST_COLD_CLI=1 makes every
call cold (to rule the server out when something looks odd).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from support.repo import REPO

MODULE = "trainforge.trainer.cli"
SERVER = Path(__file__).with_name("forkserver.py")


def run_cli(*argv: str, home: Path | None = None, env: dict | None = None, cwd: Path = REPO, timeout: float = 300,
            cold: bool = False) -> subprocess.CompletedProcess:
    """`trainforge ARGV` with TRAINFORGE_HOME = `home` when given and `env` over this process's environment."""
    environment = {**os.environ, **({"TRAINFORGE_HOME": str(home)} if home is not None else {}), **(env or {})}
    if cold or os.environ.get("TRAINFORGE_TEST_COLD_CLI") == "1" or _changes_interpreter_start(environment):
        return cold_cli(*argv, env=environment, cwd=cwd, timeout=timeout)
    return _server().run(list(argv), environment, Path(cwd), timeout)


def cold_cli(*argv: str, env: dict, cwd: Path = REPO, timeout: float = 300) -> subprocess.CompletedProcess:
    """A fresh interpreter: `python -m trainforge.trainer.cli ARGV`."""
    return subprocess.run([sys.executable, "-m", MODULE, *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def _changes_interpreter_start(environment: dict) -> bool:
    return any(environment.get(k) != os.environ.get(k) for k in environment.keys() | os.environ.keys() if k.startswith("PYTHON"))


class _ForkServer:
    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="trainforge-cli-")
        atexit.register(shutil.rmtree, self.directory, True)  # the server itself exits when our end of its stdin closes
        self.socket = os.path.join(self.directory, "cli.sock")
        # stdin is a pipe only we hold: when this process ends, however it ends, the server sees EOF and exits.
        self.process = subprocess.Popen([sys.executable, str(SERVER), self.socket], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        cwd=REPO, text=True)
        ready, _, _ = select.select([self.process.stdout], [], [], 120)
        line = self.process.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.process.kill()
            raise RuntimeError(f"the CLI fork server did not start (said {line!r}, exit {self.process.poll()})")

    def run(self, argv: list[str], env: dict, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        args = [sys.executable, "-m", MODULE, *argv]
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
                socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(30)
            conn.connect(self.socket)
            payload = json.dumps({"argv": argv, "env": env, "cwd": str(cwd)}).encode()
            socket.send_fds(conn, [b"%08d" % len(payload)], [out.fileno(), err.fileno()])
            conn.sendall(payload)
            answers = conn.makefile("r")
            pid = int(answers.readline().split()[1])
            conn.settimeout(timeout)
            try:
                code = int(answers.readline().split()[1])
            except (TimeoutError, socket.timeout):
                os.kill(pid, signal.SIGKILL)  # what subprocess.run does on a timeout
                raise subprocess.TimeoutExpired(args, timeout, _read(out), _read(err)) from None
            return subprocess.CompletedProcess(args, code, _read(out), _read(err))


def _read(stream) -> str:
    stream.seek(0)
    # As subprocess's text mode reads a pipe: the locale's encoding, universal newlines.
    with open(os.dup(stream.fileno()), encoding=None, newline=None) as text:
        return text.read()


_SERVERS: dict[int, _ForkServer] = {}


def _server() -> _ForkServer:
    """One server per test process (an xdist worker's own), started on first use."""
    pid = os.getpid()
    if pid not in _SERVERS:
        _SERVERS[pid] = _ForkServer()
    return _SERVERS[pid]
