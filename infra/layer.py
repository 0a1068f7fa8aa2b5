"""The AWS layer: typed config in, AWS resources out, and what the layers above build on (the cluster handle).

The composition root (trainforge.platform.components.program) builds this layer, then the Kubernetes layer on
its cluster handle, then exports the platform contract.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws

from trainforge import catalog, contract
from trainforge.infra.cluster import Addons, Cluster, ClusterHandle
from trainforge.infra.database import MlflowDatabase
from trainforge.infra.image_cache import ImageCache
from trainforge.infra.iam import Role
from trainforge.infra.service_roles import ServiceRoles
from trainforge.infra.keys import Keys
from trainforge.infra.network import Network
from trainforge.infra.nodegroups import EfaSecurityGroup, NodePool
from trainforge.infra.registry import RuntimeImageRepository, project_root
from trainforge.infra.storage import Buckets, LustreFileSystem
from trainforge.infra.tags import cost_tags
from trainforge.infra.teams import TeamAccess
from trainforge.registries import NO_CACHE, ImageSources
from trainforge.stackconfig import PlatformConfig, TeamConfig


def node_flavours(cfg: PlatformConfig) -> dict[str, Any]:
    """What the submitter needs to place a job: labels to select, taints to tolerate, sizes, EFA devices."""
    out: dict[str, Any] = {}
    for group in cfg.node_groups:
        traits = contract.flavour_traits(group.flavour)
        entry = out.setdefault(group.flavour.value, {
            "labels": traits.labels,
            "taints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in traits.taints],
            "node_groups": [], "instance_types": [], "gpus_per_node": None, "max_gpus": 0, "efa_devices_per_node": 0,
        })
        entry["node_groups"].append(group.name)
        entry["instance_types"] += [t for t in group.instance_types if t not in entry["instance_types"]]
        per_node = group.gpus_per_node
        entry["gpus_per_node"] = per_node if entry["gpus_per_node"] is None else min(entry["gpus_per_node"], per_node)
        entry["max_gpus"] += group.max_gpus
        if group.efa:
            entry["efa_devices_per_node"] = catalog.efa_device_count(group.instances[0])
    return out


@dataclass(frozen=True)
class AwsLayer:
    """What the Kubernetes layer builds on, and the AWS half of the platform contract (stack outputs)."""

    cluster: ClusterHandle
    outputs: dict[str, Any]
    file_system: aws.fsx.LustreFileSystem
    buckets: dict[str, aws.s3.Bucket]
    data_key: aws.kms.Key
    database: MlflowDatabase
    runtime_image: pulumi.Output[str]  # the image the platform's own controllers run, pushed before they start
    system_ready: list[pulumi.Resource]  # the system nodes and the add-ons that run there (DNS, EBS and FSx CSI)
    node_groups: dict[str, aws.eks.NodeGroup]  # by config name
    autoscaler_role: Role
    mlflow_role: Role
    team_role_arns: dict[str, pulumi.Output[str]]  # each team's IRSA role, by team name (its pods' AWS identity)
    image_sources: ImageSources = NO_CACHE  # where the charts' images are pulled from (the stack's pull-through cache)
    image_cache_ready: list[pulumi.Resource] = field(default_factory=list)  # the cache's rules and the nodes' right to fill it


def build_aws_layer(cfg: PlatformConfig) -> AwsLayer:
    """Register every AWS resource for `cfg`; each component gets only its own slice of the config."""
    tags = cost_tags(cfg.tags, cfg.environment)
    env = cfg.environment
    provider = aws_provider(cfg)
    aws_opts = pulumi.ResourceOptions(providers={"aws": provider})

    network = Network(env, cfg.network, availability_zones=cfg.availability_zones, region=cfg.region, cluster_name=cfg.cluster_name,
                      tags=tags, opts=aws_opts)
    keys = Keys(env, tags, opts=aws_opts)
    private_subnets = [network.private_subnet_ids[az] for az in cfg.availability_zones]
    cluster = Cluster(cfg.cluster_name, cfg.cluster, private_subnet_ids=private_subnets, secrets_key=keys.secrets, tags=tags, opts=aws_opts)
    network_addons = Addons(cfg.cluster_name, cluster, "network", tags, opts=aws_opts)

    images = RuntimeImageRepository(f"{env}-runtime-image", env, version=_version(), context=str(project_root()),
                                    existing_image=cfg.kubernetes.runtime_image, data_key=keys.data, tags=tags, opts=aws_opts)
    # Before the node groups: the nodes' right to fill the cache is one of their role's policies.
    cache = ImageCache(f"{env}-image-cache", cfg.kubernetes.image_cache, region=cfg.region, node_role=cluster.node_role,
                       registry=images.repository.repository_url.apply(lambda url: url.split("/")[0]), opts=aws_opts)
    node_role = dataclasses.replace(cluster.node_role, attachments=[*cluster.node_role.attachments, *cache.node_policies])
    efa_sg = EfaSecurityGroup(f"{env}-efa", network.vpc_id, tags, opts=aws_opts) if any(g.efa for g in cfg.node_groups) else None
    pools = {}
    for group in cfg.node_groups:
        zones = [group.availability_zone] if group.availability_zone else cfg.availability_zones
        pools[group.name] = NodePool(
            f"{cfg.cluster_name}-{group.name}", group, cluster_name=cluster.cluster.name, autoscaler_cluster_name=cfg.cluster_name,
            node_role=node_role,
            subnet_ids=[network.private_subnet_ids[az] for az in zones], cluster_security_group_id=cluster.security_group_id,
            efa_security_group_id=efa_sg.security_group.id if efa_sg else None, tags=tags,
            opts=pulumi.ResourceOptions(providers={"aws": provider}, depends_on=network_addons.addons),
        )
    system_pools = [pools[g.name].node_group for g in cfg.node_groups if g.flavour is contract.Flavour.SYSTEM]
    workload_addons = Addons(cfg.cluster_name, cluster, "workload", tags, after=system_pools, volume_key=keys.data, opts=aws_opts)

    buckets = Buckets(env, cfg.buckets, data_key=keys.data, tags=tags, opts=aws_opts)
    fsx = LustreFileSystem(
        f"{env}-fsx", cfg.fsx, vpc_id=network.vpc_id, subnet_id=network.private_subnet_ids[cfg.fsx_availability_zone],
        client_security_group_id=cluster.security_group_id, data_key=keys.data, buckets=buckets, tags=tags, opts=aws_opts,
    )

    database = MlflowDatabase(
        f"{env}-mlflow", cfg.kubernetes.mlflow, vpc_id=network.vpc_id, subnet_ids=private_subnets,
        client_security_group_id=cluster.security_group_id, data_key=keys.data, protect=not cfg.buckets.force_destroy,
        tags=tags, opts=aws_opts)

    team_roles = {
        team.name: TeamAccess(
            team_access_name(cfg, team), team, cluster_name=cluster.cluster.name, oidc_provider_arn=cluster.oidc_provider.arn,
            oidc_issuer_url=cluster.oidc_issuer_url,
            bucket_arns={kind: b.arn for kind, b in buckets.buckets.items()}, data_key_arn=keys.data.arn, tags=tags, opts=aws_opts,
        ).role.arn
        for team in cfg.teams
    }

    account = cluster.cluster.arn.apply(lambda arn: arn.split(":")[4])
    service_roles = ServiceRoles(
        f"{env}-services", cluster_name=cfg.cluster_name, region=cfg.region, account=account,
        node_groups=[pool.node_group for pool in pools.values()], artifacts_bucket=buckets.buckets["artifacts"], data_key=keys.data,
        oidc_provider_arn=cluster.oidc_provider.arn, oidc_issuer_url=cluster.oidc_issuer_url, tags=tags, opts=aws_opts)

    handle = cluster.handle()
    outputs = {
        "environment": env,
        "region": cfg.region,
        "cluster_name": handle.name,
        "cluster_endpoint": handle.endpoint,
        "oidc_provider_arn": handle.oidc_provider_arn,
        "oidc_issuer_url": handle.oidc_issuer_url,
        "node_role_arn": handle.node_role_arn,
        "node_flavours": node_flavours(cfg),
        "gpu_capacity": {f.value: n for f, n in cfg.gpu_capacity().items()},
        "fsx": {"id": fsx.file_system.id, "dns_name": fsx.file_system.dns_name, "mount_name": fsx.file_system.mount_name,
                "availability_zone": cfg.fsx_availability_zone, "claim_name": contract.FSX_CLAIM_NAME},
        "buckets": {kind: b.bucket for kind, b in buckets.buckets.items()},
        "bucket_arns": {kind: b.arn for kind, b in buckets.buckets.items()},
        "config_digest": cfg.settings_digest(),  # team stacks refuse to build on a platform deployed from other settings
        "data_key_arn": keys.data.arn,
        "runtime_image_repository": images.repository.repository_url,
        "runtime_image": images.image,
        "team_role_arns": team_roles,
        "kubeconfig": handle.kubeconfig,
        "mlflow_database": database.instance.address,
    }
    return AwsLayer(handle, outputs, fsx.file_system, buckets.buckets, keys.data, database, images.image,
                    [*system_pools, *workload_addons.addons],
                    {name: pool.node_group for name, pool in pools.items()}, service_roles.autoscaler, service_roles.mlflow,
                    team_roles, cache.sources, cache.ready)


def aws_provider(cfg: PlatformConfig) -> aws.Provider:
    """An explicit provider: its default tags reach every taggable resource, even ones AWS creates for us. The platform
    stack's and every team stack's (the same name and inputs, so a team moved out of the platform stack keeps it)."""
    return aws.Provider(f"aws-{cfg.environment}", region=cfg.region,
                        default_tags=aws.ProviderDefaultTagsArgs(tags=cost_tags(cfg.tags, cfg.environment)),
                        allowed_account_ids=[cfg.account_id] if cfg.account_id else None)


def team_access_name(cfg: PlatformConfig, team: TeamConfig) -> str:
    return f"{cfg.environment}-team-{team.name}"


def _version() -> str:
    import trainforge
    return trainforge.__version__
