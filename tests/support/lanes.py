"""Markers for where a test runs (tests/conftest.py explains the lanes).

- `full(reason, kept_by=...)`: only in the full lane (`pytest --full`, CI). A variant names the default-lane test of
  its module that keeps the behaviour's proof (ITSELF: another parameter of the same test); conftest refuses a
  full-lane test without a reason or with a `kept_by` that is not a default-lane test.
- `TRAINING`, `TIMING`: xdist groups. Tests in one group run in turn on one worker, never beside each other: two-rank
  torchrun jobs and sweeps (two of them at once would need four cores), and measurements of speed against a baseline.
"""

from __future__ import annotations

import pytest

TRAINING = pytest.mark.xdist_group("training")
TIMING = pytest.mark.xdist_group("timing")
ITSELF = "itself"  # kept_by: another parameter of the same test function runs in the default lane


def full(reason: str, kept_by: str | None = None) -> pytest.MarkDecorator:
    return pytest.mark.full(reason=reason, kept_by=kept_by)


# The stack a heavy per-stack test keeps in the default lane: prod has the most of everything (teams, groups, flavours).
DEFAULT_LANE_STACK = "Pulumi.prod.yaml"


def stack_variants() -> list:
    """Parameters over every platform stack file for a test that starts a real server per stack: the prod stack in the
    default lane, the others in the full lane, kept by the same test on prod."""
    from support.repo import STACK_FILES

    assert DEFAULT_LANE_STACK in {p.name for p in STACK_FILES}
    return [pytest.param(p, id=p.name, marks=() if p.name == DEFAULT_LANE_STACK else
                         full("another stack's copy of a real-server test; the prod stack's runs in the default lane", kept_by=ITSELF))
            for p in STACK_FILES]
