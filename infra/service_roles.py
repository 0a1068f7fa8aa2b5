"""The AWS identities of the platform's own services, each bound by IRSA to one Kubernetes service account:
cluster-autoscaler (may resize only this stack's node groups) and the MLflow server (its artifact prefix only)."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from trainforge import contract
from trainforge.infra.iam import Role, inline_policy, irsa_role
from trainforge.infra.nodegroups import asg_name
from trainforge.infra.tags import named

MLFLOW_ARTIFACT_PREFIX = f"{contract.MLFLOW_ARTIFACT_PATH}/"  # the chart's artifactRoot path, as a key prefix


def autoscaler_policy(cluster_name: str, asg_arns: list[str]) -> str:
    """Read anything it must read to simulate nodes; change the size only of this stack's groups (by ARN, and only
    while they carry the cluster's discovery tag)."""
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": "Discover", "Effect": "Allow", "Resource": "*", "Action": [
            "autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances", "autoscaling:DescribeLaunchConfigurations",
            "autoscaling:DescribeScalingActivities", "autoscaling:DescribeTags", "ec2:DescribeImages", "ec2:DescribeInstanceTypes",
            "ec2:DescribeLaunchTemplateVersions", "ec2:GetInstanceTypesFromInstanceRequirements", "eks:DescribeNodegroup"]},
        {"Sid": "ResizeOwnGroups", "Effect": "Allow", "Resource": sorted(asg_arns),
         "Action": ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
         "Condition": {"StringEquals": {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster_name}": "owned"}}},
    ]})


def asg_arn(region: str, account: str, asg_name: str) -> str:
    return f"arn:aws:autoscaling:{region}:{account}:autoScalingGroup:*:autoScalingGroupName/{asg_name}"


def autoscaler_role(name: str, *, cluster_name: str, region: str, account: pulumi.Input[str], node_groups: list[aws.eks.NodeGroup],
                    oidc_provider_arn: pulumi.Input[str], oidc_issuer_url: pulumi.Input[str], tags: dict[str, str],
                    parent: pulumi.Resource) -> Role:
    role = irsa_role(name, oidc_provider_arn=oidc_provider_arn, oidc_issuer_url=oidc_issuer_url, namespace=contract.NAMESPACE_AUTOSCALER,
                     service_account=contract.AUTOSCALER_SERVICE_ACCOUNT, policy_arns=[], tags=named(tags, name), parent=parent)
    names = [asg_name(g) for g in node_groups]
    policy = pulumi.Output.all(account, *names).apply(lambda args: autoscaler_policy(cluster_name, [asg_arn(region, args[0], n) for n in args[1:]]))
    return inline_policy(f"{name}-asgs", role, policy)


def mlflow_policy(bucket_arn: str, data_key_arn: str) -> str:
    prefix = MLFLOW_ARTIFACT_PREFIX
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Sid": "ListArtifacts", "Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": bucket_arn,
         "Condition": {"StringLike": {"s3:prefix": [prefix, f"{prefix}*"]}}},
        {"Sid": "ReadWriteArtifacts", "Effect": "Allow", "Resource": f"{bucket_arn}/{prefix}*",
         "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]},
        {"Sid": "UseDataKey", "Effect": "Allow", "Action": ["kms:Decrypt", "kms:GenerateDataKey"], "Resource": data_key_arn},
    ]})


def mlflow_role(name: str, *, artifacts_bucket: aws.s3.Bucket, data_key: aws.kms.Key, oidc_provider_arn: pulumi.Input[str],
                oidc_issuer_url: pulumi.Input[str], tags: dict[str, str], parent: pulumi.Resource) -> Role:
    role = irsa_role(name, oidc_provider_arn=oidc_provider_arn, oidc_issuer_url=oidc_issuer_url, namespace=contract.NAMESPACE_MLFLOW,
                     service_account=contract.MLFLOW_SERVICE_ACCOUNT, policy_arns=[], tags=named(tags, name), parent=parent)
    return inline_policy(f"{name}-artifacts", role, pulumi.Output.all(artifacts_bucket.arn, data_key.arn).apply(lambda a: mlflow_policy(*a)))


class ServiceRoles(pulumi.ComponentResource):
    autoscaler: Role
    mlflow: Role

    def __init__(self, name: str, *, cluster_name: str, region: str, account: pulumi.Input[str], node_groups: list[aws.eks.NodeGroup],
                 artifacts_bucket: aws.s3.Bucket, data_key: aws.kms.Key, oidc_provider_arn: pulumi.Input[str],
                 oidc_issuer_url: pulumi.Input[str], tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainforge:infra:ServiceRoles", name, None, opts)
        self.autoscaler = autoscaler_role(f"{name}-cluster-autoscaler", cluster_name=cluster_name, region=region, account=account,
                                          node_groups=node_groups, oidc_provider_arn=oidc_provider_arn,
                                          oidc_issuer_url=oidc_issuer_url, tags=tags, parent=self)
        self.mlflow = mlflow_role(f"{name}-mlflow", artifacts_bucket=artifacts_bucket, data_key=data_key, oidc_provider_arn=oidc_provider_arn,
                                  oidc_issuer_url=oidc_issuer_url, tags=tags, parent=self)
        self.register_outputs({"autoscaler_role_arn": self.autoscaler.arn, "mlflow_role_arn": self.mlflow.arn})
