"""The dev stack's cluster after `pulumi up`, as the Kubernetes API stand-in serves it, and the API server's admission
decision over the program's policies."""

from __future__ import annotations

import json

from trainforge import contract, k8s_schema, selectors
from trainforge.stackconfig import load_stack_file

from support.admission_policies import AdmissionPolicies
from support.evaluated import evaluation_of, kubernetes_objects, manifest, member_groups, program_manifests
from support.kubeapi import MASTERS, Identity, KubeApi
from support.repo import REPO


STACK = REPO / "stacks" / "Pulumi.dev.yaml"


VISION, LANGUAGE = contract.namespace_name("vision"), contract.namespace_name("language")


def member(team: str, index: int = 0) -> Identity:
    """A member of `team` as the cluster sees them: their IAM role's session, in the groups the program maps it to."""
    evaluation = evaluation_of(STACK)
    principal = next(t for t in load_stack_file(STACK).teams if t.name == team).members[index]
    return Identity(f"{principal}/session", member_groups(evaluation, principal))


def seeded() -> KubeApi:
    """The dev stack's cluster after `pulumi up`: alice (vision), bob (language) and an administrator."""
    return KubeApi.holding(program_manifests(evaluation_of(STACK)),
                           {"vision-token": member("vision"), "language-token": member("language"), "admin-token": MASTERS})


def queue(served, team: str = "vision") -> dict:
    return served.api.find("kueue.x-k8s.io", "v1beta2", "clusterqueues", None, contract.cluster_queue_name(team))


def settings(served, team: str = "vision") -> dict:
    return served.api.find("", "v1", "configmaps", contract.namespace_name(team), contract.TEAM_SETTINGS_CONFIG_MAP)["data"]


def raw_request(served, token: str, method: str, path: str, body: dict | None = None) -> int:
    import urllib.error
    import urllib.request
    data = json.dumps(body).encode() if body is not None else None
    content = "application/merge-patch+json" if method == "PATCH" else "application/json"
    request = urllib.request.Request(served.url + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": content})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


TRAINJOBS = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")


PYTORCHJOBS = ("kubeflow.org", "v1", "pytorchjobs")


PODS = ("", "v1", "pods")


class Program:
    """The program's Kubernetes objects, and the API server's admission decision over its policies."""

    def __init__(self, evaluation):
        self.objects = [manifest(r) for r in kubernetes_objects(evaluation)]
        self.policies = AdmissionPolicies(self.objects)

    def one(self, kind: str, name: str, namespace: str | None = None) -> dict:
        (found,) = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name
                    and o["metadata"].get("namespace") == namespace]
        return found

    def namespace_labels(self, namespace: str) -> dict[str, str] | None:
        found = [o for o in self.objects if o["kind"] == "Namespace" and o["metadata"]["name"] == namespace]
        return selectors.namespace_labels(namespace, found[0]["metadata"].get("labels")) if found else None

    def param(self, namespace: str, name: str) -> dict | None:
        found = [o for o in self.objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name
                 and o["metadata"].get("namespace") == namespace]
        return found[0] if found else None

    def denials(self, obj: dict, resource: tuple[str, str, str], operation: str = "CREATE") -> list[str]:
        group, version, plural = resource
        found = self.policies.denials(operation, obj, group=group, version=version, plural=plural,
                                      namespace_labels=self.namespace_labels(obj["metadata"]["namespace"]), param=self.param)
        return [d.message for d in found]

    def pods(self, job: dict) -> list[dict]:
        """The pods the Trainer (over the program's ClusterTrainingRuntime) or the training operator would create."""
        runtime = None
        if job["kind"] == "TrainJob":
            runtime = self.one("ClusterTrainingRuntime", job["spec"]["runtimeRef"]["name"])
        return [{"apiVersion": "v1", "kind": "Pod", "metadata": {**template.get("metadata", {}), "name": f"{job['metadata']['name']}-{name}",
                                                                 "namespace": job["metadata"]["namespace"]},
                 "spec": template["spec"]} for name, template in k8s_schema.pod_templates(job, runtime).items()]
