"""The Pulumi program's composition root: typed config in, the AWS layer, then the Kubernetes layer on the AWS
layer's cluster handle, then the stack outputs (the platform contract). `pulumi up` runs `main()`.

It lives in the platform package because dependencies point one way (core <- infra <- platform): only the top
layer may import both.
"""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Any

import pulumi

from trainforge.infra.layer import build_aws_layer
from trainforge.platform.components.kubernetes import build_kubernetes_layer
from trainforge.stackconfig import (CONFIG_KEY, stack_file_name, TEAM_CONFIG_KEY, ConfigError, PlatformConfig, TeamConfig, cohort, from_config_map,
                                    load_cohort, split_stack_name, team_from_config_map)

def project_stacks_dir(project: Path = Path(".")) -> Path:
    """Pulumi.yaml's stackConfigDir (where `pulumi` reads Pulumi.<stack>.yaml), relative to the project."""
    import yaml
    try:
        settings = yaml.safe_load((project / "Pulumi.yaml").read_text()) or {}
    except OSError:
        return project / "stacks"
    return project / str(settings.get("stackConfigDir") or ".")


# Where the stack files are: Pulumi.yaml's stackConfigDir, relative to the project (where `pulumi` runs the program).
# The offline engine points it at the directory of the stack file it evaluates, or at none for a config given whole
# (then the cohort is the teams the config lists).
STACKS_DIR: ContextVar[Path | None] = ContextVar("trainforge_stacks_dir", default=project_stacks_dir())  # noqa: B039 - a Path is immutable


def _config_object(key: str) -> Any:
    namespace, name = key.split(":")
    return pulumi.Config(namespace).get_object(name)


def config_from_pulumi() -> PlatformConfig:
    """The stack's `trainforge:platform` object, validated, and checked with the team stacks next to it as one cohort.
    Raises ConfigError naming the field and the fix."""
    stack, stacks_dir = pulumi.get_stack(), STACKS_DIR.get()
    source = str((stacks_dir or Path("stacks")) / stack_file_name(stack))
    cfg = from_config_map({CONFIG_KEY: _config_object(CONFIG_KEY)}, environment=stack, source=source)
    if stacks_dir is not None:
        cohort(cfg, stacks_dir, source)  # e.g. node groups too small for the team stacks' quotas are refused
    return cfg


def team_config_from_pulumi() -> tuple[PlatformConfig, TeamConfig]:
    """A team stack's team, and the platform it builds on, read from the platform's stack file in this checkout and
    checked with every other team of the cohort."""
    stack, stacks_dir = pulumi.get_stack(), STACKS_DIR.get()
    team = team_from_config_map({TEAM_CONFIG_KEY: _config_object(TEAM_CONFIG_KEY)}, stack=stack,
                                source=str((stacks_dir or Path("stacks")) / stack_file_name(stack)))
    if stacks_dir is None:
        raise ConfigError(stack, ["a team stack reads its platform's stack file: evaluate it from its stack file "
                                  "(offline.evaluate_stack_file), not from a config alone"])
    environment, _ = split_stack_name(stack)
    platform_file = stacks_dir / stack_file_name(environment)
    if not platform_file.exists():
        raise ConfigError(str(platform_file), [f"team stack {stack!r} builds on platform stack {environment!r}, whose stack file is "
                                               "not in this checkout. Fix: run it from the project with the platform's stack file"])
    members = load_cohort(platform_file)
    declared = next((t for t in members.teams if t.name == team.name), None)
    if declared != team:
        raise ConfigError(str(stacks_dir / stack_file_name(stack)), [
            "the team this stack is run with differs from its stack file in this checkout. Fix: commit the stack file, then `pulumi up`"])
    return members.platform, team


def is_team_stack() -> bool:
    return split_stack_name(pulumi.get_stack())[1] is not None


def build(cfg: PlatformConfig) -> dict[str, Any]:
    """Register every resource of the stack; return the stack outputs."""
    aws_layer = build_aws_layer(cfg)
    kubernetes_layer = build_kubernetes_layer(cfg, aws_layer)  # through aws_layer.cluster.provider
    return {**aws_layer.outputs, **kubernetes_layer.outputs}


def main(refuse_blockers: bool = True) -> None:
    """Entry point for `pulumi up`: a bad config stops here, before any resource, without a traceback. A config that is
    well-formed but cannot deploy (ClusterConfig.deploy_blockers) stops a real update; a preview, and the offline
    evaluation (`refuse_blockers=False`, which shows them itself), only warn."""
    if is_team_stack() or _config_object(TEAM_CONFIG_KEY) is not None:
        from trainforge.platform.components.team_stack import build_team_stack
        try:  # a team stack under a name that is not <env>.team-<team> is told the naming rule here
            platform, team = team_config_from_pulumi()
        except ConfigError as exc:
            raise pulumi.RunError(str(exc)) from None
        for name, value in build_team_stack(platform, team).items():
            pulumi.export(name, value)
        return
    try:
        cfg = config_from_pulumi()
    except ConfigError as exc:
        raise pulumi.RunError(str(exc)) from None
    blockers = cfg.cluster.deploy_blockers()
    if blockers and refuse_blockers and not pulumi.runtime.is_dry_run():
        raise pulumi.RunError("\n".join(blockers))
    for blocker in blockers if refuse_blockers else []:
        pulumi.warn(blocker)
    for name, value in build(cfg).items():
        pulumi.export(name, value)
