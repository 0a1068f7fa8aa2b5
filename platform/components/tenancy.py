"""One component per team: its namespace and everything in it (platform/manifests/tenancy.py), after the platform
objects it relies on (Kueue's CRDs, the team's FSx volumes); and its sweep database on the platform's PostgreSQL
(platform/manifests/sweeps.py), after the MLflow namespace and its master credentials; and its MLflow user
(platform/manifests/tracking.py), after the tracking server."""

from __future__ import annotations

from dataclasses import dataclass

from typing import Sequence

import pulumi
import pulumi_random as random

from trainforge import contract
from trainforge.platform.components.objects import apply
from trainforge.platform.manifests import sweeps, tenancy
from trainforge.platform.manifests import tracking as tracking_manifests
from trainforge.stackconfig import PlatformConfig, TeamConfig


@dataclass(frozen=True)
class TrackingUser:
    image: pulumi.Input[str]  # the runtime image: runs the Job that makes the team's MLflow user; the team's jobs' default
    after: Sequence[pulumi.Resource]  # the MLflow release (its server answers the Job)


@dataclass(frozen=True)
class SweepDatabase:
    host: pulumi.Input[str]  # the RDS instance's address
    master_secret: str  # the Secret in the MLflow namespace with the master user's credentials
    after: Sequence[pulumi.Resource]  # that namespace and Secret


class Tenancy(pulumi.ComponentResource):
    TYPE = "trainforge:platform:Tenancy"

    def __init__(self, name: str, cfg: PlatformConfig, team: TeamConfig, *, role_arn: pulumi.Input[str], prices_as_of: str,
                 after: Sequence[pulumi.Resource], database: SweepDatabase, tracking: TrackingUser, opts: pulumi.ResourceOptions):
        super().__init__(self.TYPE, name, None, opts)
        deployed = pulumi.Output.from_input(tracking.image)
        def deployed_prefix(k: int) -> pulumi.Output[str]:
            return deployed.apply(lambda image: contract.image_repository_prefixes(image)[k])
        image_prefixes = [*cfg.image_prefixes(), deployed_prefix(0), deployed_prefix(1)]
        namespace, *rest = tenancy.team_objects(cfg, team, role_arn=role_arn, prices_as_of=prices_as_of, runtime_image=tracking.image,
                                                image_prefixes=image_prefixes)
        ns = apply(namespace, parent=self)
        self.objects = [ns] + [apply(o, parent=self, depends_on=[ns, *after]) for o in rest]
        password = random.RandomPassword(f"{name}-sweeps", length=32, special=False, opts=pulumi.ResourceOptions(parent=self))
        storage = pulumi.Output.all(database.host, password.result).apply(lambda v: sweeps.storage_url(team.name, v[0], v[1]))
        for obj in sweeps.team_sweep_objects(cfg, team, host=database.host, password=pulumi.Output.secret(password.result),
                                             storage=pulumi.Output.secret(storage), master_secret=database.master_secret):
            self.objects.append(apply(obj, parent=self, depends_on=[ns, *database.after, *self.objects[-3:]] if obj["kind"] == "Job"
                                      else [ns, *database.after]))
        # The team's MLflow user: its password in the team's namespace and the MLflow one, and the Job that sets it.
        mlflow_password = random.RandomPassword(f"{name}-mlflow", length=32, special=False, opts=pulumi.ResourceOptions(parent=self))
        in_team, for_job, job = tracking_manifests.team_objects(cfg, team, password=pulumi.Output.secret(mlflow_password.result),
                                                                image=tracking.image)
        secrets = [apply(in_team, parent=self, depends_on=[ns]), apply(for_job, parent=self, depends_on=[*database.after])]
        self.objects += [*secrets, apply(job, parent=self, depends_on=[*secrets, *tracking.after])]
        self.namespace: str = namespace["metadata"]["name"]
        self.register_outputs({"namespace": self.namespace})
