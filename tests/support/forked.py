"""`subprocess.run(capture_output=True, text=True)` for a process forked from a warm interpreter
(trainforge.trainer.forkserver): the CLI's (support.cli) and the runtime's (support.training)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from trainforge.trainer import forkserver


def run_forked(server: str, module: str, argv: list[str], env: dict, cwd: Path, timeout: float) -> subprocess.CompletedProcess | None:
    """`python -m MODULE ARGV` forked from `server`, stdin empty, stdout and stderr captured as text; None where the
    server cannot stand in for a fresh interpreter (the caller then starts one)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, open(os.devnull) as stdin:
        child = forkserver.spawn(server, module, argv, env, cwd, (stdin.fileno(), out.fileno(), err.fileno()))
        if child is None:
            return None
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()  # what subprocess.run does on a timeout
            raise subprocess.TimeoutExpired(child.args, timeout, _read(out), _read(err)) from None
        return subprocess.CompletedProcess(child.args, code, _read(out), _read(err))


def _read(stream) -> str:
    stream.seek(0)
    # As subprocess's text mode reads a pipe: the locale's encoding, universal newlines.
    with open(os.dup(stream.fileno()), encoding=None, newline=None) as text:
        return text.read()
