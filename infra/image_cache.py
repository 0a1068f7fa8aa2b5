"""The stack's ECR pull-through cache for the platform's chart images (trainforge.registries says which upstreams and
how a cached image is named): a rule per cached upstream, a creation template for the repositories ECR makes on a
first pull, and the node role's right to trigger those first pulls."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from trainforge.infra.iam import Role
from trainforge.registries import ECR_UPSTREAMS, ImageSources, cached_upstreams
from trainforge.stackconfig.kubernetes import ImageCacheConfig

KEEP_CACHED_IMAGES = 10  # per cached repository: the newest pulls stay (a chart's pinned tags, a rollback's previous ones)


def cache_lifecycle_rules() -> dict:
    return {"rules": [{"rulePriority": 1, "description": f"keep the newest {KEEP_CACHED_IMAGES} images of each cached repository",
                       "selection": {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": KEEP_CACHED_IMAGES},
                       "action": {"type": "expire"}}]}


def node_pull_policy(registry: str, region: str, upstreams: tuple[str, ...]) -> str:
    """A first pull through the cache imports the image and creates its repository as the puller (the node role);
    AmazonEC2ContainerRegistryPullOnly grants the import, not the creation. Both only under the cache's prefixes."""
    account = registry.split(".", 1)[0]
    return json.dumps({"Version": "2012-10-17", "Statement": [{
        "Sid": "PullThroughCache", "Effect": "Allow", "Action": ["ecr:BatchImportUpstreamImage", "ecr:CreateRepository"],
        "Resource": [f"arn:aws:ecr:{region}:{account}:repository/{upstream}/*" for upstream in upstreams]}]})


class ImageCache(pulumi.ComponentResource):
    sources: ImageSources
    ready: list[pulumi.Resource]  # what a pod pulling through the cache waits for: the rules and the node role's right

    def __init__(self, name: str, cfg: ImageCacheConfig, *, registry: pulumi.Output[str], region: str, node_role: Role,
                 opts: pulumi.ResourceOptions | None = None):
        """`registry`: the stack's ECR registry host (`<account>.dkr.ecr.<region>.amazonaws.com`)."""
        super().__init__("trainforge:infra:ImageCache", name, None, opts)
        credentials: dict[str, str] = {str(upstream): arn for upstream, arn in cfg.credentials.items()}
        upstreams = cached_upstreams(cfg.enabled, credentials)
        self.ready = []
        self.node_policies: list[pulumi.Resource] = []  # the node role's too: its node groups wait for them as for the others
        for upstream in upstreams:
            slug = upstream.replace(".", "-")
            self.ready.append(aws.ecr.PullThroughCacheRule(
                f"{name}-{slug}", ecr_repository_prefix=upstream, upstream_registry_url=ECR_UPSTREAMS[upstream],
                credential_arn=credentials.get(upstream), opts=pulumi.ResourceOptions(parent=self)))
            # Mutable tags: ECR refreshes a cached tag from its upstream (immutable tags would block that).
            self.ready.append(aws.ecr.RepositoryCreationTemplate(
                f"{name}-{slug}", prefix=upstream, applied_fors=["PULL_THROUGH_CACHE"],
                description=f"images cached from {upstream} for the platform's charts", image_tag_mutability="MUTABLE",
                lifecycle_policy=json.dumps(cache_lifecycle_rules()), opts=pulumi.ResourceOptions(parent=self)))
        if upstreams:
            rights = aws.iam.RolePolicy(f"{name}-node-pulls", role=node_role.role.id,
                                        policy=registry.apply(lambda host: node_pull_policy(host, region, upstreams)),
                                        opts=pulumi.ResourceOptions(parent=self))
            self.node_policies.append(rights)
            self.ready.append(rights)
        self.sources = ImageSources(registry=registry if upstreams else None, cached=frozenset(upstreams))
        self.register_outputs({"cached": list(upstreams)})
