"""Per-team AWS identity: the IRSA role a team's training pods assume, confined to the team's S3 prefix."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from trainforge import contract
from trainforge.stackconfig import TeamConfig
from trainforge.infra.iam import Role, inline_policy, irsa_role, keyed_by_principal
from trainforge.infra.tags import named

WRITABLE_BUCKETS = ("checkpoints", "artifacts")


def team_policy(bucket_arns: dict[str, str], data_key_arn: str, team: str) -> str:
    """Read every dataset; read and write only the team's own prefix of checkpoints and artifacts."""
    prefix = contract.team_s3_prefix(team)
    writable = [bucket_arns[k] for k in WRITABLE_BUCKETS]
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": "ReadDatasets", "Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"],
         "Resource": [bucket_arns["datasets"], f"{bucket_arns['datasets']}/*"]},
        {"Sid": "ListOwnPrefix", "Effect": "Allow", "Action": ["s3:ListBucket", "s3:ListBucketMultipartUploads"], "Resource": writable,
         "Condition": {"StringLike": {"s3:prefix": [prefix, f"{prefix}*"]}}},
        {"Sid": "ReadWriteOwnPrefix", "Effect": "Allow",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
         "Resource": [f"{arn}/{prefix}*" for arn in writable]},
        # The data key only through S3, for the team's buckets (with bucket keys, S3's encryption context is the bucket's
        # ARN; without, the object's): not for decrypting anything else the key protects, from anywhere.
        {"Sid": "UseDataKey", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"], "Resource": data_key_arn,
         "Condition": {"StringLike": {"kms:ViaService": "s3.*.amazonaws.com",
                                      "kms:EncryptionContext:aws:s3:arn": [bucket_arns["datasets"], f"{bucket_arns['datasets']}/*",
                                                                           *writable, *(f"{arn}/{prefix}*" for arn in writable)]}}},
    ]})


def aws_eks_access_entry(prefix: str, position: int, cluster_name: pulumi.Input[str], principal: str, groups: list[str],
                         tags: dict[str, str], parent: pulumi.Resource) -> None:
    name, adopt = keyed_by_principal(prefix, principal, position)
    aws.eks.AccessEntry(name, cluster_name=cluster_name, principal_arn=principal, type="STANDARD", kubernetes_groups=groups,
                        tags=tags, opts=pulumi.ResourceOptions(parent=parent).merge(adopt))


class TeamAccess(pulumi.ComponentResource):
    TYPE = "trainforge:infra:TeamAccess"
    role: Role  # with its storage policy: what the team's pods assume

    def __init__(self, name: str, team: TeamConfig, *, cluster_name: pulumi.Input[str], oidc_provider_arn: pulumi.Input[str],
                 oidc_issuer_url: pulumi.Input[str],
                 bucket_arns: dict[str, pulumi.Input[str]], data_key_arn: pulumi.Input[str], tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__(self.TYPE, name, None, opts)
        # The team's own cost centre, so its identity shows up on the team's bill.
        team_tags = named(tags, name, **{contract.TAG_COST_CENTRE: team.cost_centre, contract.TAG_TEAM: team.name})
        role = irsa_role(
            name, oidc_provider_arn=oidc_provider_arn, oidc_issuer_url=oidc_issuer_url,
            namespace=contract.namespace_name(team.name), service_account=contract.TRAINING_SERVICE_ACCOUNT,
            policy_arns=[], tags=team_tags, parent=self,
        )
        kinds = sorted(bucket_arns)
        self.role = inline_policy(f"{name}-storage", role, pulumi.Output.all(data_key_arn, *(bucket_arns[k] for k in kinds)).apply(
            lambda args: team_policy(dict(zip(kinds, args[1:])), args[0], team.name)))
        # Each member reaches the cluster as the team's group (and the organisation's): RBAC in the namespace does the rest.
        for i, principal in enumerate(team.members):
            aws_eks_access_entry(f"{name}-member", i, cluster_name, principal, [contract.team_group(team.name), contract.ORGANISATION_GROUP],
                                 team_tags, self)
        self.register_outputs({"role_arn": self.role.arn})
