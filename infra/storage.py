"""S3 buckets (datasets, checkpoints, artifacts) and FSx for Lustre next to the GPU nodes."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from trainforge.stackconfig import BucketsConfig, FsxConfig
from trainforge.infra.tags import named

BUCKET_KINDS = ("datasets", "checkpoints", "artifacts")
# An overwritten or deleted checkpoint, or MLflow artifact (a registered model's files), can be recovered.
VERSIONED_BUCKETS = frozenset({"checkpoints", "artifacts"})
LUSTRE_VERSION = "2.15"  # needed for data repository associations on scratch file systems; AWS's recommendation
LUSTRE_PORTS = ((988, 988), (1018, 1023))  # Lustre's LNet ports, from clients and between file servers
ALL_S3_EVENTS = ["NEW", "CHANGED", "DELETED"]


class Buckets(pulumi.ComponentResource):
    buckets: dict[str, aws.s3.Bucket]

    def __init__(self, name: str, cfg: BucketsConfig, *, data_key: aws.kms.Key, tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainforge:infra:Buckets", name, None, opts)
        self.buckets = {kind: self._bucket(f"{name}-{kind}", kind, cfg, data_key, tags) for kind in BUCKET_KINDS}
        self.register_outputs({kind: b.bucket for kind, b in self.buckets.items()})

    def _bucket(self, name: str, kind: str, cfg: BucketsConfig, data_key: aws.kms.Key, tags: dict[str, str]) -> aws.s3.Bucket:
        bucket = aws.s3.Bucket(name, force_destroy=cfg.force_destroy, tags=named(tags, name, purpose=kind),
                               opts=pulumi.ResourceOptions(parent=self))
        child = pulumi.ResourceOptions(parent=bucket)
        aws.s3.BucketOwnershipControls(name, bucket=bucket.id, opts=child, rule=aws.s3.BucketOwnershipControlsRuleArgs(
            object_ownership="BucketOwnerEnforced"))  # ACLs off: access is IAM only
        aws.s3.BucketPublicAccessBlock(name, bucket=bucket.id, block_public_acls=True, block_public_policy=True,
                                       ignore_public_acls=True, restrict_public_buckets=True, opts=child)
        aws.s3.BucketServerSideEncryptionConfiguration(name, bucket=bucket.id, opts=child, rules=[
            aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                    sse_algorithm="aws:kms", kms_master_key_id=data_key.arn),
                bucket_key_enabled=True,  # one KMS call per bucket key, not per object: checkpoints are many parts
            )])
        aws.s3.BucketPolicy(name, bucket=bucket.id, opts=child, policy=bucket.arn.apply(lambda arn: json.dumps({
            "Version": "2012-10-17", "Statement": [{
                "Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
                "Resource": [arn, f"{arn}/*"], "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]})))

        rules = [aws.s3.BucketLifecycleConfigurationRuleArgs(
            id="abort-incomplete-multipart-uploads", status="Enabled",
            filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
            abort_incomplete_multipart_upload=aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                days_after_initiation=cfg.abort_incomplete_multipart_days),
        )]
        depends_on: list[pulumi.Resource] = []
        if kind in VERSIONED_BUCKETS:
            versioning = aws.s3.BucketVersioning(name, bucket=bucket.id, opts=child,
                                                 versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"))
            depends_on.append(versioning)
            rules.append(aws.s3.BucketLifecycleConfigurationRuleArgs(
                id="expire-noncurrent-versions", status="Enabled",
                filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                    noncurrent_days=cfg.noncurrent_version_expiration_days),
            ))
        aws.s3.BucketLifecycleConfiguration(name, bucket=bucket.id, rules=rules,
                                            opts=pulumi.ResourceOptions(parent=bucket, depends_on=depends_on))
        return bucket


def fsx_s3_access_role_arn(file_system_arn: str) -> str:
    """The service-linked role FSx creates for a file system's S3 data repository (FSx Lustre guide)."""
    _, partition, _, _, account, resource = file_system_arn.split(":", 5)
    file_system_id = resource.rsplit("/", 1)[-1]
    return (f"arn:{partition}:iam::{account}:role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/"
            f"AWSServiceRoleForFSxS3Access_{file_system_id}")


