"""IAM building blocks: service roles and IRSA roles bound to one Kubernetes service account.

Each returns the role with its policy attachments: whatever uses the role depends on them, so it is never created
with a half-permitted role (create races) and is deleted before the permissions go (`pulumi destroy` otherwise
strands ENIs and security groups that a role without its policies can no longer clean up).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from trainforge import contract


def principal_key(principal_arn: str) -> str:
    """A name for an IAM principal that stays its own whatever else a list holds: account, kind and name from the ARN,
    readable, plus a short digest of the whole ARN (a path's `/` and a name's `-` read alike). Resources per principal
    (EKS access entries) are named by it, not by list position: a position shifts when someone earlier in the list
    leaves, and the engine would then replace the others' entries (EKS holds one per principal, so the replacement,
    created before the old one goes, is refused with ResourceInUseException)."""
    _, _, _, _, account, resource = principal_arn.split(":", 5)
    readable = re.sub(r"[^A-Za-z0-9-]+", "-", resource).strip("-").lower()
    return f"{account}-{readable}-{hashlib.sha256(principal_arn.encode()).hexdigest()[:6]}"


def keyed_by_principal(prefix: str, principal_arn: str, position: int) -> tuple[str, pulumi.ResourceOptions]:
    """The resource name for one principal's resource under `prefix`, and an alias to the name releases up to 0.1.0
    gave it (`<prefix>-<position>`): a stack deployed by one of them adopts its entries on its first `up` with a later
    release, if that `up` leaves the list as it was (README, "Day two")."""
    return f"{prefix}-{principal_key(principal_arn)}", pulumi.ResourceOptions(aliases=[pulumi.Alias(name=f"{prefix}-{position}")])


@dataclass(frozen=True)
class Role:
    role: aws.iam.Role
    attachments: list[pulumi.Resource] = field(default_factory=list)  # managed-policy attachments and inline policies

    @property
    def arn(self) -> pulumi.Output[str]:
        return self.role.arn

    @property
    def ready(self) -> list[pulumi.Resource]:
        """What a user of the role depends on: the role and every policy it carries."""
        return [self.role, *self.attachments]


def service_role(name: str, service: str, policy_arns: list[str], tags: dict[str, str], parent: pulumi.Resource) -> Role:
    role = aws.iam.Role(
        name, tags=tags, opts=pulumi.ResourceOptions(parent=parent),
        assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"Service": service}, "Action": ["sts:AssumeRole", "sts:TagSession"]}]}),
    )
    return Role(role, _attach(name, role, policy_arns))


def irsa_role(name: str, *, oidc_provider_arn: pulumi.Input[str], oidc_issuer_url: pulumi.Input[str], namespace: str,
              service_account: str, policy_arns: list[str], tags: dict[str, str], parent: pulumi.Resource) -> Role:
    """A role only `namespace/service_account` can assume, through the cluster's OIDC provider."""

    def trust(args: list[str]) -> str:
        provider_arn, issuer = args
        host = issuer.removeprefix("https://")
        return json.dumps({"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"Federated": provider_arn}, "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {"StringEquals": {f"{host}:sub": contract.service_account_subject(namespace, service_account),
                                           f"{host}:aud": "sts.amazonaws.com"}},
        }]})

    role = aws.iam.Role(
        name, tags=tags, opts=pulumi.ResourceOptions(parent=parent),
        assume_role_policy=pulumi.Output.all(oidc_provider_arn, oidc_issuer_url).apply(trust),
    )
    return Role(role, _attach(name, role, policy_arns))


def inline_policy(name: str, role: Role, policy: pulumi.Input[str]) -> Role:
    """`role` with an inline policy added to what its users wait for."""
    document = aws.iam.RolePolicy(name, role=role.role.id, policy=policy, opts=pulumi.ResourceOptions(parent=role.role))
    return Role(role.role, [*role.attachments, document])


def _attach(name: str, role: aws.iam.Role, policy_arns: list[str]) -> list[pulumi.Resource]:
    return [aws.iam.RolePolicyAttachment(f"{name}-{arn.rsplit('/', 1)[-1]}", role=role.name, policy_arn=arn,
                                         opts=pulumi.ResourceOptions(parent=role))
            for arn in policy_arns]
