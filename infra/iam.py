"""IAM building blocks: service roles and IRSA roles bound to one Kubernetes service account."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws


def service_role(name: str, service: str, policy_arns: list[str], tags: dict[str, str], parent: pulumi.Resource) -> aws.iam.Role:
    role = aws.iam.Role(
        name, tags=tags, opts=pulumi.ResourceOptions(parent=parent),
        assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"Service": service}, "Action": ["sts:AssumeRole", "sts:TagSession"]}]}),
    )
    _attach(name, role, policy_arns)
    return role


def irsa_role(name: str, *, oidc_provider_arn: pulumi.Input[str], oidc_issuer_url: pulumi.Input[str], namespace: str,
              service_account: str, policy_arns: list[str], tags: dict[str, str], parent: pulumi.Resource) -> aws.iam.Role:
    """A role only `namespace/service_account` can assume, through the cluster's OIDC provider."""

    def trust(args: list[str]) -> str:
        provider_arn, issuer = args
        host = issuer.removeprefix("https://")
        return json.dumps({"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"Federated": provider_arn}, "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {"StringEquals": {f"{host}:sub": f"system:serviceaccount:{namespace}:{service_account}",
                                           f"{host}:aud": "sts.amazonaws.com"}},
        }]})

    role = aws.iam.Role(
        name, tags=tags, opts=pulumi.ResourceOptions(parent=parent),
        assume_role_policy=pulumi.Output.all(oidc_provider_arn, oidc_issuer_url).apply(trust),
    )
    _attach(name, role, policy_arns)
    return role


def _attach(name: str, role: aws.iam.Role, policy_arns: list[str]) -> None:
    for arn in policy_arns:
        aws.iam.RolePolicyAttachment(f"{name}-{arn.rsplit('/', 1)[-1]}", role=role.name, policy_arn=arn,
                                     opts=pulumi.ResourceOptions(parent=role))
