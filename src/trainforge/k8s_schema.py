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
def crd_validator(file_name: str, version: str):
    import jsonschema

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load((SCHEMA_DIR / file_name).read_text(), Loader=loader)
    schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)
    schema = _strict(schema)
    # apiVersion, kind and metadata are checked by the API server itself, not by the CRD schema.
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


KINDS = {
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): ("trainer.kubeflow.org_trainjobs.yaml", "v1alpha1"),
    ("kubeflow.org/v1", "PyTorchJob"): ("kubeflow.org_pytorchjobs.yaml", "v1"),
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): ("trainer.kubeflow.org_clustertrainingruntimes.yaml", "v1alpha1"),
}


def problems(obj: dict[str, Any]) -> list[str]:
    """Schema violations of `obj`, as 'path: message' lines (empty when valid)."""
    file_name, version = KINDS[(obj["apiVersion"], obj["kind"])]
    validator = crd_validator(file_name, version)
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in validator.iter_errors(obj)]


def pod_templates(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod templates the controller will create from `obj`, by replica name, as core v1 PodTemplateSpecs."""
    if obj["kind"] == "PyTorchJob":
        return {name: replica["template"] for name, replica in obj["spec"]["pytorchReplicaSpecs"].items()}
    if obj["kind"] == "TrainJob":
        return {job["name"]: _trainjob_pod(obj["spec"]["trainer"], job["template"]["spec"]["template"])
                for patch in obj["spec"].get("runtimePatches", [])
                for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]}
    raise KeyError(f"no pod templates known for {obj['apiVersion']}/{obj['kind']}")


def _trainjob_pod(trainer: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """The Trainer merges the trainer section (image, command, env, resourcesPerNode) into the patched container."""
    pod = {"metadata": patch.get("metadata", {}), "spec": dict(patch["spec"])}
    containers = []
    for container in patch["spec"]["containers"]:
        merged = dict(container)
        for key, field in (("image", "image"), ("command", "command"), ("args", "args"), ("env", "env"), ("resources", "resourcesPerNode")):
            if field in trainer:
                merged[key] = trainer[field]
        containers.append(merged)
    pod["spec"]["containers"] = containers
    return pod


def core_objects(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The core objects `obj` stands for, by name: a PodTemplate per replica of a job, a batch/v1 Job per
    replicated job of a training runtime (its Job spec carries the pod failure policy)."""
    base = obj["metadata"]["name"].lower()
    if obj["kind"] == "ClusterTrainingRuntime":
        return {job["name"]: {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{base}-{job['name']}", **job["template"].get("metadata", {})},
                              "spec": job["template"]["spec"]}
                for job in obj["spec"]["template"]["spec"]["replicatedJobs"]}
    return {name: {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{base}-{name}".lower()}, "template": template}
            for name, template in pod_templates(obj).items()}


def core_problems(obj: dict[str, Any], kubernetes_version: str) -> list[str]:
    """Core-schema violations of what `obj` will create, for a cluster at `kubernetes_version` (e.g. '1.33')."""
    import kubernetes_validate

    out = []
    for name, core in core_objects(obj).items():
        try:
            kubernetes_validate.validate(core, f"{kubernetes_version}.0", strict=True)
        except kubernetes_validate.ValidationError as e:
            where = "/".join(str(p) for p in e.path)
            out.append(f"{name}: {where or '<root>'}: {e.message}")
    return out
