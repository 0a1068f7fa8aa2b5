"""The stack's registry for the runtime image every training pod runs, and the image itself, built and pushed by
the program (pulumi-docker-build), so the first `pulumi up` finds it there for the budget controller and for jobs.

The program's image is tagged by its content: v<version>-<digest of the build context>. The repository's tags are
immutable (a job that names a tag runs exactly that image on every restart and resume), so a tag that stayed while the
content changed would be refused on the next `up` (ImageTagAlreadyExistsException); a content tag changes exactly when
the files the image is built from change, and an `up` that changes none of them builds nothing. The build context is
those files alone (IMAGE_CONTEXT; .dockerignore admits nothing else). scripts/build-image tags by the same rule, and
pushes the release tag v<version> once per version with --release.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from pathlib import Path

import pulumi
import pulumi_aws as aws
import pulumi_docker_build as docker_build

from trainforge import contract
from trainforge.infra.tags import named

# What the Dockerfile copies (the package's sources and metadata) and the Dockerfile itself: the whole build context.
IMAGE_CONTEXT = ("Dockerfile", "pyproject.toml", "README.md", "src", "infra", "platform", "policies", "trainer")
# Inside those, what never reaches the image: byte code and build metadata a local install leaves behind.
CONTEXT_EXCLUDED = ("__pycache__", "*.pyc", "*.egg-info")


def project_root() -> Path:
    """Where the image is built from: the Pulumi project's directory. `pulumi up` runs the program there; an offline
    evaluation (`trainforge plan`, a benchmark) may run anywhere, and then the checkout this package was loaded from
    is the project. Relative where it is the working directory, as `pulumi up` has it: the image's inputs then name the
    same context from any checkout's path, and a move of the checkout changes nothing."""
    here = Path.cwd()
    if (here / "Pulumi.yaml").is_file():
        return Path(".")
    import trainforge
    checkout = Path(trainforge.__file__).resolve().parents[2]  # src/trainforge/__init__.py -> the checkout
    if (checkout / "Pulumi.yaml").is_file():
        return checkout
    raise FileNotFoundError(f"no Pulumi project here ({here}) nor at the checkout trainforge was loaded from ({checkout}): the "
                            "runtime image's build context is the project's root. Fix: run from the directory holding Pulumi.yaml")


def context_files(root: str | Path) -> list[Path]:
    """Every file of the build context under `root`, relative, sorted: IMAGE_CONTEXT less CONTEXT_EXCLUDED."""
    root = Path(root)

    def excluded(path: Path) -> bool:
        return any(fnmatch.fnmatch(part, pattern) for part in path.parts for pattern in CONTEXT_EXCLUDED)

    files: list[Path] = []
    for entry in IMAGE_CONTEXT:
        top = root / entry
        if top.is_file():
            files.append(Path(entry))
        elif top.is_dir():
            files += [p.relative_to(root) for p in top.rglob("*") if p.is_file() and not excluded(p.relative_to(root))]
        else:
            raise FileNotFoundError(f"{top}: the image's build context lacks {entry!r} (infra/registry.py IMAGE_CONTEXT). "
                                    "Fix: run from the project's root, or keep IMAGE_CONTEXT and the Dockerfile's COPY lines in step")
    return sorted(files)


def context_digest(root: str | Path) -> str:
    """sha256 over every context file's path and bytes: what the image's content tag abbreviates."""
    digest = hashlib.sha256()
    for path in context_files(root):
        digest.update(path.as_posix().encode() + b"\0" + (Path(root) / path).read_bytes() + b"\0")
    return digest.hexdigest()


KEEP_CONTENT_IMAGES = 50  # images the program built (v<version>-<digest>): a job of any recent `up` can still be resumed
UNTAGGED_DAYS = 7


def lifecycle_rules() -> dict:
    """Release images (v<version>) are never expired; of the program's content-tagged builds the newest 50 stay."""
    return {"rules": [
        {"rulePriority": 1, "description": "drop untagged layers of interrupted pushes",
         "selection": {"tagStatus": "untagged", "countType": "sinceImagePushed", "countUnit": "days", "countNumber": UNTAGGED_DAYS},
         "action": {"type": "expire"}},
        {"rulePriority": 2, "description": f"keep the newest {KEEP_CONTENT_IMAGES} content-tagged builds",
         "selection": {"tagStatus": "tagged", "tagPatternList": ["v*-*"], "countType": "imageCountMoreThan", "countNumber": KEEP_CONTENT_IMAGES},
         "action": {"type": "expire"}},
    ]}


class RuntimeImageRepository(pulumi.ComponentResource):
    repository: aws.ecr.Repository
    image: pulumi.Output[str]  # what runs: the pushed image by digest, or the stack's own image reference

    def __init__(self, name: str, environment: str, *, version: str, context: str, existing_image: str | None,
                 data_key: aws.kms.Key, tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        """`version` and the context's digest tag the image; `context` is the project's root (IMAGE_CONTEXT under it);
        `existing_image` (the stack's `kubernetes.runtime_image`) replaces the build with an image pushed elsewhere."""
        super().__init__("trainforge:infra:RuntimeImageRepository", name, None, opts)
        repository_name = contract.runtime_image_repository(environment)
        self.repository = aws.ecr.Repository(
            name, name=repository_name,
            # Immutable tags: a job that names v0.3.1-0123456789ab runs exactly that image on every restart and resume.
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
        """linux/amd64 from the project's Dockerfile, tagged by content (contract.content_image_tag); `ref` is the
        pushed digest. Not built on preview: a preview needs neither Docker nor the registry."""
        digest = context_digest(context)
        tag = self.repository.repository_url.apply(lambda url: f"{url}:{contract.content_image_tag(version, digest)}")
        token = aws.ecr.get_authorization_token_output(registry_id=self.repository.registry_id, opts=pulumi.InvokeOutputOptions(parent=self))
        return docker_build.Image(
            f"{name}-build", tags=[tag], push=True, platforms=[docker_build.Platform.LINUX_AMD64], build_on_preview=False,
            context=docker_build.BuildContextArgs(location=context),
            dockerfile=docker_build.DockerfileArgs(location=f"{context}/Dockerfile"),
            build_args={"SOURCE_DIGEST": digest},
            labels={contract.IMAGE_CONTEXT_LABEL: digest, "org.opencontainers.image.version": version},
            registries=[docker_build.RegistryArgs(address=self.repository.repository_url.apply(lambda url: url.split("/")[0]),
                                                  username=token.user_name, password=token.password)],
            opts=pulumi.ResourceOptions(parent=self))
