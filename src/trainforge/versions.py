"""The versions of the cluster software trainforge is built against, in one place.

The platform layer installs these (its chart table reads them), and the CRD schemas every rendered object is
validated against (schemas/crds/, listed with their versions in schemas/crds/VERSIONS.yaml) must be these same
versions: tests/test_versions.py fails when one is bumped without the other.
"""

from __future__ import annotations

KUBEFLOW_TRAINER = "2.2.1"
JOBSET = "0.11.0"  # the JobSet chart Trainer 2.2.1's chart carries as its subchart (its Chart.yaml): the program applies its CRD
KUEUE = "0.19.2"
TRAINING_OPERATOR = "1.9.0"  # the optional v1 operator (PyTorchJob)
PROMETHEUS_OPERATOR = "0.93.0"  # the operator kube-prometheus-stack 88.5.x ships (PodMonitor, PrometheusRule CRDs)

# The directory Job's image: a shell, mkdir, chown and chmod, nothing else. Not the runtime image: that is several GB
# (a first pull outlasts pulumi-kubernetes' Job wait) and changes with every build (the Job would be replaced and re-run
# on each `up`). From ECR Public's mirror of Docker's official images: no Docker Hub pull limit through the NAT.
DIRECTORY_JOB_IMAGE = "public.ecr.aws/docker/library/busybox:1.37.0"
# The FSx quota Jobs run `lfs` from the FSx CSI driver's own image (its Dockerfile installs Amazon Linux's
# lustre-client; no shell in it), at the app version of chart 1.17.0 (1.9.0; ../shared/PLATFORM-FACTS.md), from ECR Public.
FSX_QUOTA_JOB_IMAGE = "public.ecr.aws/fsx-csi-driver/aws-fsx-csi-driver:v1.9.0"

# cluster-autoscaler's image per Kubernetes minor (its minor must be the cluster's): the newest patch of each, from the
# kubernetes/autoscaler release tags (cluster-autoscaler-1.33.6, -1.34.5; 1.35.0 is what chart 9.59.0 ships). A minor
# not listed gets <minor>.0, which exists for every released minor.
CLUSTER_AUTOSCALER_PATCHES = {"1.33": "1.33.6", "1.34": "1.34.5", "1.35": "1.35.0"}


def cluster_autoscaler_image_tag(kubernetes_minor: str) -> str:
    return "v" + CLUSTER_AUTOSCALER_PATCHES.get(kubernetes_minor, f"{kubernetes_minor}.0")


COMPONENTS = {"kubeflow-trainer": KUBEFLOW_TRAINER, "jobset": JOBSET, "kueue": KUEUE, "training-operator": TRAINING_OPERATOR,
              "prometheus-operator": PROMETHEUS_OPERATOR}

# The Trainer release each Kueue minor is built against (Kueue's go.mod; see PLATFORM-FACTS.md). Kueue manages a
# TrainJob only through that Trainer's API: with any other pairing TrainJobs stay suspended. No released Kueue
# manages Trainer 2.3.
KUEUE_MANAGES_TRAINER = {"0.17": "2.2.0", "0.18": "2.2.1", "0.19": "2.2.1"}


def kueue_manages(kueue: str, trainer: str) -> bool:
    return KUEUE_MANAGES_TRAINER.get(".".join(kueue.split(".")[:2])) == trainer
