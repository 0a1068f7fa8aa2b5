"""Run the real program for a stack file under the mock engine (infra/engine.py), judge what it registers with the
policy pack (the pack's own rules, not a copy), price it (costs.py), and compare two plans."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainforge.infra.engine import Evaluation, RegisteredResource
from trainforge.platform.components.offline import evaluate_stack_file
from trainforge.platform.plan.costs import Assumptions, Cost, monthly_cost
from trainforge.policies.registry import StackResource, check_resource, check_stack, rules
from trainforge.stackconfig import PlatformConfig, load_stack_file
from trainforge.stackconfig.loader import stack_path  # noqa: F401 - the plan command names stacks the same way

PROVIDER_PREFIX = "pulumi:providers:"


@dataclass(frozen=True)
class Violation:
    rule: str
    resource: str
    level: str
    message: str


@dataclass
class Plan:
    stack: str
    path: Path
    config: PlatformConfig
    resources: list[RegisteredResource]  # providers excluded
    components: dict[str, str]  # resource URN -> its top-level component's name
    violations: list[Violation]
    cost: Cost
    seconds: float
    assumptions: Assumptions = field(default_factory=Assumptions)

    @property
    def mandatory_failures(self) -> list[Violation]:
        return [v for v in self.violations if v.level == "mandatory"]

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack, "stack_file": str(self.path), "resource_count": len(self.resources),
            "resources": [{"type": r.type, "name": r.name, "component": self.components.get(r.urn, "")} for r in self.resources],
            "policy": {"violations": [v.__dict__ for v in self.violations], "passed": not self.mandatory_failures},
            "deploy_blockers": self.config.cluster.deploy_blockers(),
            **self.cost.to_json(), "assumptions": [line.assumption for line in self.cost.lines] + [f"{k}={v}" for k, v in self.assumptions.__dict__.items()],
            "seconds": round(self.seconds, 3),
        }


def make_plan(path: Path, assumptions: Assumptions = Assumptions()) -> Plan:
    started = time.perf_counter()
    config = load_stack_file(path)  # a bad stack file stops here with the field and the fix (exit 2)
    evaluation = evaluate_stack_file(path)
    resources = [r for r in evaluation.resources if not r.type.startswith(PROVIDER_PREFIX)]
    return Plan(config.environment, path, config, resources, top_components(evaluation), verdicts(evaluation),
                monthly_cost(config, resources, assumptions), time.perf_counter() - started, assumptions)


def top_components(evaluation: Evaluation) -> dict[str, str]:
    by_urn = {r.urn: r for r in evaluation.resources}
    out = {}
    for r in evaluation.resources:
        node = r
        while node.parent in by_urn:
            node = by_urn[node.parent]
        out[r.urn] = node.name if node is not r else ""
    return out


def policy_view(evaluation: Evaluation) -> tuple[list[tuple[str, str, dict[str, Any], dict[str, Any]]], list[StackResource]]:
    """What the Pulumi CLI hands the pack: per resource (type, name, inputs, its provider's inputs), and the whole stack
    (outputs and dependencies)."""
    providers = {f"{r.urn}::{r.id}": r.inputs for r in evaluation.resources if r.type.startswith(PROVIDER_PREFIX)}
    per_resource = [(r.type, r.name, r.inputs, providers.get(r.provider or "", {})) for r in evaluation.resources]
    whole = [StackResource(r.type, r.name, r.urn, r.state, providers.get(r.provider or "", {}), tuple(r.dependencies))
             for r in evaluation.resources]
    return per_resource, whole


def verdicts(evaluation: Evaluation) -> list[Violation]:
    """The policy pack's rules on what the program registered, as the pack would judge it under `pulumi preview`."""
    per_resource, whole = policy_view(evaluation)
    names = {r.urn: r.name for r in whole}
    found = []
    for rule in rules():
        if rule.is_stack_rule:
            found += [Violation(rule.name, names.get(urn or "", "stack"), rule.level.value, m) for m, urn in check_stack(rule, whole)]
            continue
        for resource_type, name, props, provider in per_resource:
            found += [Violation(rule.name, name, rule.level.value, m) for m in check_resource(rule, resource_type, props, name=name, provider_props=provider)]
    return found


def stack_file_at_revision(path: Path, revision: str) -> Path:
    """The same stack file as it was at a git revision, in a temporary directory (named as Pulumi names stack files)."""
    try:
        relative = subprocess.run(["git", "ls-files", "--full-name", str(path)], capture_output=True, text=True, check=True).stdout.strip()
        content = subprocess.run(["git", "show", f"{revision}:{relative or path}"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        from trainforge.errors import TrainforgeError
        detail = (getattr(exc, "stderr", "") or str(exc)).strip().splitlines()[-1:]
        raise TrainforgeError("", [f"--against-rev: cannot read {path} at {revision!r}: {' '.join(detail)}. Fix: a commit that has the file"]) from None
    out = Path(tempfile.mkdtemp(prefix="trainforge-plan-")) / path.name
    out.write_text(content)
    return out


@dataclass
class Difference:
    added: list[str]
    removed: list[str]
    changed: list[str]
    cost: list[dict[str, Any]]  # per line: before, after, delta

    @property
    def monthly_delta_usd(self) -> float:
        return round(sum(row["delta"] or 0.0 for row in self.cost), 2)

    def to_json(self) -> dict[str, Any]:
        return {"added": self.added, "removed": self.removed, "changed": self.changed, "cost": self.cost,
                "monthly_delta_usd": self.monthly_delta_usd}


def difference(before: Plan, after: Plan) -> Difference:
    """What `after` adds, removes and changes relative to `before` (resources by type and name), and the cost per line."""
    def keyed(plan: Plan) -> dict[str, RegisteredResource]:
        return {f"{r.type} {r.name}": r for r in plan.resources}
    old, new = keyed(before), keyed(after)
    changed = sorted(k for k in old.keys() & new.keys() if _canonical(old[k].inputs) != _canonical(new[k].inputs))
    rows = []
    old_lines, new_lines = before.cost.by_item(), after.cost.by_item()
    for item in dict.fromkeys([*old_lines, *new_lines]):
        a, b = old_lines.get(item), new_lines.get(item)
        was, now = (a.monthly_usd if a else 0.0), (b.monthly_usd if b else 0.0)
        delta = None if was is None or now is None else round(now - was, 2)
        if delta != 0:
            rows.append({"item": item, "before": was, "after": now, "delta": delta})
    return Difference(sorted(new.keys() - old.keys()), sorted(old.keys() - new.keys()), changed, rows)


def _canonical(inputs: dict[str, Any]) -> str:
    return json.dumps(inputs, sort_keys=True, default=str)
