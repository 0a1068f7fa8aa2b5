"""AWS rules: cost attribution, encryption, access, and what a GPU training platform needs of its nodes.
Each message says what to change."""

from __future__ import annotations

import importlib
import inspect
import ipaddress
import json
from functools import cache
from typing import Any, Iterable, Mapping

from trainforge import catalog, contract
from pulumi_policy import EnforcementLevel

from trainforge.policies.registry import Context, policy_document, resource_rule, statements

LT = "aws:ec2/launchTemplate:LaunchTemplate"
NG = "aws:eks/nodeGroup:NodeGroup"
PROPAGATED = ("instance", "volume", "network-interface")


@cache
def is_taggable(resource_type: str) -> bool:
    """Whether the provider SDK's resource accepts `tags` (asked of the SDK, not a list kept here)."""
    if not resource_type.startswith("aws:") or resource_type.startswith("aws:index/"):
        return False
    module_path, class_name = resource_type.split(":")[1].split("/")[0], resource_type.rsplit(":", 1)[1]
    try:
        cls = getattr(importlib.import_module(f"pulumi_aws.{module_path}"), class_name)
    except (ImportError, AttributeError):
        return False
    return "tags" in inspect.signature(cls._internal_init).parameters


def _missing(tags: Mapping[str, Any], required: Iterable[str]) -> list[str]:
    return [k for k in required if not tags.get(k)]


@resource_rule("aws", is_taggable, "Every taggable AWS resource carries the cost tags, on itself or through the provider's default tags.",
               config=("requiredTags",))
