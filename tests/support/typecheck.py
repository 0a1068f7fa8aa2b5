"""mypy started by the xdist controller at session start, beside the workers, and read by the lint test.

mypy's cold run (~80 s on one core) runs beside the workers instead of holding one. The two workers keep 2 cores
about 87 % busy (measured November 2026), so it takes some of their time, under `nice` so that tests keep priority.
Where the suite runs in one process (`-n 0`), or mypy was not started, the test runs it itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from support.repo import REPO
from support.waiting import wait_until

ENV = "TRAINFORGE_TEST_TYPECHECK_DIR"  # inherited by the workers, which the controller starts after pytest_configure
SCRIPT = REPO / "scripts" / "typecheck"

_running: subprocess.Popen | None = None


def start_in_background() -> None:
    global _running
    where = Path(tempfile.mkdtemp(prefix="trainforge-typecheck-"))
    _running = subprocess.Popen(
        ["nice", "-n", "10", "bash", "-c", f'"{SCRIPT}" > output 2>&1; echo $? > rc.part && mv rc.part rc'],
        cwd=where, start_new_session=True)
    os.environ[ENV] = str(where)


def stop() -> None:
    """At session end: a run nobody waited for (its test deselected or failed early) is not left behind."""
    if _running is None:
        return
    if _running.poll() is None:
        os.killpg(_running.pid, signal.SIGKILL)
        _running.wait()
    shutil.rmtree(os.environ.pop(ENV), ignore_errors=True)


def result(timeout: float = 900) -> tuple[int, str]:
    """mypy's exit code and output: the background run's when there is one, else a run of its own."""
    where = os.environ.get(ENV)
    if where is None or not Path(where).is_dir():
        done = subprocess.run([str(SCRIPT)], capture_output=True, text=True, cwd=REPO, timeout=timeout)
        return done.returncode, done.stdout + done.stderr
    rc = Path(where) / "rc"
    wait_until(rc.exists, timeout=timeout, interval=0.5, what=f"the background type check ({where})")
    return int(rc.read_text()), (Path(where) / "output").read_text()


def selected(args: list[str], markexpr: str, invoked_in: Path) -> bool:
    """Whether this session may run the type-check test: the whole tests folder or test_lint.py named, and not the
    inner loop (`-m "not slow"`)."""
    if "not slow" in markexpr:
        return False
    for arg in args:
        path = (invoked_in / arg.split("::")[0]).resolve()
        if path == REPO / "tests" / "test_lint.py" or path in ((REPO / "tests"), REPO):
            return True
    return False
