"""The shipped stacks run through the real program under the mock engine, once per test run, and what the
engine recorded, read as the provider would receive it."""

from __future__ import annotations

from pathlib import Path

import pulumi

from support import run_cache


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
    test run (evaluated)."""
    from trainforge.stackconfig import read_stack_file

    if path not in _EVALUATED:
        _EVALUATED[path] = evaluated(deployable(path), read_stack_file(path).environment)
    return _EVALUATED[path]


def evaluated(config: dict, environment: str):
    """offline.evaluate(config, environment), once per test run (support/run_cache.py: the first process to need it
    evaluates it, the others of the run read it): for a config a test builds (more teams, another setting) as for a
    shipped stack's."""
    import json

    from trainforge.platform.components.offline import evaluate

    return run_cache.once("evaluation", run_cache.digest(json.dumps(config, sort_keys=True), environment),
                          lambda: evaluate(config, environment))


def typed_config(path: Path):
    """A shipped stack file's typed config, deployable (the deployer's CIDR set)."""
    from trainforge.stackconfig import CONFIG_KEY, parse, read_stack_file

    return parse(deployable(path)[CONFIG_KEY], environment=read_stack_file(path).environment, source=str(path))


def program_manifests(evaluation) -> list[dict]:
    """Every Kubernetes object a stack's `pulumi up` creates: the program's own, and its Helm releases' (rendered
    through the vendored charts; hooks left out, they do not stay)."""
    from support import helm


    rendered, _ = helm.rendered_program(evaluation)
    return [manifest(r) for r in kubernetes_objects(evaluation)] + \
        [o for objects in rendered.values() for o in objects if not helm.is_hook(o)]


def member_groups(evaluation, principal_arn: str) -> tuple[str, ...]:
    """The Kubernetes groups the program's EKS access entry maps an IAM principal to."""
    (entry,) = [r.inputs for r in evaluation.of_type("aws:eks/accessEntry:AccessEntry") if r.inputs["principalArn"] == principal_arn]
    return tuple(entry.get("kubernetesGroups") or ())


RELEASE = "kubernetes:helm.sh/v3:Release"


SECRET_SIG = pulumi.runtime.rpc._special_secret_sig


SIG_KEY = pulumi.runtime.rpc._special_sig_key


def plain(value):
    """What the engine recorded, as the provider would send it: secrets unwrapped, integral floats back to ints."""
    if isinstance(value, dict):
        if value.get(SIG_KEY) == SECRET_SIG:
            return plain(value["value"])
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def is_secret(value) -> bool:
    return isinstance(value, dict) and value.get(SIG_KEY) == SECRET_SIG


def manifest(resource) -> dict:
    return plain(resource.inputs)


def releases(evaluation) -> dict[str, dict]:
    return {r.inputs["name"]: plain(r.inputs) for r in evaluation.of_type(RELEASE)}


def kubernetes_objects(evaluation):
    return [r for r in evaluation.resources if r.type.startswith("kubernetes:") and r.type != RELEASE
            and not r.type.startswith("kubernetes:kustomize")]


def autoscaler_templates(evaluation):
    """Each node group's template, the autoscaler's way, from what the engine recorded: the group's first instance type
    and the Tag resources on its ASG (no config, no contract: the artefacts); a list of trainforge.nodes.NodeTemplate."""
    from trainforge import nodes
    out = []
    for group in evaluation.of_type("aws:eks/nodeGroup:NodeGroup"):
        tags = {t.inputs["tag"]["key"]: t.inputs["tag"]["value"] for t in evaluation.of_type("aws:autoscaling/tag:Tag")
                if t.parent == group.urn}
        out.append(nodes.template_from(group.inputs["nodeGroupNamePrefix"].rstrip("-"), group.inputs["instanceTypes"][0], tags))
    return out
