"""The Kubernetes API as trainforge's clients use it: the official client configured from a kubeconfig (a researcher)
or the pod's ServiceAccount (the budget controller, a sweep's controller), one clear error per way the API server
refuses, and the calls on jobs, queues, settings, events and the team's Secrets. Shared by the Kubernetes backend and
the cluster's controllers. The client library is imported only when a Cluster is made (it is slow to import).
"""

from __future__ import annotations

import builtins

import datetime
import json
import os
from dataclasses import dataclass
from typing import Any

from trainforge import contract
from trainforge.errors import EXIT_BAD_INPUT, EXIT_FAILED, TrainforgeError


def rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


KIND_NAMES: dict[str, str] = {"trainjob": "TrainJob", "pytorchjob": "PyTorchJob"}
API = {"TrainJob": (*contract.api_parts(contract.TRAINER_API), "trainjobs"), "PyTorchJob": (*contract.api_parts(contract.PYTORCHJOB_API), "pytorchjobs")}
# The label each controller puts on the pods of a job.
POD_SELECTOR = {"TrainJob": "jobset.sigs.k8s.io/jobset-name", "PyTorchJob": "training.kubeflow.org/job-name"}


class ClusterError(TrainforgeError):
    """The cluster could not be reached or refused a call: nothing about the job itself is wrong."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, exit_code: int = EXIT_FAILED, status: int | None = None):
        super().__init__("", [message], exit_code)
        self.status = status


def _reason(body: str | None) -> dict[str, Any]:
    """The API server's Status object, when the body is one (a 404 for an unknown resource type is plain text)."""
    try:
        status = json.loads(body or "")
    except ValueError:
        return {}
    return status if isinstance(status, dict) and status.get("kind") == "Status" else {}


def explain(what: str, status: int, body: str | None, namespace: str | None, host: str) -> ClusterError:
    """One clear message and exit code per way the API server refuses (the user can fix 401, 403 and 404)."""
    message = _reason(body).get("message", "")
    if status == 401:
        return ClusterError(f"{what}: the cluster at {host} did not accept your credentials (401 Unauthorized; an EKS token lasts "
                            "15 minutes, a kubeconfig's exec plugin renews it). Fix: `aws eks update-kubeconfig --name <cluster>` "
                            "with the AWS identity the platform team onboarded", EXIT_BAD_INPUT, status)
    if status == 403:
        return ClusterError(f"{what}: forbidden (403){': ' + message if message else ''}. Your identity may not do this"
                            f"{' in namespace ' + namespace if namespace else ''}. Fix: use the team you are a member of (--team), or "
                            "ask the platform team to add your role ARN to that team's members", EXIT_BAD_INPUT, status)
    if status == 404:
        details = _reason(body).get("details") or {}
        if details.get("kind") == "namespaces":
            return ClusterError(f"{what}: namespace {details.get('name')} does not exist on this cluster. Fix: check the team "
                                "name; a new team needs its entry under `teams:` and a `pulumi up`", EXIT_BAD_INPUT, status)
        if not details:
            return ClusterError(f"{what}: this cluster does not serve that API (404). Fix: is this a trainforge cluster? "
                                "(`kubectl api-resources | grep -e trainjobs -e clusterqueues`)", EXIT_BAD_INPUT, status)
        return ClusterError(f"{what}: not found (404){': ' + message if message else ''}", EXIT_BAD_INPUT, status)
    return ClusterError(f"{what}: {status} {message or (body or '')[:300]}", EXIT_FAILED, status)