class LustreFileSystem(pulumi.ComponentResource):
    file_system: aws.fsx.LustreFileSystem
    security_group: aws.ec2.SecurityGroup

    def __init__(self, name: str, fsx: FsxConfig, *, vpc_id: pulumi.Input[str], subnet_id: pulumi.Input[str],
                 client_security_group_id: pulumi.Input[str], data_key: aws.kms.Key, buckets: Buckets,
                 tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainforge:infra:LustreFileSystem", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-lustre", vpc_id=vpc_id, description="FSx for Lustre: LNet from cluster nodes and between file servers",
            ingress=[aws.ec2.SecurityGroupIngressArgs(protocol="tcp", from_port=lo, to_port=hi, self=True,
                                                      security_groups=[client_security_group_id], description=f"Lustre {lo}-{hi}")
                     for lo, hi in LUSTRE_PORTS],
            egress=[aws.ec2.SecurityGroupEgressArgs(protocol="-1", from_port=0, to_port=0, cidr_blocks=["0.0.0.0/0"])],
            tags=named(tags, f"{name}-lustre"), opts=child,
        )
        # Lustre servers open connections back to their clients (988, 1018-1023): the nodes must accept them.
        for lo, hi in LUSTRE_PORTS:
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-clients-{lo}-{hi}", security_group_id=client_security_group_id,
                referenced_security_group_id=self.security_group.id, ip_protocol="tcp", from_port=lo, to_port=hi,
                description=f"Lustre {lo}-{hi} from the file servers", tags=named(tags, f"{name}-clients-{lo}-{hi}"), opts=child)
        persistent = fsx.persistent
        self.file_system = aws.fsx.LustreFileSystem(
            name, deployment_type=fsx.deployment_type, storage_type="SSD", storage_capacity=fsx.storage_capacity_gib,
            per_unit_storage_throughput=fsx.per_unit_storage_throughput, file_system_type_version=LUSTRE_VERSION,
            subnet_ids=subnet_id, security_group_ids=[self.security_group.id],  # v7 takes exactly one subnet
            # Scratch file systems are always encrypted with an FSx-owned key; AWS accepts a customer key only
            # for persistent ones.
            kms_key_id=data_key.arn if persistent else None,
            data_compression_type="LZ4", copy_tags_to_backups=True if persistent else None,
            automatic_backup_retention_days=fsx.backup_days,
            tags=named(tags, name), opts=child,
        )
        if fsx.data_repository is not None:
            repo = fsx.data_repository
            bucket = buckets.buckets[repo.bucket]
            association = aws.fsx.DataRepositoryAssociation(
                f"{name}-{repo.bucket}", file_system_id=self.file_system.id, file_system_path=repo.file_system_path,
                data_repository_path=bucket.bucket.apply(lambda b: f"s3://{b}/{repo.prefix}"),
                batch_import_meta_data_on_create=True,
                s3=aws.fsx.DataRepositoryAssociationS3Args(
                    auto_import_policy=aws.fsx.DataRepositoryAssociationS3AutoImportPolicyArgs(events=ALL_S3_EVENTS) if repo.auto_import else None,
                    # Off means an empty event list, not an absent block: the provider keeps a policy it once set
                    # when the block is removed (Optional+Computed upstream).
                    auto_export_policy=aws.fsx.DataRepositoryAssociationS3AutoExportPolicyArgs(events=ALL_S3_EVENTS if repo.auto_export else []),
                ),
                tags=named(tags, f"{name}-{repo.bucket}"), opts=child,
            )
            # The association reaches the SSE-KMS bucket as the file system's service-linked role, created with the
            # association: without a grant on the bucket's key, lazy loads and auto-export are denied.
            aws.kms.Grant(
                f"{name}-s3-access", key_id=data_key.key_id, grantee_principal=self.file_system.arn.apply(fsx_s3_access_role_arn),
                operations=["Encrypt", "Decrypt", "ReEncryptFrom", "ReEncryptTo", "GenerateDataKey",
                            "GenerateDataKeyWithoutPlaintext", "DescribeKey"],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[association]),
            )
        self.register_outputs({"id": self.file_system.id, "dns_name": self.file_system.dns_name,
                               "mount_name": self.file_system.mount_name})
