"""Customer-managed KMS keys: one for Kubernetes secrets, one for data at rest (S3, persistent FSx).
Node root volumes use the account's EBS key: a customer key there needs a key-policy grant to the
Auto Scaling service-linked role, without which managed node groups fail to launch instances."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from trainforge.infra.tags import named


class Keys(pulumi.ComponentResource):
    secrets: aws.kms.Key
    data: aws.kms.Key

    def __init__(self, name: str, tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainforge:infra:Keys", name, None, opts)
        self.secrets = self._key(name, "secrets", "EKS envelope encryption of Kubernetes secrets", tags)
        self.data = self._key(name, "data", "S3 buckets and persistent FSx for Lustre", tags)
        self.register_outputs({"secrets_key_arn": self.secrets.arn, "data_key_arn": self.data.arn})

    def _key(self, name: str, purpose: str, description: str, tags: dict[str, str]) -> aws.kms.Key:
        key = aws.kms.Key(
            f"{name}-{purpose}", description=f"trainforge {name}: {description}", enable_key_rotation=True,
            deletion_window_in_days=30, tags=named(tags, f"{name}-{purpose}"), opts=pulumi.ResourceOptions(parent=self),
        )
        aws.kms.Alias(f"{name}-{purpose}", name=f"alias/trainforge-{name}-{purpose}", target_key_id=key.key_id,
                      opts=pulumi.ResourceOptions(parent=key))
        return key
