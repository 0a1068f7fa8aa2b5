"""Kubernetes rules: what runs privileged, what is pinned, how team namespaces are marked. (The objects tenancy
creates are checked as they land: these rules are written against the resource types.)"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from trainforge import contract
from trainforge.policies.registry import Context, resource_rule

EXACT_VERSION = re.compile(r"^v?\d+\.\d+\.\d+$")
HELM = ("kubernetes:helm.sh/v3:Release", "kubernetes:helm.sh/v4:Chart")
# Kinds that carry pod templates (anything whose spec holds `containers` is inspected, at any depth).
WORKLOADS = ("kubernetes:core/v1:Pod", "kubernetes:apps/v1:Deployment", "kubernetes:apps/v1:DaemonSet", "kubernetes:apps/v1:StatefulSet",
             "kubernetes:batch/v1:Job", "kubernetes:batch/v1:CronJob", "kubernetes:trainer.kubeflow.org/v1alpha1:ClusterTrainingRuntime",
             "kubernetes:trainer.kubeflow.org/v1alpha1:TrainingRuntime", "kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob",
             "kubernetes:kubeflow.org/v1:PyTorchJob", "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet")
TEAM_LABEL = contract.LABEL_TEAM
COST_LABELS = (f"{contract.LABEL_DOMAIN}/{contract.TAG_COST_CENTRE}", f"{contract.LABEL_DOMAIN}/{contract.TAG_ENVIRONMENT}")


@resource_rule("kubernetes", HELM, "Every Helm release is pinned to an exact chart version.")
def helm_releases_pinned(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    version = str(props.get("version") or "")
    if not EXACT_VERSION.match(version):
        yield (f"chart {props.get('chart')!r} is pinned to {version or 'nothing'}: the next `pulumi up` could install another release. "
               "Fix: an exact version, e.g. '1.2.3'")


def pod_specs(node: Any) -> Iterable[Mapping[str, Any]]:
    if isinstance(node, Mapping):
        if isinstance(node.get("containers"), list):
            yield node
        for value in node.values():
            yield from pod_specs(value)
    elif isinstance(node, list):
        for value in node:
            yield from pod_specs(value)


@resource_rule("kubernetes", WORKLOADS, "No privileged containers or host paths outside the system namespaces.", config=("systemNamespaces",))
def no_privileged_pods_outside_system_namespaces(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    namespace = (props.get("metadata") or {}).get("namespace")
    if namespace in ctx.config["systemNamespaces"]:
        return
    for spec in pod_specs(props.get("spec")):
        for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
            if (container.get("securityContext") or {}).get("privileged") is True:
                yield (f"container {container.get('name')!r} runs privileged in {namespace or 'team namespaces'}: it owns the node. "
                       "Fix: drop privileged (EFA and GPUs come through device plugins), or run it in a system namespace")
        for volume in spec.get("volumes", []):
            if volume.get("hostPath"):
                yield (f"volume {volume.get('name')!r} mounts the host path {volume['hostPath'].get('path')!r}. "
                       "Fix: an emptyDir, the FSx claim, or a system namespace")


@resource_rule("kubernetes", ["kubernetes:core/v1:Namespace"], "Team namespaces carry the cost labels.")
def team_namespaces_carry_cost_labels(props: Mapping[str, Any], ctx: Context) -> Iterable[str]:
    labels = (props.get("metadata") or {}).get("labels") or {}
    if TEAM_LABEL not in labels:
        return
    missing = [k for k in COST_LABELS if not labels.get(k)]
    if missing:
        yield f"team namespace without {missing}: its pods' cost could not be attributed. Fix: label it from the team's config"
