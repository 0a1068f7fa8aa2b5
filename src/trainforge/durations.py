"""One duration grammar for every setting people type: job specs (`limits.max_runtime`), sweep specs
(`budget.wall_time`) and stack files (Kueue's and the autoscaler's timeouts). A sum of whole units, largest first:
45m, 2h, 1h30m, 1d, 1d12h, 90s. What one accepts the others accept, so a value pasted from one into another works.

Kubernetes components read Go durations, which have no days: `go()` writes a duration their way.
"""

from __future__ import annotations

import re

PATTERN = re.compile(r"^(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?$")
EXAMPLES = "45m, 2h, 1h30m or 1d"
UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
MAX_SECONDS = 366 * 86400  # a year and a day: no job, sweep or timeout runs longer


def seconds(text: str) -> int:
    """The duration in seconds; a ValueError naming the value and the grammar otherwise."""
    found = PATTERN.match(text.strip()) if isinstance(text, str) else None
    if not text or found is None or not any(found.groupdict().values()):
        raise ValueError(f"{text!r} is not a duration. Fix: a number and a unit, e.g. {EXAMPLES}")
    if any(len(found[unit] or "") > 7 for unit, _ in UNITS):
        raise ValueError(f"{text[:40]!r} is longer than anything here runs. Fix: at most {spelled(MAX_SECONDS)}")
    total = sum(int(found[unit] or 0) * size for unit, size in UNITS)
    if total > MAX_SECONDS:
        raise ValueError(f"{text!r} is longer than anything here runs (and than Kubernetes' timeouts take). Fix: at most "
                         f"{spelled(MAX_SECONDS)}")
    return total


def spelled(total: float) -> str:
    """Seconds in this grammar, largest units first (5400 -> 1h30m)."""
    left, parts = int(round(total)), []
    for unit, size in UNITS:
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def go(total: float) -> str:
    """Seconds as a Go duration (hours at most: Go has no days), for Kubernetes components' flags and configs."""
    left, parts = int(round(total)), []
    for unit, size in UNITS[1:]:
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"
