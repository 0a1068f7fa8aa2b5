from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STACKS = REPO / "stacks"
STACK_FILES = sorted(STACKS.glob("Pulumi.*.yaml"))


DEPLOYER_CIDR = "1.2.3.4/32"  # where a test "runs pulumi up from"


def deployable(path: Path) -> dict:
    """A shipped stack's config with the one value it leaves to the deployer set, as the README's deploy section says
    (`pulumi config set --path 'trainforge:platform.cluster.public_access_cidrs[0]' ...`)."""
    import copy

    from trainforge.stackconfig import CONFIG_KEY, read_stack_file

    config = copy.deepcopy(read_stack_file(path).config)
    config[CONFIG_KEY]["cluster"].setdefault("public_access_cidrs", [DEPLOYER_CIDR])
    return config


@pytest.fixture(scope="session")
def evaluations():
    """Every stack file (deployable: the deployer's CIDR set), run once through the real program under the mock engine."""
    from trainforge.platform.components.offline import evaluate
    from trainforge.stackconfig import read_stack_file

    cache: dict[Path, object] = {}

    def get(path: Path):
        if path not in cache:
            cache[path] = evaluate(deployable(path), read_stack_file(path).environment)
        return cache[path]

    return get


@pytest.fixture(params=STACK_FILES, ids=[p.name for p in STACK_FILES])
def stack(request, evaluations):
    """One evaluated stack (a new file in stacks/ is picked up with no test edit) and its typed config."""
    from trainforge.stackconfig import CONFIG_KEY, parse, read_stack_file

    config = deployable(request.param)[CONFIG_KEY]
    return evaluations(request.param), parse(config, environment=read_stack_file(request.param).environment, source=str(request.param))