def cost_tags(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    tags = {**ctx.provider_default_tags(), **(props.get("tags") or {})}
    missing = _missing(tags, ctx.config["requiredTags"])
    if missing:
        yield (f"missing cost-allocation tags {missing}: the bill for this {ctx.resource_type.rsplit(':', 1)[-1]} could not be attributed. "
               "Fix: tag it, or create it through the stack's AWS provider (its default tags carry them)")


@resource_rule("aws", [LT], "Launch templates stamp the cost tags on the instances, volumes and interfaces node groups create.",
               config=("requiredTags",))
def launch_templates_tag_what_they_create(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    specs = {s.get("resourceType"): s.get("tags") or {} for s in props.get("tagSpecifications") or []}
    for kind in PROPAGATED:
        missing = _missing(specs.get(kind, {}), ctx.config["requiredTags"])
        if missing:
            yield (f"the {kind}s this template launches lack {missing} (node-group tags do not propagate to them). "
                   f"Fix: a tag_specifications entry for '{kind}' with the cost tags")


@resource_rule("aws", [LT], "Launch templates require IMDSv2 with a hop limit of 1.")
def imdsv2_with_hop_limit_one(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    md = props.get("metadataOptions") or {}
    if md.get("httpTokens") != "required":
        yield "IMDSv1 is enabled: set metadata_options.http_tokens = 'required' (SSRF on a node must not yield its role)"
    if md.get("httpPutResponseHopLimit") != 1:
        yield f"metadata hop limit is {md.get('httpPutResponseHopLimit')}: set it to 1 so pods cannot reach the node's role"


@resource_rule("aws", [LT], "Node root volumes are encrypted and node interfaces get no public IP.")
def node_volumes_encrypted_and_interfaces_private(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    for mapping in props.get("blockDeviceMappings") or []:
        ebs = mapping.get("ebs") or {}
        if str(ebs.get("encrypted")).lower() != "true":
            yield f"volume {mapping.get('deviceName')} is not encrypted. Fix: ebs.encrypted = 'true'"
    for interface in props.get("networkInterfaces") or []:
        if str(interface.get("associatePublicIpAddress")).lower() == "true":
            yield "a node interface gets a public IP. Fix: associate_public_ip_address = 'false' (nodes live in private subnets)"


@resource_rule("aws", ["aws:ec2/subnet:Subnet"], "Subnets hand out no public IPs on launch.")
def subnets_assign_no_public_ips(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    if props.get("mapPublicIpOnLaunch") is True:
        yield "instances in this subnet get public IPs. Fix: map_public_ip_on_launch = False (NAT gateways serve egress)"


@resource_rule("aws", ["aws:eks/cluster:Cluster"], "EKS encrypts Kubernetes secrets with a customer-managed KMS key.")
def eks_secrets_encrypted(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    config = props.get("encryptionConfig") or {}
    if "secrets" not in (config.get("resources") or []) or not (config.get("provider") or {}).get("keyArn"):
        yield "Kubernetes secrets are not envelope-encrypted. Fix: encryption_config with resources ['secrets'] and your KMS key"


@resource_rule("aws", ["aws:eks/cluster:Cluster"], "A public EKS endpoint has a CIDR allowlist narrower than 0.0.0.0/0.")
def cluster_endpoint_not_open_to_the_world(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    vpc = props.get("vpcConfig") or {}
    if not vpc.get("endpointPublicAccess"):
        return
    cidrs = vpc.get("publicAccessCidrs") or ["0.0.0.0/0"]  # EKS's default when no allowlist is given
    if any(ipaddress.ip_network(c, strict=False).prefixlen == 0 for c in cidrs):
        yield "the public API endpoint accepts the whole internet. Fix: set cluster.public_access_cidrs to your office/VPN ranges"


@resource_rule("aws", ["aws:kms/key:Key"], "KMS keys rotate.")
def kms_keys_rotate(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    if props.get("enableKeyRotation") is not True:
        yield "this key never rotates. Fix: enable_key_rotation = True"


@resource_rule("aws", ["aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"],
               "S3 buckets encrypt with KMS.")
def s3_encrypted_with_kms(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    for rule in props.get("rules") or []:
        default = rule.get("applyServerSideEncryptionByDefault") or {}
        if default.get("sseAlgorithm") not in ("aws:kms", "aws:kms:dsse") or not default.get("kmsMasterKeyId"):
            yield "the bucket is not encrypted with your KMS key. Fix: sse_algorithm 'aws:kms' with kms_master_key_id"


@resource_rule("aws", ["aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"], "Every S3 public access block turns all four switches on.")
def s3_public_access_blocked(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    off = [k for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets") if props.get(k) is not True]
    if off:
        yield f"public access block has {off} off: training data and checkpoints must never be public. Fix: set all four to true"


def _denies_insecure_transport(policy: Any) -> bool:
    document = json.loads(policy) if isinstance(policy, str) else policy or {}
    for statement in document.get("Statement") or []:
        condition = (statement.get("Condition") or {}).get("Bool") or {}
        if statement.get("Effect") == "Deny" and str(condition.get("aws:SecureTransport")).lower() == "false":
            return True
    return False


@resource_rule("aws", ["aws:s3/bucketPolicy:BucketPolicy"], "Bucket policies deny requests without TLS.")
def s3_requires_tls(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    if not _denies_insecure_transport(props.get("policy")):
        yield "the bucket accepts plain HTTP. Fix: a Deny statement on aws:SecureTransport = false"


@resource_rule("aws", ["aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"],
               "The datasets' data repository never exports: nothing a job writes on Lustre reaches the datasets bucket.")
def fsx_never_exports(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    events = (((props.get("s3") or {}).get("autoExportPolicy") or {}).get("events")) or []
    if events:
        yield (f"the data repository exports {sorted(events)} to S3: any team could change the shared datasets (and another "
               "team's files could leave through the bucket). Fix: no auto_export_policy")


@resource_rule("aws", ["aws:fsx/lustreFileSystem:LustreFileSystem"], "Persistent FSx file systems are encrypted with your KMS key.")
def fsx_encrypted(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    # Scratch file systems are always encrypted with an FSx-owned key; AWS accepts a customer key only on persistent ones.
    if str(props.get("deploymentType", "")).startswith("PERSISTENT") and not props.get("kmsKeyId"):
        yield "the persistent file system uses the AWS-owned key. Fix: kms_key_id = your data key"


@resource_rule("aws", ["aws:rds/instance:Instance"], "RDS instances are encrypted and not public.")
def rds_encrypted_and_private(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    if props.get("storageEncrypted") is not True:
        yield "the database is not encrypted at rest. Fix: storage_encrypted = True with kms_key_id"
    if props.get("publiclyAccessible") is True:
        yield "the database is reachable from the internet. Fix: publicly_accessible = False (nodes reach it privately)"


def _families(instance_types: Iterable[str]) -> set[str]:
    return {t.split(".", 1)[0] for t in instance_types}


@resource_rule("aws", [NG], "GPU node groups carry the nvidia.com/gpu NoSchedule taint and use allowed GPU families.",
               config=("allowedGpuFamilies",))
def gpu_node_groups_tainted_and_allowed(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    if "NVIDIA" not in str(props.get("amiType", "")):
        return
    taints = {(t.get("key"), t.get("effect")) for t in props.get("taints") or []}
    if (contract.TAINT_GPU, "NO_SCHEDULE") not in taints:
        yield f"GPU node group without the {contract.TAINT_GPU}:NO_SCHEDULE taint: any pod would land on (and hold) GPU nodes. Fix: taint it"
    outside = sorted(_families(props.get("instanceTypes") or []) - set(ctx.config["allowedGpuFamilies"]))
    if outside:
        yield f"families {outside} are not allowed for GPU groups. Fix: use {ctx.config['allowedGpuFamilies']} or extend allowedGpuFamilies"


@resource_rule("aws", [NG], "Spot node groups spread over enough instance types.", config=("minSpotInstanceTypes",))
def spot_groups_diversified(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    types = props.get("instanceTypes") or []
    if props.get("capacityType") == "SPOT" and len(types) < ctx.config["minSpotInstanceTypes"]:
        yield (f"a spot group of {len(types)} instance type(s): one reclaimed pool empties it. "
               f"Fix: list at least {ctx.config['minSpotInstanceTypes']} types with the same GPUs")


@resource_rule("aws", [NG], "Node groups stay within the largest allowed size.", config=("maxNodeGroupSize",))
def node_group_size_bounded(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    size = (props.get("scalingConfig") or {}).get("maxSize") or 0
    if size > ctx.config["maxNodeGroupSize"]:
        yield f"max_size {size:.0f} exceeds {ctx.config['maxNodeGroupSize']}. Fix: a smaller max_size, or raise maxNodeGroupSize in the pack config"


@resource_rule("aws", ["pulumi:providers:aws"], "Stacks deploy only to allowed regions.", config=("allowedRegions",))
def region_allowed(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    allowed = ctx.config["allowedRegions"]
    if allowed and props.get("region") not in allowed:
        yield f"region {props.get('region')!r} is not allowed. Fix: one of {allowed}"


@resource_rule("aws", [LT], "EFA launch templates sit in a placement group and expose a supported type's EFA layout.")
def efa_templates_complete(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    interfaces = props.get("networkInterfaces") or []
    efa = [i for i in interfaces if i.get("interfaceType") in ("efa", "efa-only")]
    if not efa:
        return
    if not (props.get("placement") or {}).get("groupName"):
        yield "EFA interfaces outside a placement group: nodes land on distant racks and EFA loses its point. Fix: placement.group_name"
    cards = sorted(int(i.get("networkCardIndex") or 0) for i in efa)
    if cards and cards[-1] + 1 != len(set(cards)):
        yield f"EFA interfaces on network cards {cards}: some cards have none. Fix: one EFA interface per network card"
    layouts = {n: sum(1 for s in catalog.efa_interface_layout(t) if s.interface_type != "interface") for n, t in catalog.CATALOG.items()
               if t.supports_efa}
    if len(efa) not in layouts.values():
        yield f"{len(efa)} EFA interfaces match no supported instance type's full layout. Fix: every EFA device of the type"


SENSITIVE_PORTS = {22: "SSH", 5432: "PostgreSQL", 3389: "RDP"}


def _world_open_ports(rules: Any) -> Iterable[tuple[int, str]]:
    for rule in rules or []:
        cidrs = set(rule.get("cidrBlocks") or []) | set(rule.get("ipv6CidrBlocks") or [])
        if rule.get("cidrIpv4"):
            cidrs.add(rule["cidrIpv4"])
        if not cidrs & {"0.0.0.0/0", "::/0"}:
            continue
        low, high = int(rule.get("fromPort") or 0), int(rule.get("toPort") or 0)
        everything = str(rule.get("protocol", rule.get("ipProtocol", ""))) == "-1"
        for port, what in SENSITIVE_PORTS.items():
            if everything or low <= port <= high:
                yield port, what


@resource_rule("aws", ["aws:ec2/securityGroup:SecurityGroup", "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"],
               "No security group lets the internet in on SSH, PostgreSQL or RDP.")
def security_groups_closed_to_the_world(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    rules = props.get("ingress") if "ingress" in props else [props]
    for port, what in _world_open_ports(rules):
        yield f"{what} (port {port}) is open to the internet. Fix: allow the security group that needs it, never 0.0.0.0/0"


@resource_rule("aws", ["aws:rds/instance:Instance"], "RDS instances keep daily automated backups.")
def rds_backed_up(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    if int(props.get("backupRetentionPeriod") or 0) < 1:
        yield "the database keeps no automated backups. Fix: backup_retention_period >= 1"


# Advisory: a throwaway dev stack may choose to lose its database on `pulumi destroy`; prod should not.
@resource_rule("aws", ["aws:rds/instance:Instance"], "RDS instances have deletion protection or a final snapshot.",
               level=EnforcementLevel.ADVISORY)
def rds_deletion_protected(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    if props.get("deletionProtection") is not True and props.get("skipFinalSnapshot") is True:
        yield "deleting the database would lose it. Fix: deletion_protection = True, or skip_final_snapshot = False"


@resource_rule("aws", ["aws:s3/bucketVersioning:BucketVersioning"], "Bucket versioning, once configured, stays enabled.")
def bucket_versioning_enabled(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    status = (props.get("versioningConfiguration") or {}).get("status")
    if status != "Enabled":
        yield f"versioning is {status or 'unset'}: an overwritten checkpoint or model could not be recovered. Fix: status = 'Enabled'"


@resource_rule("aws", ["aws:kms/key:Key"], "No KMS key policy allows a wildcard principal without a condition.")
def kms_policies_scoped(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    for statement in statements(policy_document(props.get("policy"))):
        principal = statement.get("Principal")
        aws_principals = principal.get("AWS") if isinstance(principal, Mapping) else None
        wildcard = principal == "*" or "*" in (aws_principals if isinstance(aws_principals, list) else [aws_principals])
        if statement.get("Effect") == "Allow" and wildcard and not statement.get("Condition"):
            yield f"the key policy lets anyone use the key ({statement.get('Action')}). Fix: name the account's principals"
