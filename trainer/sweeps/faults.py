"""Fault injection for the tests that prove a sweep's launch path survives a kill at every step."""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("trainforge.sweeps")

# Fault injection, for tests that prove the launch path: `TRAINFORGE_SWEEP_KILL_AT=<step>:<n>` makes this controller
# SIGKILL itself the n-th time it reaches <step> — a real kill of a real process, at a moment a test could not hit by
# timing. Unset (always, outside such tests), each point is one dictionary lookup.
KILL_AT_ENV = "TRAINFORGE_SWEEP_KILL_AT"
LAUNCH_STEPS = ("asked", "intended", "admitted", "created", "recorded", "settling")
_reached: dict[str, int] = {}


def kill_point(step: str) -> None:
    wanted = os.environ.get(KILL_AT_ENV)
    if not wanted:
        return
    name, _, nth = wanted.partition(":")
    if name != step:
        return
    _reached[step] = _reached.get(step, 0) + 1
    if _reached[step] == int(nth or 1):
        log.warning("%s=%s: killing this controller (SIGKILL)", KILL_AT_ENV, wanted)
        os.kill(os.getpid(), signal.SIGKILL)


# For tests that prove two writers cannot interleave: `TRAINFORGE_SWEEP_PAUSE_AT=<step>:<gate file>` makes this process
# write `<gate file>.reached` when it reaches <step>, then wait (at most PAUSE_LIMIT_S) until the gate file exists.
PAUSE_AT_ENV = "TRAINFORGE_SWEEP_PAUSE_AT"
PAUSE_LIMIT_S = 120.0


def pause_point(step: str) -> None:
    wanted = os.environ.get(PAUSE_AT_ENV)
    if not wanted:
        return
    name, _, gate = wanted.partition(":")
    if name != step or not gate:
        return
    import time
    from pathlib import Path
    Path(f"{gate}.reached").write_text(str(os.getpid()))
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
