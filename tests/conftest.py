from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(*argv: str, home: Path | None = None, env: dict | None = None, cwd: Path = REPO, timeout: float = 300):
    """The real `trainforge` CLI in a child process (this interpreter), as a user runs it: TRAINFORGE_HOME = `home`
    when given, `env` over this process's environment."""
    import os
    import subprocess
    import sys
    environment = {**os.environ, **({"TRAINFORGE_HOME": str(home)} if home is not None else {}), **(env or {})}
    return subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", *argv], capture_output=True, text=True, cwd=cwd,
                          env=environment, timeout=timeout)
STACKS = REPO / "stacks"
# Platform stacks (Pulumi.<env>.yaml); team stacks (Pulumi.<env>.team-<team>.yaml) build on one of them.
STACK_FILES = sorted(p for p in STACKS.glob("Pulumi.*.yaml") if ".team-" not in p.name)
TEAM_STACK_FILES = sorted(STACKS.glob("Pulumi.*.team-*.yaml"))


DEPLOYER_CIDR = "1.2.3.4/32"  # where a test "runs pulumi up from"


def deployable(path: Path) -> dict:
    """A shipped stack's config with the one value it leaves to the deployer set, as the README's deploy section says
    (`pulumi config set --path 'trainforge:platform.cluster.public_access_cidrs[0]' ...`)."""
    import copy

    from trainforge.stackconfig import CONFIG_KEY, read_stack_file

    config = copy.deepcopy(read_stack_file(path).config)
    config[CONFIG_KEY]["cluster"].setdefault("public_access_cidrs", [DEPLOYER_CIDR])
    return config


_EVALUATED: dict[Path, object] = {}


def evaluation_of(path: Path):
    """A stack file (deployable: the deployer's CIDR set) run through the real program under the mock engine, once per
    session."""
    from trainforge.platform.components.offline import evaluate
    from trainforge.stackconfig import read_stack_file

    if path not in _EVALUATED:
        _EVALUATED[path] = evaluate(deployable(path), read_stack_file(path).environment)
    return _EVALUATED[path]


@pytest.fixture(scope="session")
def evaluations():
    """Every stack file, evaluated once (evaluation_of)."""
    return evaluation_of


def program_manifests(evaluation) -> list[dict]:
    """Every Kubernetes object a stack's `pulumi up` creates: the program's own, and its Helm releases' (rendered
    through the vendored charts; hooks left out, they do not stay)."""
    import helm
    from test_platform_layer import kubernetes_objects, manifest

    rendered, _ = helm.rendered_program(evaluation)
    return [manifest(r) for r in kubernetes_objects(evaluation)] + \
        [o for objects in rendered.values() for o in objects if not helm.is_hook(o)]


def member_groups(evaluation, principal_arn: str) -> tuple[str, ...]:
    """The Kubernetes groups the program's EKS access entry maps an IAM principal to."""
    (entry,) = [r.inputs for r in evaluation.of_type("aws:eks/accessEntry:AccessEntry") if r.inputs["principalArn"] == principal_arn]
    return tuple(entry.get("kubernetesGroups") or ())


@pytest.fixture(params=STACK_FILES, ids=[p.name for p in STACK_FILES])
def stack(request, evaluations):
    """One evaluated stack (a new file in stacks/ is picked up with no test edit) and its typed config."""
    from trainforge.stackconfig import CONFIG_KEY, parse, read_stack_file

    config = deployable(request.param)[CONFIG_KEY]
    cfg = parse(config, environment=read_stack_file(request.param).environment, source=str(request.param))
    # The tests loop over the stack's teams, node groups and GPU groups: a stack without them would pass them all
    # vacuously. A stack that means to have none needs tests of its own.
    assert cfg.teams and cfg.node_groups and any(g.has_gpus for g in cfg.node_groups), \
        f"{request.param.name}: the stack tests assume teams and GPU node groups to check"
    return evaluations(request.param), cfg
