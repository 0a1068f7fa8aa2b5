"""The Kubernetes backend: create, read, follow and cancel rendered jobs with the official client.

Imported only by commands that talk to a cluster (the client is slow to import). Credentials come from the
kubeconfig (`pulumi stack output kubeconfig`), so every call runs as the researcher, in their team namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainforge import contract

API = {"TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"), "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs")}
# The label each controller puts on the pods of a job.
POD_SELECTOR = {"TrainJob": "jobset.sigs.k8s.io/jobset-name", "PyTorchJob": "training.kubeflow.org/job-name"}


class ClusterError(RuntimeError):
    pass


@dataclass
class Cluster:
    context: str | None = None

    def __post_init__(self) -> None:
        from kubernetes import client, config
        try:
            config.load_kube_config(context=self.context)
        except Exception as exc:  # noqa: BLE001 - the client raises several types for a bad kubeconfig
            raise ClusterError(f"no usable kubeconfig{' context ' + self.context if self.context else ''}: {exc}. "
                               "Fix: `pulumi stack output kubeconfig --show-secrets > ~/.kube/config`, or use --backend local") from None
        self.custom = client.CustomObjectsApi()
        self.core = client.CoreV1Api()

    def _call(self, what: str, fn, *args, **kwargs):
        from kubernetes.client.exceptions import ApiException
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise ClusterError(f"{what}: {exc.status} {exc.reason}: {(exc.body or '')[:300]}") from None

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        group, version, plural = API[manifest["kind"]]
        namespace = manifest["metadata"]["namespace"]
        return self._call(f"creating {manifest['kind']} {namespace}/{manifest['metadata']['name']}",
                          self.custom.create_namespaced_custom_object, group, version, namespace, plural, manifest)

    def get(self, kind: str, team: str, name: str) -> dict[str, Any]:
        group, version, plural = API[kind]
        return self._call(f"reading {kind} {name}", self.custom.get_namespaced_custom_object, group, version,
                          contract.namespace_name(team), plural, name)

    def cancel(self, kind: str, team: str, name: str) -> None:
        """Delete the job: its pods get SIGTERM and their grace period, so the runtime writes its emergency checkpoint."""
        group, version, plural = API[kind]
        self._call(f"deleting {kind} {name}", self.custom.delete_namespaced_custom_object, group, version,
                   contract.namespace_name(team), plural, name, propagation_policy="Foreground")

    def logs(self, kind: str, team: str, name: str, tail: int = 200) -> dict[str, str]:
        namespace = contract.namespace_name(team)
        pods = self._call("listing pods", self.core.list_namespaced_pod, namespace, label_selector=f"{POD_SELECTOR[kind]}={name}")
        return {pod.metadata.name: self._call(f"reading logs of {pod.metadata.name}", self.core.read_namespaced_pod_log,
                                              pod.metadata.name, namespace, tail_lines=tail) for pod in pods.items}

    def gpu_quota(self, team: str) -> dict[str, int]:
        """The team's nominal GPU quota per Kueue ResourceFlavor, read from its ClusterQueue."""
        queue = self._call("reading the team's ClusterQueue", self.custom.get_cluster_custom_object, "kueue.x-k8s.io", "v1beta1",
                           "clusterqueues", contract.cluster_queue_name(team))
        quota: dict[str, int] = {}
        for group in queue.get("spec", {}).get("resourceGroups", []):
            for flavor in group.get("flavors", []):
                for resource in flavor.get("resources", []):
                    if resource["name"] == contract.RESOURCE_GPU:
                        quota[flavor["name"]] = int(resource["nominalQuota"])
        return quota


def conditions(obj: dict[str, Any]) -> str:
    found = obj.get("status", {}).get("conditions", [])
    return ", ".join(f"{c['type']}={c['status']}" for c in found) or "no conditions yet"
