"""Kubernetes label selectors, evaluated as the API server does (apimachinery `LabelSelectorAsSelector`).

One implementation for everything that asks "does this selector pick that object": Prometheus selecting monitors
and rules, webhooks' namespace and object selectors, Kueue's managed namespaces, NetworkPolicies.
"""

from __future__ import annotations

from typing import Any, Mapping


def matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """A nil selector selects nothing; an empty one ({}) selects everything (apimachinery's rule)."""
    if selector is None:
        return False
    labels = labels or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_expression(e, labels) for e in selector.get("matchExpressions") or [])


def _expression(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise ValueError(f"unknown label selector operator {operator!r}")


def namespace_labels(name: str, labels: Mapping[str, str] | None = None) -> dict[str, str]:
    """A namespace's labels as selectors see them: the API server adds `kubernetes.io/metadata.name` to every one."""
    return {**(labels or {}), "kubernetes.io/metadata.name": name}
