"""The API server's ValidatingAdmissionPolicy decision, over the policies and bindings the program creates.

What the API server does with a policy and its binding (admissionregistration.k8s.io/v1), for the parts the program
uses: matchConstraints' resourceRules and namespaceSelector, the binding's matchResources namespaceSelector, paramRef
by name in the admitted object's namespace (no namespace given) with parameterNotFoundAction, failurePolicy, and each
validation's CEL expression — evaluated by a CEL implementation (cel-python), not re-written here. An expression
that errors counts as a failure under failurePolicy Fail, as in the API server.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import celpy

from trainforge.selectors import matches

REASON_STATUS = {"Unauthorized": 401, "Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413}


@dataclass(frozen=True)
class Denial:
    policy: str
    message: str
    reason: str = "Invalid"

    @property
    def status(self) -> int:
        return REASON_STATUS.get(self.reason, 422)

    def __str__(self) -> str:
        return f"ValidatingAdmissionPolicy '{self.policy}' with binding '{self.policy}' denied request: {self.message}"


def _rule_matches(rule: dict[str, Any], group: str, version: str, plural: str, operation: str) -> bool:
    def has(values: list[str], value: str) -> bool:
        return "*" in values or value in values
    return (has(rule.get("apiGroups", []), group) and has(rule.get("apiVersions", []), version)
            and has(rule.get("resources", []), plural) and has(rule.get("operations", []), operation))


_ENVIRONMENT = celpy.Environment()


@functools.cache
def _compiled(expression: str):
    """A CEL program, compiled once per test process: the same policies are evaluated by hundreds of tests."""
    return _ENVIRONMENT.program(_ENVIRONMENT.compile(expression))


class AdmissionPolicies:
    def __init__(self, objects: list[dict[str, Any]]):
        self.policies = {o["metadata"]["name"]: o for o in objects if o.get("kind") == "ValidatingAdmissionPolicy"}
        self.bindings = [o for o in objects if o.get("kind") == "ValidatingAdmissionPolicyBinding"]

    @staticmethod
    def _program(expression: str):
        return _compiled(expression)

    def denials(self, operation: str, obj: dict[str, Any], *, group: str, version: str, plural: str,
                namespace_labels: dict[str, str] | None, param: Callable[[str, str], dict[str, Any] | None]) -> list[Denial]:
        """Every denial of `obj` (empty: admitted). `param(namespace, name)` finds a params object (a ConfigMap)."""
        out: list[Denial] = []
        namespace = obj.get("metadata", {}).get("namespace")
        for binding in self.bindings:
            spec = binding["spec"]
            policy = self.policies.get(spec["policyName"])
            if policy is None:
                continue
            constraints = policy["spec"]["matchConstraints"]
            if not any(_rule_matches(r, group, version, plural, operation) for r in constraints.get("resourceRules", [])):
                continue
            selectors = [constraints.get("namespaceSelector"), spec.get("matchResources", {}).get("namespaceSelector")]
            if any(s is not None and (namespace_labels is None or not matches(s, namespace_labels)) for s in selectors):
                continue
            params = None
            if "paramKind" in policy["spec"]:
                ref = spec["paramRef"]
                params = param(ref.get("namespace") or namespace, ref["name"])
                if params is None:
                    if ref.get("parameterNotFoundAction", "Deny") == "Deny":
                        out.append(Denial(policy["metadata"]["name"], f"failed to find params {ref['name']!r} in namespace {namespace!r}"))
                    continue
            activation = {"object": celpy.json_to_cel(obj), "oldObject": None,
                          "params": celpy.json_to_cel(params) if params is not None else None,
                          "namespaceObject": celpy.json_to_cel({"metadata": {"name": namespace, "labels": namespace_labels or {}}}),
                          "request": celpy.json_to_cel({"operation": operation})}
            for validation in policy["spec"]["validations"]:
                try:
                    passed = self._program(validation["expression"]).evaluate(activation)
                except celpy.CELEvalError as e:
                    passed = e
                if isinstance(passed, celpy.CELEvalError):  # an error is a failure under failurePolicy Fail
                    ok, message = policy["spec"].get("failurePolicy", "Fail") != "Fail", f"expression error: {passed}"
                else:
                    ok = isinstance(passed, celpy.celtypes.BoolType) and bool(passed)
                    message = validation.get("message", f"failed expression: {validation['expression']}")
                if not ok:
                    out.append(Denial(policy["metadata"]["name"], message, validation.get("reason", "Invalid")))
        return out
