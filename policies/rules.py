"""CrossGuard rules for trainforge stacks: what must never reach AWS, whoever edits the program or the config.

Each rule is a plain function `(args, report_violation)`; `POLICIES` wraps them for the pack. Building the
`PolicyPack` starts a gRPC server that never returns, so that happens only in policies/__main__.py.
Properties arrive in the engine's camelCase spelling.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Callable

from pulumi_policy import EnforcementLevel, ResourceValidationArgs, ResourceValidationPolicy

from trainforge import contract

Report = Callable[..., None]

# Resources that cost money or hold data: they must be attributable to a cost centre.
COST_BEARING_TYPES = frozenset({
    "aws:eks/cluster:Cluster", "aws:eks/nodeGroup:NodeGroup", "aws:ec2/launchTemplate:LaunchTemplate",
    "aws:ec2/natGateway:NatGateway", "aws:ec2/eip:Eip", "aws:fsx/lustreFileSystem:LustreFileSystem",
    "aws:s3/bucket:Bucket", "aws:kms/key:Key", "aws:ec2/vpc:Vpc", "aws:cloudwatch/logGroup:LogGroup",
})


def launch_templates_require_imdsv2(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != "aws:ec2/launchTemplate:LaunchTemplate":
        return
    md = args.props.get("metadataOptions") or {}
    if md.get("httpTokens") != "required":
        report("IMDSv1 is enabled: set metadata_options.http_tokens = 'required' (SSRF on a node must not yield its role).")
    if md.get("httpPutResponseHopLimit") != 1:
        report(f"metadata hop limit is {md.get('httpPutResponseHopLimit')}: set it to 1 so pods cannot reach the node's role.")


def gpu_node_groups_are_tainted(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != "aws:eks/nodeGroup:NodeGroup" or "NVIDIA" not in str(args.props.get("amiType", "")):
        return
    taints = {(t.get("key"), t.get("effect")) for t in args.props.get("taints") or []}
    if (contract.TAINT_GPU, "NO_SCHEDULE") not in taints:
        report(f"GPU node group without the {contract.TAINT_GPU}:NO_SCHEDULE taint: any pod would land on (and hold) GPU nodes.")


def buckets_block_public_access(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock":
        return
    off = [k for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets") if args.props.get(k) is not True]
    if off:
        report(f"public access block has {off} off: training data and checkpoints must never be public.")


def cluster_endpoint_not_open_to_the_world(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != "aws:eks/cluster:Cluster":
        return
    vpc = args.props.get("vpcConfig") or {}
    if not vpc.get("endpointPublicAccess"):
        return
    cidrs = vpc.get("publicAccessCidrs") or ["0.0.0.0/0"]  # EKS's default when no allowlist is given
    open_ = [c for c in cidrs if ipaddress.ip_network(c, strict=False).prefixlen == 0]
    if open_:
        report("the public API endpoint accepts the whole internet: set cluster.public_access_cidrs to your office/VPN ranges.")


def cost_bearing_resources_carry_cost_tags(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type not in COST_BEARING_TYPES:
        return
    tags: dict[str, Any] = args.props.get("tags") or {}
    missing = [k for k in contract.REQUIRED_COST_TAGS if not tags.get(k)]
    if missing:
        report(f"missing cost-allocation tags {missing}: the bill for this resource could not be attributed.")


def _policy(rule: Callable[[ResourceValidationArgs, Report], None], description: str) -> ResourceValidationPolicy:
    return ResourceValidationPolicy(name=rule.__name__.replace("_", "-"), description=description, validate=rule,
                                    enforcement_level=EnforcementLevel.MANDATORY)


POLICIES = [
    _policy(launch_templates_require_imdsv2, "Launch templates require IMDSv2 with a hop limit of 1."),
    _policy(gpu_node_groups_are_tainted, "GPU node groups carry the nvidia.com/gpu NoSchedule taint."),
    _policy(buckets_block_public_access, "Every S3 public access block turns all four switches on."),
    _policy(cluster_endpoint_not_open_to_the_world, "A public EKS endpoint has a CIDR allowlist narrower than 0.0.0.0/0."),
    _policy(cost_bearing_resources_carry_cost_tags, "Cost-bearing resources carry project, environment, cost-centre, owner, managed-by."),
]
