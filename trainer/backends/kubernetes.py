"""The Kubernetes backend: create, read, follow and cancel rendered jobs with the official client.

Imported only by commands that talk to a cluster (the client is slow to import). Credentials come from the
kubeconfig (`pulumi stack output kubeconfig`), so every call runs as the researcher, in their team namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from trainforge import contract
from trainforge.errors import EXIT_BAD_INPUT, EXIT_FAILED, TrainforgeError
from trainforge.trainer.admission import Admission, NotAdmitted
from trainforge.trainer.backends import JobReport, Progress
from trainforge.trainer.render import Kind, render
from trainforge.trainer.spec import JobSpec

KIND_NAMES: dict[str, str] = {"trainjob": "TrainJob", "pytorchjob": "PyTorchJob"}
API = {"TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"), "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs")}
# The label each controller puts on the pods of a job.
POD_SELECTOR = {"TrainJob": "jobset.sigs.k8s.io/jobset-name", "PyTorchJob": "training.kubeflow.org/job-name"}


class ClusterError(TrainforgeError):
    """The cluster could not be reached or refused a call: nothing about the job itself is wrong."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, exit_code: int = EXIT_FAILED):
        super().__init__("", [message], exit_code)




@dataclass
class Cluster:
    context: str | None = None

    def __post_init__(self) -> None:
        from kubernetes import client, config
        try:
            config.load_kube_config(context=self.context)
        except Exception as exc:  # noqa: BLE001 - the client raises several types for a bad kubeconfig
            raise ClusterError(f"no usable kubeconfig{' context ' + self.context if self.context else ''}: {exc}. "
                               "Fix: `pulumi stack output kubeconfig --show-secrets > ~/.kube/config`, or use --backend local",
                               exit_code=EXIT_BAD_INPUT) from None
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

    def list(self, kind: str, team: str) -> list[dict[str, Any]]:
        group, version, plural = API[kind]
        found = self._call(f"listing {kind}s", self.custom.list_namespaced_custom_object, group, version,
                           contract.namespace_name(team), plural)
        return list(found.get("items", []))

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


class KubernetesBackend:
    """The Backend protocol on the kubeconfig's cluster: one job kind, in one team's namespace."""

    def __init__(self, team: str | None, kind: Kind = "trainjob", context: str | None = None, cost_centre: str | None = None):
        self.team, self.kind, self.cost_centre = team, kind, cost_centre
        self.cluster = Cluster(context)

    def _namespace_team(self) -> str:
        if self.team is None:
            raise TrainforgeError("", ["the kubernetes backend needs the job's team (its namespace). Fix: --team <team>"])
        return self.team

    def submit(self, spec: JobSpec, admission: Admission, *, detach: bool = True, on_progress: Progress | None = None) -> JobReport:
        """Create the job once the live ClusterQueue agrees with the stack's quota (the cluster wins if they differ)."""
        problems = list(admission.problems) or self._live_quota_problems(spec, admission)
        if problems:
            raise NotAdmitted(spec.name, problems)
        manifest = render(spec, admission.placement, self.kind, self.cost_centre)
        self.cluster.create(manifest)
        cost = admission.cost
        where = admission.flavour.value if admission.flavour else "cpu"
        line = (f"created {manifest['kind']} {manifest['metadata']['namespace']}/{spec.name} on {where}"
                + (f"; estimate ${cost.expected_usd:,.2f} for {spec.limits.max_runtime}" if cost else "")
                + ". Kueue admits it when the team's quota has room.")
        return JobReport(spec.name, spec.team, "created", line, {"manifest": manifest})

    def _live_quota_problems(self, spec: JobSpec, admission: Admission) -> list[str]:
        if admission.flavour is None:
            return []
        import logging
        try:
            live = self.cluster.gpu_quota(spec.team).get(admission.flavour.value)
        except ClusterError as exc:
            logging.getLogger("trainforge").warning("could not read the team's ClusterQueue (%s); using the stack's quota", exc)
            return []
        if live is not None and admission.gpus > live:
            return [f"resources: {admission.gpus} {admission.flavour.value} GPUs needed, the cluster's quota for "
                    f"team {spec.team!r} is {live}. Fix: fewer GPUs, or a larger quota"]
        return []

    def status(self, name: str) -> JobReport:
        team = self._namespace_team()
        obj = self.cluster.get(KIND_NAMES[self.kind], team, name)
        summary = conditions(obj)
        return JobReport(name, team, summary, f"{name}: {summary}", obj.get("status", {}))

    def logs(self, name: str, *, follow: bool = False) -> Iterator[str]:
        for pod, text in self.cluster.logs(KIND_NAMES[self.kind], self._namespace_team(), name).items():
            yield f"==> {pod} <==\n{text}\n"

    def cancel(self, name: str) -> JobReport:
        team = self._namespace_team()
        self.cluster.cancel(KIND_NAMES[self.kind], team, name)
        return JobReport(name, team, "deleted", f"{name}: deleted; its pods checkpoint within their grace period")

    def list(self) -> list[JobReport]:
        team = self._namespace_team()
        kind = KIND_NAMES[self.kind]
        found = self.cluster.list(kind, team)
        return [JobReport(o["metadata"]["name"], team, conditions(o), f"{o['metadata']['name']}: {conditions(o)}", o.get("status", {}))
                for o in found]


def conditions(obj: dict[str, Any]) -> str:
    found = obj.get("status", {}).get("conditions", [])
    return ", ".join(f"{c['type']}={c['status']}" for c in found) or "no conditions yet"
