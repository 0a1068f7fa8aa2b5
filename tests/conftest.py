from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STACKS = REPO / "stacks"
STACK_FILES = sorted(STACKS.glob("Pulumi.*.yaml"))


@pytest.fixture(scope="session")
def evaluations():
    """Every stack file, run once through the real program under the Pulumi mock engine."""
    from trainforge.platform.components.offline import evaluate_stack_file

    cache: dict[Path, object] = {}

    def get(path: Path):
        if path not in cache:
            cache[path] = evaluate_stack_file(path)
        return cache[path]

    return get


@pytest.fixture(params=STACK_FILES, ids=[p.name for p in STACK_FILES])
def stack(request, evaluations):
    """One evaluated stack (a new file in stacks/ is picked up with no test edit) and its typed config."""
    from trainforge.stackconfig import load_stack_file

    return evaluations(request.param), load_stack_file(request.param)
