"""Every third-party chart the platform installs, pinned to an exact version in one table.

Trainer and Kueue come from trainforge.versions (the pair must move together: a Kueue that does not manage the
Trainer leaves TrainJobs suspended); a stack may re-pin the others (`kubernetes.charts`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainforge import contract, versions
from trainforge.stackconfig import KubernetesConfig


@dataclass(frozen=True)
class Chart:
    release: str  # the Helm release name, fixed: kube-prometheus-stack selects objects labelled `release: <it>`
    repository: str
    chart: str
    version: str
    namespace: str


CHARTS: dict[str, Chart] = {c.release: c for c in (
    Chart("nvidia-device-plugin", "https://nvidia.github.io/k8s-device-plugin", "nvidia-device-plugin", "0.20.0", contract.NAMESPACE_GPU),
    Chart("dcgm-exporter", "https://nvidia.github.io/dcgm-exporter/helm-charts", "dcgm-exporter", "4.8.2", contract.NAMESPACE_MONITORING),
    Chart("aws-efa-k8s-device-plugin", "https://aws.github.io/eks-charts", "aws-efa-k8s-device-plugin", "v0.5.30", contract.NAMESPACE_GPU),
    Chart("kubeflow-trainer", "oci://ghcr.io/kubeflow/charts", "kubeflow-trainer", versions.KUBEFLOW_TRAINER, contract.NAMESPACE_TRAINER),
    Chart("kueue", "oci://registry.k8s.io/kueue/charts", "kueue", versions.KUEUE, contract.NAMESPACE_KUEUE),
    Chart("cluster-autoscaler", "https://kubernetes.github.io/autoscaler", "cluster-autoscaler", "9.59.0", contract.NAMESPACE_AUTOSCALER),
    Chart(contract.PROMETHEUS_RELEASE, "https://prometheus-community.github.io/helm-charts", "kube-prometheus-stack", "88.5.3",
          contract.NAMESPACE_MONITORING),
    Chart("mlflow", "https://community-charts.github.io/helm-charts", "mlflow", "1.11.5", contract.NAMESPACE_MLFLOW),
    Chart("opencost", "https://opencost.github.io/opencost-helm-chart", "opencost", "2.5.17", contract.NAMESPACE_OPENCOST),
)}

# The v1 training operator ships no Helm chart: its kustomize overlay at the pinned tag (stack option).
TRAINING_OPERATOR_MANIFESTS = (f"https://github.com/kubeflow/training-operator.git/manifests/overlays/standalone"
                               f"?ref=v{versions.TRAINING_OPERATOR}")


def pinned(cfg: KubernetesConfig) -> dict[str, Chart]:
    """The table with the stack's re-pins applied."""
    return {name: replace(chart, version=cfg.charts.get(name, chart.version)) for name, chart in CHARTS.items()}
