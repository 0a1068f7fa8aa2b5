"""The CustomResourceDefinitions the program applies itself instead of leaving them to a chart.

Helm installs a chart's crds/ directory (its subcharts' too) on the first install only: an upgrade to a new chart
version leaves the cluster on the old CRDs, and nothing ever updates them (Helm docs, chart best practices, "Custom
Resource Definitions"). Kubeflow Trainer 2.2 keeps its CRDs there, and so does its JobSet subchart. Their release
therefore skips them (`skipCrds`), and the program applies the same files: the pinned versions packaged in
trainforge/schemas/crds, which every TrainJob and runtime is also validated against. Bumping the pinned Trainer
updates them on the next `up` (tests/test_versions.py ties the files to the versions).

Each is applied with server-side apply and force (a `CustomResourceDefinitionPatch` with `pulumi.com/patchForce`):
on a fresh cluster that creates it; on a cluster where an earlier release of this program let Helm install it, the
program takes its fields over instead of failing on the object that is already there. Each is kept when Pulumi stops
declaring it (`retainOnDelete`): deleting a CRD deletes every object of its kind, every TrainJob included.

Kueue's CRDs are templates of its chart, upgraded with it; what keeps them is that the release itself is never
uninstalled by the engine (platform/components/kubernetes.py, `Scheduling`).
"""

from __future__ import annotations

import copy
from typing import Any

from trainforge.k8s_schema import crd_document

PATCH_FORCE = "pulumi.com/patchForce"  # pulumi-kubernetes: server-side apply with force (takes fields from other managers)

# Kubeflow Trainer's chart's crds/ and its JobSet subchart's, as the pinned charts carry them.
TRAINER_CRD_FILES = ("trainer.kubeflow.org_trainjobs.yaml", "trainer.kubeflow.org_trainingruntimes.yaml",
                     "trainer.kubeflow.org_clustertrainingruntimes.yaml", "jobset.x-k8s.io_jobsets.yaml")


def trainer_crds() -> list[dict[str, Any]]:
    """The Trainer's and JobSet's CRDs, each marked for a forced server-side apply."""
    return [_forced(crd_document(name)) for name in TRAINER_CRD_FILES]


def _forced(crd: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(crd)
    out["metadata"].setdefault("annotations", {})[PATCH_FORCE] = "true"
    return out


def defined_kind(crd: dict[str, Any]) -> str:
    """`group/Kind` of the objects a CRD defines (how the first-up and day-two models name a custom kind)."""
    return f"{crd['spec']['group']}/{crd['spec']['names']['kind']}"
