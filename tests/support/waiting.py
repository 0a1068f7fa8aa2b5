"""Waiting for a real signal (a file, a state, an answer from a server): polled, bounded, never a fixed sleep.

This is the suite's one polling primitive: tests/test_layout.py refuses `time.sleep(` anywhere else in the tests, so a
wait that would race on a slower, busier CI machine cannot creep in.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 180, interval: float = 0.2, what: str | None = None) -> T:
    """The first truthy value `predicate` returns, polled every `interval` seconds; TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not within {timeout} s: {what or getattr(predicate, '__name__', 'the condition')}")
        time.sleep(interval)


@contextmanager
def repeating(step: Callable[[], None], interval: float = 0.2) -> Iterator[None]:
    """`step` run every `interval` seconds in a background thread while the block runs (a test playing a controller),
    stopped and joined after."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            step()
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
