"""The stack's registry for the runtime image every training pod runs, and the image itself, built and pushed by
the program (pulumi-docker-build), so the first `pulumi up` finds it there for the budget controller and for jobs.
scripts/build-image still pushes a release by hand (the same Dockerfile and tags)."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

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
    image: pulumi.Output[str]  # what runs: the pushed image by digest, or the stack's own image reference

    def __init__(self, name: str, environment: str, *, version: str, context: str, existing_image: str | None,
                 data_key: aws.kms.Key, tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        """`version` tags the image (v<version>); `context` is the build context holding the Dockerfile (the project);
        `existing_image` (the stack's `kubernetes.runtime_image`) replaces the build with an image pushed elsewhere."""
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
        if existing_image:
            self.image = pulumi.Output.from_input(existing_image)
        else:
            self.image = self._build(name, version, context).ref
        self.register_outputs({"repository_url": self.repository.repository_url, "image": self.image})

    def _build(self, name: str, version: str, context: str) -> docker_build.Image:
        """linux/amd64 from the project's Dockerfile, tagged v<version>; `ref` is the pushed digest. Immutable tags: a
        changed build under an unchanged version is refused by ECR (bump the version, as for scripts/build-image)."""
        tag = self.repository.repository_url.apply(lambda url: f"{url}:{contract.runtime_image_tag(version)}")
        token = aws.ecr.get_authorization_token_output(registry_id=self.repository.registry_id, opts=pulumi.InvokeOutputOptions(parent=self))
        return docker_build.Image(
            f"{name}-build", tags=[tag], push=True, platforms=[docker_build.Platform.LINUX_AMD64],
            context=docker_build.BuildContextArgs(location=context),
            dockerfile=docker_build.DockerfileArgs(location=f"{context}/Dockerfile"),
            registries=[docker_build.RegistryArgs(address=self.repository.repository_url.apply(lambda url: url.split("/")[0]),
                                                  username=token.user_name, password=token.password)],
            opts=pulumi.ResourceOptions(parent=self))
