"""One component per team: its namespace and everything in it (platform/manifests/tenancy.py), after the platform
objects it relies on (Kueue's CRDs, the team's FSx volumes)."""

from __future__ import annotations

import pulumi

from trainforge.platform.components.objects import apply
from trainforge.platform.manifests import tenancy
from trainforge.stackconfig import PlatformConfig, TeamConfig


class Tenancy(pulumi.ComponentResource):
    def __init__(self, name: str, cfg: PlatformConfig, team: TeamConfig, *, role_arn: pulumi.Input[str], prices_as_of: str,
                 after: list[pulumi.Resource], opts: pulumi.ResourceOptions):
        super().__init__("trainforge:platform:Tenancy", name, None, opts)
        namespace, *rest = tenancy.team_objects(cfg, team, role_arn=role_arn, prices_as_of=prices_as_of)
        ns = apply(namespace, parent=self)
        self.objects = [ns] + [apply(o, parent=self, depends_on=[ns, *after]) for o in rest]
        self.register_outputs({"namespace": namespace["metadata"]["name"]})
