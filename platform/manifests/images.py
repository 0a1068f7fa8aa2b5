"""Each chart's images, pulled through the stack's ECR pull-through cache where it caches their upstream
(trainforge.registries): the values that point a chart's images at `<registry>/<upstream>/...`, merged over the
chart's own values by the release (platform/components/objects.helm_release).

A chart names an image's registry in its own keys; what each overlay sets was read from the pinned chart's templates,
and tests/test_image_cache.py renders every release to check that each image lands where this module says.
Kueue's and JobSet's images are also pinned here to the released ones: their charts' sources default to staging
images (`k8s-staging-images/...:main`), which the published charts rewrite at release.
"""

from __future__ import annotations

from typing import Any, Callable

from trainforge import contract, versions
from trainforge.registries import ImageSources, upstream_of

# Images pulled from their upstream whatever the stack caches, and why (listed by the tests and the README).
PULLED_DIRECTLY = {
    "nvcr.io/": "ECR pull-through cache does not support NVIDIA NGC",
    "ghcr.io/opencost/": "pinned by digest in the chart: a first pull by digest through the cache fails (aws/containers-roadmap#2837)",
}


def _kueue(s: ImageSources) -> dict[str, Any]:
    return {"controllerManager": {"manager": {"image": {"repository": s.image("registry.k8s.io/kueue/kueue"),
                                                        "tag": f"v{versions.KUEUE}", "pullPolicy": "IfNotPresent"}}}}


def _kubeflow_trainer(s: ImageSources) -> dict[str, Any]:
    return {"image": {"registry": s.registry_for("ghcr.io")},
            "jobset": {"image": {"repository": s.image("registry.k8s.io/jobset/jobset"),
                                 "tag": f"v{versions.JOBSET}", "pullPolicy": "IfNotPresent"}}}


def _cluster_autoscaler(s: ImageSources) -> dict[str, Any]:
    return {"image": {"repository": s.image("registry.k8s.io/autoscaling/cluster-autoscaler")}}


def _kube_prometheus_stack(s: ImageSources) -> dict[str, Any]:
    quay = {"registry": s.registry_for("quay.io")}
    return {
        "prometheusOperator": {"image": quay, "prometheusConfigReloader": {"image": quay},
                               "admissionWebhooks": {"patch": {"image": {"registry": s.registry_for("ghcr.io")}}}},
        "prometheus": {"prometheusSpec": {"image": quay}},
        "alertmanager": {"alertmanagerSpec": {"image": quay}},
        "grafana": {"image": {"registry": s.registry_for("docker.io")}, "sidecar": {"image": quay}},
        "kube-state-metrics": {"image": {"registry": s.registry_for("registry.k8s.io")}},
        "prometheus-node-exporter": {"image": quay},
        "crds": {"upgradeJob": {"image": {"kubectl": {"registry": s.registry_for("registry.k8s.io")},
                                          "busybox": {"registry": s.registry_for(upstream_of(versions.DIRECTORY_JOB_IMAGE))}}}},
    }


def _mlflow(s: ImageSources) -> dict[str, Any]:
    # The chart's init containers default to Docker Hub's busybox: ECR Public's copy, through the cache.
    repository, tag = versions.DIRECTORY_JOB_IMAGE.rsplit(":", 1)
    busybox = {"repository": s.image(repository), "tag": tag}
    return {"initImages": {"dbchecker": busybox, "iniFileInitializer": busybox}}


OVERLAYS: dict[str, Callable[[ImageSources], dict[str, Any]]] = {
    "kueue": _kueue, "kubeflow-trainer": _kubeflow_trainer, "cluster-autoscaler": _cluster_autoscaler,
    contract.PROMETHEUS_RELEASE: _kube_prometheus_stack, "mlflow": _mlflow,
}


def with_images(release: str, values: dict[str, Any], sources: ImageSources) -> dict[str, Any]:
    """The release's values with its images' locations set over theirs."""
    overlay = OVERLAYS.get(release)
    return _merged(values, overlay(sources)) if overlay else values


def _merged(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merged(base.get(k), v) for k, v in over.items()}}
    return over
