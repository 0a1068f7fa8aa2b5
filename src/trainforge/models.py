"""What every validated model shares — the job spec, the sweep spec, the runtime's run config, the stack config: a
strict base (unknown keys are typos, a validated value stays valid, inf/nan is never a setting) and the name patterns.
Imports only pydantic."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

DNS_LABEL = r"^[a-z]([a-z0-9-]*[a-z0-9])?$"  # a Kubernetes object name people choose: jobs, teams, sweeps
RUN_ID = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"  # the runtime's job and team ids (may start with a digit)
S3_URI = r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/(?P<prefix>.*))?$"
# An MLflow experiment's name within a team's (`<team>/<this>`): no path separators, dots-only or control characters.
EXPERIMENT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
LINEAGE_KEY = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
MAX_LINEAGE_VALUE = 500
# Characters that make text say something else than it shows: controls (newlines forge log lines and tags) and the
# bidirectional overrides and isolates (U+202A-E, U+2066-9) that reorder what a reader sees.
_DECEPTIVE = set(range(0x00, 0x20)) | {0x7F} | set(range(0x202A, 0x202F)) | set(range(0x2066, 0x206A)) | {0x200E, 0x200F, 0x061C}


def plain_text(value: str, what: str, max_length: int) -> str:
    """`value` if it is short printable text; else a ValueError naming `what` and the fix."""
    if len(value) > max_length:
        raise ValueError(f"{what} is {len(value)} characters long. Fix: at most {max_length}")
    bad = next((c for c in value if ord(c) in _DECEPTIVE), None)
    if bad is not None:
        raise ValueError(f"{what} holds the control or direction character U+{ord(bad):04X}, which would forge or reorder "
                         "what a reader sees in logs and in MLflow. Fix: plain text on one line")
    return value


def lineage_checked(lineage: dict[str, str]) -> dict[str, str]:
    """A job's lineage tags: short keys of letters, digits, `_.-`; short plain values."""
    if len(lineage) > 50:
        raise ValueError(f"{len(lineage)} lineage entries. Fix: at most 50")
    for key, value in lineage.items():
        if not re.fullmatch(LINEAGE_KEY, key):
            raise ValueError(f"key {key[:80]!r} is not a tag name. Fix: letters, digits, '_', '.', '-', at most 64, e.g. dataset")
        plain_text(value, f"lineage.{key}", MAX_LINEAGE_VALUE)
    return lineage


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
