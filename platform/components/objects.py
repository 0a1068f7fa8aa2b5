"""How the platform layer registers what it applies: a Helm release from the chart table, and one Pulumi resource
per Kubernetes object trainforge owns (typed for core kinds, the CustomResource registration for custom kinds)."""

from __future__ import annotations

from typing import Any, Sequence

import pulumi
import pulumi_kubernetes as k8s

from trainforge import contract
from trainforge.platform.manifests.charts import Chart
from trainforge.platform.manifests.images import with_images
from trainforge.registries import ImageSources

CORE_KINDS = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "Secret"): k8s.core.v1.Secret,
    ("v1", "PersistentVolume"): k8s.core.v1.PersistentVolume,
    ("v1", "PersistentVolumeClaim"): k8s.core.v1.PersistentVolumeClaim,
    ("v1", "ResourceQuota"): k8s.core.v1.ResourceQuota,
    ("v1", "LimitRange"): k8s.core.v1.LimitRange,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("storage.k8s.io/v1", "StorageClass"): k8s.storage.v1.StorageClass,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.rbac.v1.ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.rbac.v1.ClusterRoleBinding,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("batch/v1", "Job"): k8s.batch.v1.Job,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
}


class CustomObject(pulumi.CustomResource):
    """A custom resource with every top-level field of its manifest (a WorkloadPriorityClass keeps `value` at the top,
    which `apiextensions.CustomResource` cannot carry). Registered exactly as CustomResource registers: by apiVersion
    and kind, so the Kubernetes provider applies it the same way."""

    def __init__(self, resource_name: str, manifest: dict[str, Any], opts: pulumi.ResourceOptions | None = None):
        super().__init__(contract.pulumi_type(manifest["apiVersion"], manifest["kind"]), resource_name, dict(manifest), opts)


def apply(manifest: dict[str, Any], *, parent: pulumi.Resource | None, depends_on: Sequence[pulumi.Resource] | None = None,
          provider: pulumi.ProviderResource | None = None, aliases: Sequence[pulumi.Alias] = ()) -> pulumi.CustomResource:
    """One Pulumi resource for one object; the Kubernetes provider comes from the parent, or is given (a top-level object)."""
    name = resource_name(manifest)
    opts = pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on or []), provider=provider, aliases=list(aliases) or None)
    typed = CORE_KINDS.get((manifest["apiVersion"], manifest["kind"]))
    if typed is None:
        return CustomObject(name, manifest, opts)
    fields = {_snake(k): v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
    return typed(name, **fields, opts=opts)


def apply_crd(manifest: dict[str, Any], *, parent: pulumi.Resource, depends_on: Sequence[pulumi.Resource] | None = None
              ) -> k8s.apiextensions.v1.CustomResourceDefinitionPatch:
    """A CRD the program owns (platform/manifests/crds.py): applied server-side, so it is created where it is missing and
    taken over where a chart installed it; never deleted by the engine (every object of its kind would go with it)."""
    opts = pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on or []), retain_on_delete=True)
    return k8s.apiextensions.v1.CustomResourceDefinitionPatch(resource_name(manifest), metadata=manifest["metadata"],
                                                              spec=manifest["spec"], opts=opts)


def resource_name(manifest: dict[str, Any]) -> str:
    """The Pulumi name of an object: namespace, kind and name (unique in a stack, stable across stacks)."""
    return "-".join(p for p in (manifest["metadata"].get("namespace"), manifest["kind"].lower(), manifest["metadata"]["name"]) if p)


def type_token(manifest: dict[str, Any]) -> str:
    """The Pulumi type of an object, as the Kubernetes provider names it (`v1` is the core group)."""
    api_version = manifest["apiVersion"] if "/" in manifest["apiVersion"] else f"core/{manifest['apiVersion']}"
    return contract.pulumi_type(api_version, manifest["kind"])


def _snake(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


def helm_release(chart: Chart, values: dict[str, Any], *, images: ImageSources, parent: pulumi.Resource,
                 depends_on: Sequence[pulumi.Resource] | None = None, create_namespace: bool = False, skip_crds: bool = False,
                 retain_on_delete: bool = False) -> k8s.helm.v3.Release:
    """The chart at its pinned version, under its fixed release name (selectors and service names depend on it), its
    images pulled through the stack's cache (`images`; platform/manifests/images.py). `skip_crds`: the program applies
    the chart's crds/ itself (Helm never upgrades them); `retain_on_delete`: the engine never uninstalls it (a release
    whose templates hold CRDs would delete every object of their kinds)."""
    values = with_images(chart.release, values, images)
    oci = chart.repository.startswith("oci://")
    return k8s.helm.v3.Release(
        chart.release, name=chart.release, namespace=chart.namespace, create_namespace=create_namespace,
        chart=f"{chart.repository}/{chart.chart}" if oci else chart.chart, version=chart.version,
        repository_opts=None if oci else k8s.helm.v3.RepositoryOptsArgs(repo=chart.repository),
        values=values, atomic=True, cleanup_on_fail=True, timeout=900, skip_crds=skip_crds or None,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on or []), retain_on_delete=retain_on_delete or None),
    )
