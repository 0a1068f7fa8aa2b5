"""The stack's registry for the runtime image every training pod runs (scripts/build-image pushes to it)."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from trainforge import contract
from trainforge.infra.tags import named

KEEP_RELEASE_IMAGES = 50  # images tagged with a version (v*): a job of any recent release can still be resumed
UNTAGGED_DAYS = 7


def lifecycle_rules() -> dict:
    return {"rules": [
        {"rulePriority": 1, "description": "drop untagged layers of interrupted pushes",
         "selection": {"tagStatus": "untagged", "countType": "sinceImagePushed", "countUnit": "days", "countNumber": UNTAGGED_DAYS},
         "action": {"type": "expire"}},
        {"rulePriority": 2, "description": f"keep the newest {KEEP_RELEASE_IMAGES} release images",
         "selection": {"tagStatus": "tagged", "tagPrefixList": ["v"], "countType": "imageCountMoreThan", "countNumber": KEEP_RELEASE_IMAGES},
         "action": {"type": "expire"}},
    ]}


class RuntimeImageRepository(pulumi.ComponentResource):
    repository: aws.ecr.Repository

    def __init__(self, name: str, environment: str, *, data_key: aws.kms.Key, tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainforge:infra:RuntimeImageRepository", name, None, opts)
        repository_name = contract.runtime_image_repository(environment)
        self.repository = aws.ecr.Repository(
            name, name=repository_name,
            # Immutable tags: a job that names v0.3.1-abc1234 runs exactly that image on every restart and resume.
            image_tag_mutability="IMMUTABLE",
            image_scanning_configuration=aws.ecr.RepositoryImageScanningConfigurationArgs(scan_on_push=True),
            encryption_configurations=[aws.ecr.RepositoryEncryptionConfigurationArgs(encryption_type="KMS", kms_key=data_key.arn)],
            tags=named(tags, repository_name), opts=pulumi.ResourceOptions(parent=self),
        )
        aws.ecr.LifecyclePolicy(name, repository=self.repository.name, policy=json.dumps(lifecycle_rules()),
                                opts=pulumi.ResourceOptions(parent=self.repository))
        self.register_outputs({"repository_url": self.repository.repository_url})
