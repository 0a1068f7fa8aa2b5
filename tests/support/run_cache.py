"""What one test run computes once for all its processes: the stacks evaluated under the mock engine, the charts rendered
and unpacked. Each costs seconds (an evaluation 4-9 s, a render up to 6 s) and every xdist worker used to pay for it.

The pytest process that starts the run (the xdist controller, or the only process with `-n 0`) makes a directory and
names it in TRAINFORGE_TEST_RUN_CACHE; its workers inherit the name. The first process to need a value computes it
under a lock on its key while any other that needs it waits, then reads it; the value is pickled (a stack's evaluation
is about 2 MB and loads in 0.02 s). The directory is removed when the run ends. Nothing outlives a run: a run is one
checkout's code, so a key names only what varies within it (a stack file's content, a release's values).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from support.waiting import wait_until

T = TypeVar("T")

ENV = "TRAINFORGE_TEST_RUN_CACHE"
LOCK_TIMEOUT_S = 900  # the slowest value (the CLI cases cold and forked) takes about a minute on a busy 2-core machine


def start_run() -> None:
    """Called by the process that starts the run, before any worker starts."""
    os.environ[ENV] = tempfile.mkdtemp(prefix="trainforge-test-run-")


def end_run() -> None:
    directory = os.environ.pop(ENV, None)
    if directory:
        shutil.rmtree(directory, ignore_errors=True)


def _directory() -> Path | None:
    directory = os.environ.get(ENV)
    return Path(directory) if directory and Path(directory).is_dir() else None


def digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


@contextmanager
def locked(name: str) -> Iterator[Path | None]:
    """The run's directory, held under an exclusive lock on `name` (None outside a run: the caller works alone)."""
    directory = _directory()
    if directory is None:
        yield None
        return
    with open(directory / f"{name}.lock", "w") as lock:
        wait_until(lambda: _locked(lock), LOCK_TIMEOUT_S, interval=0.05,
                   what=f"the run cache's {name} (another test process computing it; see its output)")
        try:
            yield directory
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _locked(lock) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def once(kind: str, key: str, compute: Callable[[], T]) -> T:
    """`compute()`'s value for (`kind`, `key`), computed by one process of the run and read by the others."""
    name = f"{kind}-{key}"
    with locked(name) as directory:
        if directory is None:
            return compute()
        path = directory / f"{name}.pickle"
        if path.exists():
            with open(path, "rb") as f:
                return pickle.load(f)
        value = compute()
        partial = path.with_suffix(".partial")
        with open(partial, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        partial.rename(path)  # whole or absent, if this process dies mid-write
        return value


def shared_directory(name: str, fill: Callable[[Path], None]) -> Path | None:
    """A directory of the run filled once by `fill(directory)` (None outside a run)."""
    with locked(name) as directory:
        if directory is None:
            return None
        target = directory / name
        if not (directory / f"{name}.done").exists():
            shutil.rmtree(target, ignore_errors=True)  # a process that died while filling it
            target.mkdir()
            fill(target)
            (directory / f"{name}.done").touch()
        return target
