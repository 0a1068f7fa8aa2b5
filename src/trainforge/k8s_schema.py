"""Validate rendered objects strictly: the CRD OpenAPI schemas, and the Kubernetes core schemas of the pods inside.

The API server prunes fields a structural schema does not list, so a misspelt field in a manifest is
silently dropped. Here every object schema that lists properties (and does not preserve unknown fields)
rejects anything else: a typo fails the test instead of vanishing on the cluster.

A CRD schema stops at the pod: Kubeflow's CRDs embed PodTemplateSpec, but the Trainer's runtime patches and
trainer section are looser than what the controller finally builds. `core_problems` rebuilds the pods each
controller will create and checks them against the official Kubernetes schemas (`kubernetes-validate`, a
dev dependency: 100 MB of schemas the CLI does not need at run time).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from trainforge import contract

# Package data (pyproject's package-data), so the validator works from a wheel as well as from a checkout.
SCHEMA_DIR = resources.files("trainforge") / "schemas" / "crds"


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if "properties" in out and "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@lru_cache(maxsize=None)
def crd_document(file_name: str) -> dict[str, Any]:
    """A pinned CRD as its file holds it (parsed once per process: the Trainer's are about 900 KB each). Callers that
    change it take a copy."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((SCHEMA_DIR / file_name).read_text(), Loader=loader)


@lru_cache(maxsize=None)
def crd_validator(file_name: str, version: str):
    import jsonschema

    crd = crd_document(file_name)
    schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)
    schema = _strict(schema)
    # apiVersion, kind and metadata are checked by the API server itself, not by the CRD schema.
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


KINDS = {
    (contract.TRAINER_API, "TrainJob"): ("trainer.kubeflow.org_trainjobs.yaml", "v1alpha1"),
    (contract.PYTORCHJOB_API, "PyTorchJob"): ("kubeflow.org_pytorchjobs.yaml", "v1"),
    (contract.TRAINER_API, "ClusterTrainingRuntime"): ("trainer.kubeflow.org_clustertrainingruntimes.yaml", "v1alpha1"),
    ("monitoring.coreos.com/v1", "PodMonitor"): ("monitoring.coreos.com_podmonitors.yaml", "v1"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("monitoring.coreos.com_servicemonitors.yaml", "v1"),
    ("monitoring.coreos.com/v1", "PrometheusRule"): ("monitoring.coreos.com_prometheusrules.yaml", "v1"),
    (contract.KUEUE_API, "ClusterQueue"): ("kueue.x-k8s.io_clusterqueues.yaml", "v1beta2"),
    (contract.KUEUE_API, "LocalQueue"): ("kueue.x-k8s.io_localqueues.yaml", "v1beta2"),
    (contract.KUEUE_API, "ResourceFlavor"): ("kueue.x-k8s.io_resourceflavors.yaml", "v1beta2"),
    (contract.KUEUE_API, "Cohort"): ("kueue.x-k8s.io_cohorts.yaml", "v1beta2"),
    (contract.KUEUE_API, "WorkloadPriorityClass"): ("kueue.x-k8s.io_workloadpriorityclasses.yaml", "v1beta2"),
}


def has_schema(obj: dict[str, Any]) -> bool:
    """Whether `obj` is of a custom kind whose pinned CRD schema ships here."""
    return (obj.get("apiVersion"), obj.get("kind")) in KINDS


def problems(obj: dict[str, Any]) -> list[str]:
    """Schema violations of `obj`, as 'path: message' lines (empty when valid)."""
    file_name, version = KINDS[(obj["apiVersion"], obj["kind"])]
    validator = crd_validator(file_name, version)
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in validator.iter_errors(obj)]


def pod_templates(obj: dict[str, Any], runtime: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The pod templates the controller will create from `obj`, by replica name, as core v1 PodTemplateSpecs.

    For a TrainJob, pass the ClusterTrainingRuntime it names to get the pods as the Trainer builds them: the
    runtime's pod template, the TrainJob's runtime patches over it, the trainer section over the container."""
    if obj["kind"] == "PyTorchJob":
        return {name: replica["template"] for name, replica in obj["spec"]["pytorchReplicaSpecs"].items()}
    if obj["kind"] == "TrainJob":
        if runtime is not None and runtime["metadata"]["name"] != obj["spec"]["runtimeRef"]["name"]:
            raise ValueError(f"the TrainJob names runtime {obj['spec']['runtimeRef']['name']!r}, not {runtime['metadata']['name']!r}")
        base = {job["name"]: job["template"]["spec"]["template"] for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]} \
            if runtime is not None else {}
        pods: dict[str, dict[str, Any]] = dict(base)
        for patch in obj["spec"].get("runtimePatches", []):
            for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
                pods[job["name"]] = merge_patch(pods.get(job["name"], {}), job["template"]["spec"]["template"])
        return {name: _with_trainer(obj["spec"]["trainer"], pod) for name, pod in pods.items()}
    raise KeyError(f"no pod templates known for {obj['apiVersion']}/{obj['kind']}")


MERGE_BY_NAME = ("containers", "initContainers", "volumes", "volumeMounts", "env", "ports")


def merge_patch(base: Any, patch: Any) -> Any:
    """A model of the strategic merge the Trainer applies: maps merge key by key, lists of named items (containers,
    volumes, env...) merge by name, any other value in the patch replaces the base's."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if key in MERGE_BY_NAME and isinstance(value, list) and isinstance(base.get(key), list):
                named = {item["name"]: item for item in base[key]}
                for item in value:
                    named[item["name"]] = merge_patch(named.get(item["name"], {}), item)
                out[key] = list(named.values())
            else:
                out[key] = merge_patch(base.get(key), value)
        return out
    return patch


def _with_trainer(trainer: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    """The Trainer sets the trainer section (image, command, env, resourcesPerNode) on the patched container."""
    pod = {"metadata": pod.get("metadata", {}), "spec": dict(pod["spec"])}
    containers = []
    for container in pod["spec"]["containers"]:
        merged = dict(container)
        for key, field in (("image", "image"), ("command", "command"), ("args", "args"), ("env", "env"), ("resources", "resourcesPerNode")):
            if field in trainer:
                merged[key] = trainer[field]
        containers.append(merged)
    pod["spec"]["containers"] = containers
    return pod


def core_objects(obj: dict[str, Any], runtime: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The core objects `obj` stands for, by name: a PodTemplate per replica of a job, a batch/v1 Job per
    replicated job of a training runtime (its Job spec carries the pod failure policy)."""
    base = obj["metadata"]["name"].lower()
    if obj["kind"] == "ClusterTrainingRuntime":
        return {job["name"]: {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{base}-{job['name']}", **job["template"].get("metadata", {})},
                              "spec": job["template"]["spec"]}
                for job in obj["spec"]["template"]["spec"]["replicatedJobs"]}
    return {name: {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{base}-{name}".lower()}, "template": template}
            for name, template in pod_templates(obj, runtime).items()}


def core_problems(obj: dict[str, Any], kubernetes_version: str, runtime: dict[str, Any] | None = None) -> list[str]:
    """Core-schema violations of what `obj` will create, for a cluster at `kubernetes_version` (e.g. '1.33');
    a TrainJob's pods merged with its `runtime` where given."""
    import kubernetes_validate

    out = []
    for name, core in core_objects(obj, runtime).items():
        try:
            kubernetes_validate.validate(core, f"{kubernetes_version}.0", strict=True)
        except kubernetes_validate.ValidationError as e:
            where = "/".join(str(p) for p in e.path)
            out.append(f"{name}: {where or '<root>'}: {e.message}")
    return out
