"""Validate rendered objects against CRD OpenAPI schemas, strictly.

The API server prunes fields a structural schema does not list, so a misspelt field in a manifest is
silently dropped. Here every object schema that lists properties (and does not preserve unknown fields)
rejects anything else: a typo fails the test instead of vanishing on the cluster.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas" / "crds"


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
}


def problems(obj: dict[str, Any]) -> list[str]:
    """Schema violations of `obj`, as 'path: message' lines (empty when valid)."""
    file_name, version = KINDS[(obj["apiVersion"], obj["kind"])]
    validator = crd_validator(file_name, version)
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in validator.iter_errors(obj)]
