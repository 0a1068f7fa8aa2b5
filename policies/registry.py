"""How a rule is declared: once, with the resource types it applies to, a description, an enforcement level and
the pack config it reads. The type guard, the config defaults and the reporting live here, not in each rule.

A resource rule is a function `(props, ctx) -> violations` (an iterable of messages, each saying what to change);
a stack rule is `(resources, ctx) -> violations` of (message, urn). Properties arrive as the engine presents them:
camelCase, provider default tags on the provider, unknown values at preview (reading one raises, and the pack
reports "can't run during preview" instead of a false violation).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, cast

from pulumi_policy import EnforcementLevel, PolicyConfigSchema

from trainforge import catalog, contract

# The pack's configuration (`pulumi preview --policy-pack policies --policy-pack-config config.json`): JSON schema
# with defaults. Rules read it through ctx.config, defaults filled in.
CONFIG_SCHEMA: dict[str, dict[str, Any]] = {
    "requiredTags": {"type": "array", "items": {"type": "string"}, "default": list(contract.REQUIRED_COST_TAGS),
                     "description": "tag keys every taggable AWS resource carries (on itself or through the provider's default tags)"},
    "allowedGpuFamilies": {"type": "array", "items": {"type": "string"}, "default": sorted(catalog.GPU_FAMILIES),
                           "description": "instance families a GPU node group may use"},
    "maxNodeGroupSize": {"type": "integer", "minimum": 1, "default": 64, "description": "largest max_size of a node group"},
    "allowedRegions": {"type": "array", "items": {"type": "string"}, "default": [],
                       "description": "regions a stack may deploy to (empty: any)"},
    "minSpotInstanceTypes": {"type": "integer", "minimum": 1, "default": 2,
                             "description": "instance types a spot node group spreads over (one reclaimed type must not empty it)"},
    "systemNamespaces": {"type": "array", "items": {"type": "string"},
                         "default": [contract.NAMESPACE_KUBE_SYSTEM, contract.NAMESPACE_KUEUE, contract.NAMESPACE_TRAINER, contract.NAMESPACE_MONITORING],
                         "description": "namespaces where privileged pods and host paths are allowed (node agents)"},
}
DEFAULTS = {key: spec["default"] for key, spec in CONFIG_SCHEMA.items()}


@dataclass(frozen=True)
class Context:
    config: Mapping[str, Any]
    resource_type: str = ""
    name: str = ""
    provider_props: Mapping[str, Any] = field(default_factory=dict)

    def provider_default_tags(self) -> dict[str, str]:
        raw = self.provider_props.get("defaultTags") or {}
        if isinstance(raw, str):  # provider config arrives JSON-encoded
            raw = json.loads(raw)
        return dict(raw.get("tags") or {})


@dataclass(frozen=True)
class StackResource:
    """What a stack rule sees of one resource: its outputs, and what it depends on."""

    resource_type: str
    name: str
    urn: str
    props: Mapping[str, Any]
    provider_props: Mapping[str, Any] = field(default_factory=dict)
    dependencies: tuple[str, ...] = ()  # URNs


Applies = Callable[[str], bool]
ResourceCheck = Callable[[Mapping[str, Any], Context], Iterable[str]]
StackCheck = Callable[[list[StackResource], Context], Iterable[tuple[str, str | None]]]


@dataclass(frozen=True)
class Rule:
    name: str
    domain: str  # one of DOMAINS
    description: str
    level: EnforcementLevel
    applies: Applies | None  # resource rules: which resource types; None for stack rules
    check: ResourceCheck | StackCheck
    config_keys: tuple[str, ...] = ()

    @property
    def is_stack_rule(self) -> bool:
        return self.applies is None

    def config_schema(self) -> PolicyConfigSchema | None:
        return PolicyConfigSchema({k: CONFIG_SCHEMA[k] for k in self.config_keys}) if self.config_keys else None


_REGISTERED: list[Rule] = []


DOMAINS = ("aws", "kubernetes", "stack")


def rules() -> list[Rule]:
    """Every rule of the pack: by domain (aws, kubernetes, stack), each in declaration order. Whichever module a process
    imported first registers first, so the order is fixed here, not by imports (the README's table depends on it)."""
    from trainforge.policies import aws, kubernetes, stack  # noqa: F401
    return sorted(_REGISTERED, key=lambda rule: DOMAINS.index(rule.domain))


def _types(types: Iterable[str] | Applies) -> Applies:
    if callable(types):
        return types
    wanted = frozenset(types)
    return lambda resource_type: resource_type in wanted


def resource_rule(domain: str, types: Iterable[str] | Applies, description: str, *, level: EnforcementLevel = EnforcementLevel.MANDATORY,
                  config: tuple[str, ...] = ()) -> Callable[[ResourceCheck], ResourceCheck]:
    def register(check: ResourceCheck) -> ResourceCheck:
        _REGISTERED.append(Rule(check.__name__.replace("_", "-"), domain, description, level, _types(types), check, config))
        return check
    return register


def stack_rule(description: str, *, level: EnforcementLevel = EnforcementLevel.MANDATORY,
               config: tuple[str, ...] = ()) -> Callable[[StackCheck], StackCheck]:
    def register(check: StackCheck) -> StackCheck:
        _REGISTERED.append(Rule(check.__name__.replace("_", "-"), "stack", description, level, None, check, config))
        return check
    return register


def policy_document(raw: Any) -> dict[str, Any]:
    """An IAM/KMS policy as the engine presents it (a JSON string, or already a mapping); {} when it is neither."""
    try:
        document = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def statements(document: dict[str, Any]) -> list[dict[str, Any]]:
    """A policy's statements: IAM allows one statement object where a list is meant."""
    found = document.get("Statement") or []
    return found if isinstance(found, list) else [found]


def with_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    return {**DEFAULTS, **{k: v for k, v in config.items() if k in DEFAULTS}}


def check_resource(rule: Rule, resource_type: str, props: Mapping[str, Any], *, name: str = "", config: Mapping[str, Any] | None = None,
                   provider_props: Mapping[str, Any] | None = None) -> list[str]:
    """The rule's violations for one resource (none when it does not apply)."""
    if rule.applies is None or not rule.applies(resource_type):
        return []
    ctx = Context(with_defaults(config or {}), resource_type, name, provider_props or {})
    check = cast(ResourceCheck, rule.check)  # a rule that applies to resource types checks one resource
    return list(check(props, ctx))


def check_stack(rule: Rule, resources: list[StackResource], config: Mapping[str, Any] | None = None) -> list[tuple[str, str | None]]:
    if not rule.is_stack_rule:
        return []
    check = cast(StackCheck, rule.check)  # a stack rule checks every resource at once
    return list(check(resources, Context(with_defaults(config or {}))))
