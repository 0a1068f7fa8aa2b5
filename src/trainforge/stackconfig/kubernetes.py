"""The Kubernetes slice of the stack config: chart versions, the optional v1 training operator, Kueue, the
autoscaler, monitoring and MLflow. Every field has a default that works; a stack sets only what it changes.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from trainforge import durations
from trainforge.stackconfig.fields import StrictModel as _Model

EXACT_VERSION = re.compile(r"^v?\d+\.\d+\.\d+$")
# Charts a stack may re-pin (platform/manifests/charts.py has the table); Trainer and Kueue are pinned as a pair in
# trainforge.versions and are not overridable here: a Kueue that does not manage the Trainer leaves every TrainJob
# suspended.
OVERRIDABLE_CHARTS = ("nvidia-device-plugin", "dcgm-exporter", "aws-efa-k8s-device-plugin", "cluster-autoscaler",
                      "kube-prometheus-stack", "mlflow")


def duration_seconds(value: str) -> int:
    return durations.seconds(value)  # the one grammar (trainforge/durations.py); rendered as Go durations


# A GPU node from nothing: EC2 launch (p5: minutes, longer in a placement group), the NVIDIA AMI's boot and driver
# checks, the device plugins, then a multi-GB image pull: 10-15 minutes for p5.
GPU_SCALE_UP_S = 15 * 60


class KueueConfig(_Model):
    wait_for_pods_ready_timeout: str = Field(
        "25m", description="how long an admitted job may wait for all its pods; above a GPU group's scale-from-zero time")
    recovery_timeout: str = Field(
        "25m", description="how long a running job may wait for a lost pod to be ready again (a spot node replaced); "
                           "above a GPU group's scale-up time, or the job is requeued and counted toward deactivation")
    fair_sharing: bool = True

    @field_validator("wait_for_pods_ready_timeout", "recovery_timeout")
    @classmethod
    def _long_enough(cls, value: str) -> str:
        seconds = duration_seconds(value)
        if seconds < GPU_SCALE_UP_S:
            raise ValueError(f"{value} is shorter than a GPU node group's scale-from-zero (EC2 launch, GPU AMI boot, image "
                             "pull: 10-15 min for p5): Kueue would evict jobs that were about to start. Fix: 15m or more")
        return value


class AutoscalerConfig(_Model):
    scale_down_unneeded_time: str = Field("10m", description="an idle GPU node is removed after this long")
    expander: Literal["least-waste", "priority", "random", "most-pods"] = "least-waste"

    @field_validator("scale_down_unneeded_time")
    @classmethod
    def _duration(cls, value: str) -> str:
        duration_seconds(value)
        return value


class MonitoringConfig(_Model):
    retention_days: int = Field(15, ge=1, le=365, description="Prometheus keeps this many days of metrics")
    storage_gib: int = Field(100, ge=10, le=16384, description="Prometheus volume (gp3)")
    stalled_after_minutes: int = Field(15, ge=2, le=24 * 60, description="no step progress for this long fires TrainingJobStalled")
    gpu_idle_below: float = Field(0.3, gt=0, lt=1, description="GPU utilisation under this for 30 minutes fires GPUUnderutilised")
    s3_lag_minutes: int = Field(30, ge=1, description="a checkpoint waiting longer than this for S3 fires CheckpointUploadLagging")
    quota_nearly_used: float = Field(0.9, gt=0, le=1, description="a team using this share of a flavour's quota fires")
    budget_warning: float = Field(0.8, gt=0, lt=1, description="a team that has spent this share of its monthly budget fires TeamBudgetNearlySpent")
    budget_every_minutes: int = Field(5, ge=1, le=60, description="the budget controller's pass interval")


class MlflowConfig(_Model):
    instance_class: str = Field("db.t4g.medium", pattern=r"^db\.[a-z0-9]+\.[a-z0-9]+$", description="the RDS PostgreSQL instance")
    storage_gib: int = Field(50, ge=20, le=65536)
    backup_retention_days: int = Field(7, ge=1, le=35)
    multi_az: bool = False
    replicas: int = Field(1, ge=1, le=10, description="tracking server pods")
    server_features: list[Literal["gateway", "jobs", "scorers"]] = Field(
        [], description="MLflow features the platform keeps off, turned on: the AI gateway (the server calls any URL a "
                        "user's model definition names), server-side jobs, scorer invocation (neither checks the "
                        "experiment's team)")


# ECR pull-through cache rules for Docker Hub and GitHub's registry need a Secrets Manager secret (username,
# accessToken) named with this prefix (Amazon ECR user guide, "Creating a pull through cache rule").
CACHE_SECRET = re.compile(r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:ecr-pullthroughcache/[\w/+=.@-]+$")


class ImageCacheConfig(_Model):
    enabled: bool = Field(True, description="pull the charts' images through ECR pull-through cache rules of the stack's "
                                            "account (public.ecr.aws, registry.k8s.io, quay.io; docker.io and ghcr.io "
                                            "where a credential is given), not from the public registries through the NAT")
    credentials: dict[Literal["docker.io", "ghcr.io"], str] = Field(
        {}, description="per upstream that needs one, the ARN of a Secrets Manager secret named ecr-pullthroughcache/... "
                        "holding username and accessToken; without one, that upstream's images are pulled directly")

    @field_validator("credentials")
    @classmethod
    def _secret_arns(cls, credentials: dict[str, str]) -> dict[str, str]:
        bad = {upstream: arn for upstream, arn in credentials.items() if not CACHE_SECRET.match(arn)}
        if bad:
            raise ValueError(f"{bad}: ECR takes a pull-through cache credential only from a Secrets Manager secret whose name "
                             "starts with 'ecr-pullthroughcache/'. Fix: e.g. 'arn:aws:secretsmanager:us-east-1:123456789012:"
                             "secret:ecr-pullthroughcache/docker-hub-AbCdEf'")
        return credentials


class KubernetesConfig(_Model):
    charts: dict[str, str] = Field({}, description=f"exact chart versions replacing the pinned ones: {list(OVERRIDABLE_CHARTS)}")
    training_operator: bool = Field(False, description="also install the v1 training operator (PyTorchJob)")
    runtime_image: str | None = Field(
        None, pattern=r"^[a-z0-9.-]+(:[0-9]+)?/[a-z0-9._/-]+(:[\w.-]+|@sha256:[0-9a-f]{64})$",
        description="an image pushed elsewhere (by CI) for the platform's controllers; unset: `pulumi up` builds the "
                    "Dockerfile and pushes it to the stack's repository (needs docker with buildx where pulumi runs)")
    image_registries: list[str] = Field(
        [], max_length=20, description="where team jobs may pull images from besides the stack's own (its ECR registry "
                                       "and the deployed runtime image's repository): registry prefixes ending in '/', "
                                       "e.g. 'nvcr.io/nvidia/'")
    kueue: KueueConfig = KueueConfig()
    autoscaler: AutoscalerConfig = AutoscalerConfig()
    monitoring: MonitoringConfig = MonitoringConfig()
    mlflow: MlflowConfig = MlflowConfig()
    image_cache: ImageCacheConfig = ImageCacheConfig()

    @field_validator("image_registries")
    @classmethod
    def _registry_prefixes(cls, prefixes: list[str]) -> list[str]:
        bad = [p for p in prefixes if not re.fullmatch(r"[a-z0-9.-]+\.[a-z]{2,}(:[0-9]+)?/([a-z0-9_-][a-z0-9._-]*/)*", p)]
        if bad:
            raise ValueError(f"{bad}: each is a registry host (a dot in it), optionally a path, ending in '/' (so "
                             "'nvcr.io' cannot admit 'nvcr.io.evil.com'). Fix: e.g. 'nvcr.io/nvidia/' or "
                             "'123456789012.dkr.ecr.us-east-1.amazonaws.com/'")
        return prefixes

    @field_validator("charts")
    @classmethod
    def _pinned(cls, charts: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(charts) - set(OVERRIDABLE_CHARTS))
        if unknown:
            pair = " (Trainer and Kueue move together in trainforge.versions)" if {"kueue", "kubeflow-trainer"} & set(unknown) else ""
            raise ValueError(f"{unknown} cannot be re-pinned here{pair}. Fix: one of {list(OVERRIDABLE_CHARTS)}")
        loose = {name: v for name, v in charts.items() if not EXACT_VERSION.match(v)}
        if loose:
            raise ValueError(f"{loose}: a chart is pinned to an exact version, not a range. Fix: e.g. '0.20.0'")
        return charts
