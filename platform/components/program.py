"""The Pulumi program's composition root: typed config in, the AWS layer, then the Kubernetes layer on the AWS
layer's cluster handle, then the stack outputs (the platform contract). `pulumi up` runs `main()`.

It lives in the platform package because dependencies point one way (core <- infra <- platform): only the top
layer may import both.
"""

from __future__ import annotations

from typing import Any

import pulumi

from trainforge.infra.layer import build_aws_layer
from trainforge.platform.components.kubernetes import build_kubernetes_layer
from trainforge.stackconfig import CONFIG_KEY, ConfigError, PlatformConfig, from_config_map


def config_from_pulumi() -> PlatformConfig:
    """The stack's `trainforge:platform` object, validated. Raises ConfigError naming the field and the fix."""
    namespace, key = CONFIG_KEY.split(":")
    stack = pulumi.get_stack()
    return from_config_map({CONFIG_KEY: pulumi.Config(namespace).get_object(key)}, environment=stack,
                           source=f"stacks/Pulumi.{stack}.yaml")


def build(cfg: PlatformConfig) -> dict[str, Any]:
    """Register every resource of the stack; return the stack outputs."""
    aws_layer = build_aws_layer(cfg)
    kubernetes_layer = build_kubernetes_layer(cfg, aws_layer)  # through aws_layer.cluster.provider
    return {**aws_layer.outputs, **kubernetes_layer.outputs}


def main(refuse_blockers: bool = True) -> None:
    """Entry point for `pulumi up`: a bad config stops here, before any resource, without a traceback. A config that is
    well-formed but cannot deploy (ClusterConfig.deploy_blockers) stops a real update; a preview, and the offline
    evaluation (`refuse_blockers=False`, which shows them itself), only warn."""
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