@dataclass
class Cluster:
    """The official client, configured from the kubeconfig (a researcher) or the pod's service account (in the cluster)."""

    context: str | None = None
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        from kubernetes import client, config
        configuration = client.Configuration()  # this Cluster's own; the client's process-wide default stays untouched
        try:
            # $KUBECONFIG read now, not when the client was imported (the client freezes its default path at import).
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), context=self.context, client_configuration=configuration)
        except Exception as exc:  # noqa: BLE001 - the client raises several types for a bad kubeconfig
            if self.context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config(client_configuration=configuration)
            else:
                raise ClusterError(f"no usable kubeconfig{' context ' + self.context if self.context else ''}: {exc}. "
                                   "Fix: `pulumi stack output kubeconfig --show-secrets > ~/.kube/config`, or use --backend local",
                                   exit_code=EXIT_BAD_INPUT) from None
        configuration.retries = 1  # a cluster that is down is said at once, not after urllib3's default retries
        api = client.ApiClient(configuration)
        self.host = api.configuration.host
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def _call(self, what: str, fn, *args, namespace: str | None = None, missing_ok: bool = False, **kwargs):
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError
        try:
            return fn(*args, _request_timeout=self.timeout_s, **kwargs)
        except ApiException as exc:
            if missing_ok and exc.status == 404 and _reason(exc.body):
                return None
            raise explain(what, exc.status, exc.body, namespace, self.host) from None
        except HTTPError as exc:
            raise ClusterError(f"{what}: the Kubernetes API at {self.host} cannot be reached ({type(exc).__name__}). Fix: check the "
                               "network path to the cluster endpoint (`kubectl cluster-info`); nothing was changed") from None

    # Jobs.
    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        group, version, plural = API[manifest["kind"]]
        namespace = manifest["metadata"]["namespace"]
        return self._call(f"creating {manifest['kind']} {namespace}/{manifest['metadata']['name']}",
                          self.custom.create_namespaced_custom_object, group, version, namespace, plural, manifest, namespace=namespace)

    def get(self, kind: str, team: str, name: str) -> dict[str, Any] | None:
        group, version, plural = API[kind]
        namespace = contract.namespace_name(team)
        return self._call(f"reading {kind} {namespace}/{name}", self.custom.get_namespaced_custom_object, group, version,
                          namespace, plural, name, namespace=namespace, missing_ok=True)

    def cancel(self, kind: str, team: str, name: str) -> bool:
        """Delete the job and, first, its pods (foreground): each gets SIGTERM and its grace period, so the runtime writes
        its emergency checkpoint. False if there was no such job."""
        group, version, plural = API[kind]
        namespace = contract.namespace_name(team)
        done = self._call(f"deleting {kind} {namespace}/{name}", self.custom.delete_namespaced_custom_object, group, version,
                          namespace, plural, name, propagation_policy="Foreground", namespace=namespace, missing_ok=True)
        return done is not None

    def patch(self, kind: str, team: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        """A merge patch of a job (its annotations: a sweep's status object); None if there is no such job."""
        group, version, plural = API[kind]
        namespace = contract.namespace_name(team)
        return self._call(f"updating {kind} {namespace}/{name}", self.custom.patch_namespaced_custom_object, group, version,
                          namespace, plural, name, patch, namespace=namespace, missing_ok=True,
                          _content_type="application/merge-patch+json")

    def list(self, kind: str, team: str) -> list[dict[str, Any]]:
        group, version, plural = API[kind]
        namespace = contract.namespace_name(team)
        found = self._call(f"listing {kind}s in {namespace}", self.custom.list_namespaced_custom_object, group, version,
                           namespace, plural, namespace=namespace)
        return list(found.get("items", []))

    def logs(self, kind: str, team: str, name: str, tail: int = 200) -> dict[str, str]:
        namespace = contract.namespace_name(team)
        pods = self._call(f"listing the pods of {name}", self.core.list_namespaced_pod, namespace,
                          label_selector=f"{POD_SELECTOR[kind]}={name}", namespace=namespace)
        return {pod.metadata.name: self._call(f"reading logs of {pod.metadata.name}", self.core.read_namespaced_pod_log,
                                              pod.metadata.name, namespace, tail_lines=tail, namespace=namespace)
                for pod in sorted(pods.items, key=lambda p: p.metadata.name)}

    # The team's queue and settings.
    def cluster_queue(self, team: str) -> dict[str, Any]:
        return self._call(f"reading ClusterQueue {contract.cluster_queue_name(team)}", self.custom.get_cluster_custom_object,
                          *KUEUE, "clusterqueues", contract.cluster_queue_name(team))

    def list_cluster_queues(self, label_selector: str) -> builtins.list[dict[str, Any]]:  # `list` is a method here
        found = self._call("listing ClusterQueues", self.custom.list_cluster_custom_object, *KUEUE, "clusterqueues",
                           label_selector=label_selector)
        return list(found.get("items", []))

    def set_queue_hold(self, team: str, *, hold: bool, note: str = "") -> None:
        """Hold (queued workloads wait, admitted ones run to the end) or release the team's ClusterQueue; the annotation
        marks a hold as the budget controller's, so it never lifts one it did not set."""
        patch = {"metadata": {"annotations": {contract.BUDGET_HOLD_ANNOTATION: note if hold else None}},
                 "spec": {"stopPolicy": "Hold" if hold else "None"}}
        self._call(f"{'holding' if hold else 'releasing'} ClusterQueue {contract.cluster_queue_name(team)}",
                   self.custom.patch_cluster_custom_object, *KUEUE, "clusterqueues", contract.cluster_queue_name(team), patch)

    def drain_queue(self, team: str, note: str) -> dict[str, Any]:
        """HoldAndDrain the team's ClusterQueue: nothing admitted any more, and what is admitted evicted, so Kueue lets go
        of its `resource-in-use` finalizer and the queue can be deleted. The budget controller's mark is taken off: the
        hold is a platform engineer's now, which it never lifts."""
        patch = {"metadata": {"annotations": {contract.BUDGET_HOLD_ANNOTATION: None, contract.DRAIN_ANNOTATION: note}},
                 "spec": {"stopPolicy": "HoldAndDrain"}}
        return self._call(f"draining ClusterQueue {contract.cluster_queue_name(team)}", self.custom.patch_cluster_custom_object,
                          *KUEUE, "clusterqueues", contract.cluster_queue_name(team), patch)

    def team_settings(self, team: str) -> dict[str, str] | None:
        namespace = contract.namespace_name(team)
        found = self._call(f"reading ConfigMap {namespace}/{contract.TEAM_SETTINGS_CONFIG_MAP}", self.core.read_namespaced_config_map,
                           contract.TEAM_SETTINGS_CONFIG_MAP, namespace, namespace=namespace, missing_ok=True)
        return None if found is None else dict(found.data or {})

    def patch_team_settings(self, team: str, data: dict[str, str]) -> None:
        namespace = contract.namespace_name(team)
        # A merge patch touches only these keys; Pulumi's server-side apply owns the others and keeps them.
        self._call(f"updating ConfigMap {namespace}/{contract.TEAM_SETTINGS_CONFIG_MAP}", self.core.patch_namespaced_config_map,
                   contract.TEAM_SETTINGS_CONFIG_MAP, namespace, {"data": data}, namespace=namespace,
                   _content_type="application/merge-patch+json")

    def record_event(self, team: str, *, reason: str, message: str, warning: bool, at: datetime.datetime) -> None:
        """An Event on the team's settings ConfigMap, in its namespace, where `kubectl get events` shows it to the team."""
        namespace = contract.namespace_name(team)
        stamp = rfc3339(at)
        event = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"generateName": f"{contract.BUDGET_CONTROLLER}-", "namespace": namespace},
                 "involvedObject": {"apiVersion": "v1", "kind": "ConfigMap", "name": contract.TEAM_SETTINGS_CONFIG_MAP, "namespace": namespace},
                 "reason": reason, "message": message[:1024], "type": "Warning" if warning else "Normal",
                 "source": {"component": contract.BUDGET_CONTROLLER}, "reportingComponent": contract.BUDGET_CONTROLLER,
                 "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}
        self._call(f"recording an event in {namespace}", self.core.create_namespaced_event, namespace, event, namespace=namespace)

    def sweep_storage(self, team: str) -> str | None:
        """The team's study database URL, from its trainforge-sweeps Secret (the one Secret a member may read)."""
        import base64
        namespace = contract.namespace_name(team)
        found = self._call(f"reading Secret {namespace}/{contract.SWEEP_STORAGE_SECRET}", self.core.read_namespaced_secret,
                           contract.SWEEP_STORAGE_SECRET, namespace, namespace=namespace, missing_ok=True)
        value = None if found is None else (found.data or {}).get(contract.SWEEP_STORAGE_KEY)
        return None if value is None else base64.b64decode(value).decode()


KUEUE = contract.api_parts(contract.KUEUE_API)


