"""Run the real program for a stack file under the mock engine (infra/engine.py), judge what it registers with the
policy pack (the pack's own rules, not a copy), price it (costs.py), and compare two plans."""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from trainforge.infra.engine import Evaluation, RegisteredResource
from trainforge.platform.components.offline import evaluate_stack_file
from trainforge import contract
from trainforge.contract import Flavour
from trainforge.platform.plan.costs import Assumptions, Cost, monthly_cost, team_monthly_cost
from trainforge.policies.registry import StackResource, check_resource, check_stack, rules
from trainforge.stackconfig import PlatformConfig, TeamConfig, load_cohort
from trainforge.stackconfig.loader import stack_path  # noqa: F401 - the plan command names stacks the same way

PROVIDER_PREFIX = "pulumi:providers:"


@dataclass(frozen=True)
class Violation:
    rule: str
    resource: str
    level: str
    message: str


@dataclass(frozen=True)
class QuotaRow:
    """A team's GPUs of one flavour against what the cluster has: its quota, what it may borrow on top, the whole cohort's
    quotas (every team, every stack) and the node groups' capacity."""

    flavour: str
    team_gpus: int
    borrowable: int
    cohort_gpus: int
    capacity: int


@dataclass(frozen=True)
class CohortQuotaRow:
    """Every team's GPUs of one flavour together against the node groups' capacity: what a platform team watches as teams
    join (the stack refuses quotas past the capacity; `free` is what the next team may still be given)."""

    flavour: str
    teams: int  # teams with a quota of this flavour
    quota_gpus: int
    capacity: int

    @property
    def free(self) -> int:
        return self.capacity - self.quota_gpus


def cohort_quota_rows(cfg: PlatformConfig) -> list[CohortQuotaRow]:
    """`cfg`: the platform with its whole cohort in `teams` (load_stack_file)."""
    capacity = {f.value: n for f, n in cfg.gpu_capacity().items()}
    flavours = sorted({f.value for t in cfg.teams for f in t.gpu_quota} | set(capacity))
    quotas = {f: [t.gpu_quota.get(Flavour(f), 0) for t in cfg.teams] for f in flavours}
    return [CohortQuotaRow(f, sum(1 for n in quotas[f] if n), sum(quotas[f]), capacity.get(f, 0)) for f in flavours]


def quota_rows(cfg: PlatformConfig, team: TeamConfig) -> list[QuotaRow]:
    """`cfg`: the platform with its whole cohort in `teams` (load_stack_file)."""
    cohort = {row.flavour: row for row in cohort_quota_rows(cfg)}
    flavours = sorted({f.value for f in (*team.gpu_quota, *team.borrowing_limit)} | set(cohort))
    none = CohortQuotaRow("", 0, 0, 0)
    return [QuotaRow(f, team.gpu_quota.get(Flavour(f), 0), team.borrowing_limit.get(Flavour(f), 0),
                     cohort.get(f, none).quota_gpus, cohort.get(f, none).capacity) for f in flavours]


@dataclass
class Plan:
    stack: str
    path: Path
    config: PlatformConfig  # the platform, with every team of its cohort
    resources: list[RegisteredResource]  # providers excluded
    components: dict[str, str]  # resource URN -> its top-level component's name
    violations: list[Violation]
    cost: Cost
    seconds: float
    assumptions: Assumptions = field(default_factory=Assumptions)
    team: TeamConfig | None = None  # a team stack's team
    quotas: list[QuotaRow] = field(default_factory=list)  # a team stack's quota against the cluster's capacity
    declared_in: dict[str, str] = field(default_factory=dict)  # team -> the stack declaring it (the platform's or its own)

    @property
    def cohort_quotas(self) -> list[CohortQuotaRow]:
        return cohort_quota_rows(self.config)

    @property
    def fsx_quotas(self) -> dict[str, Any]:
        """The teams' FSx group quotas against the file system (the stack refuses a sum above it)."""
        quotas = {t.name: self.config.fsx_quota_gib(t) for t in self.config.teams}
        total, capacity = sum(g for g in quotas.values() if g is not None), self.config.fsx.storage_capacity_gib
        return {"capacity_gib": capacity, "quota_gib": total, "free_gib": capacity - total,
                "unlimited": sorted(name for name, gib in quotas.items() if gib is None)}

    @property
    def mandatory_failures(self) -> list[Violation]:
        return [v for v in self.violations if v.level == "mandatory"]

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack, "stack_file": str(self.path), "resource_count": len(self.resources),
            "resources": [{"type": r.type, "name": r.name, "component": self.components.get(r.urn, "")} for r in self.resources],
            "policy": {"violations": [v.__dict__ for v in self.violations], "passed": not self.mandatory_failures},
            "deploy_blockers": [] if self.team else self.config.cluster.deploy_blockers(),
            **({"team": self.team.name, "quota": [r.__dict__ for r in self.quotas],
                contract.SETTING_BUDGET_USD: self.team.monthly_budget_usd} if self.team else {}),
            "cohort_quota": [{**r.__dict__, "free": r.free} for r in self.cohort_quotas],
            "fsx_quota": self.fsx_quotas,
            "teams": [{"name": t.name, "stack": self.declared_in.get(t.name, self.stack), "gpu_quota": {f.value: n for f, n in t.gpu_quota.items()},
                       "fsx_quota_gib": self.config.fsx_quota_gib(t), contract.SETTING_BUDGET_USD: t.monthly_budget_usd}
                      for t in self.config.teams],
            **self.cost.to_json(), "assumptions": [line.assumption for line in self.cost.lines] + [f"{k}={v}" for k, v in self.assumptions.__dict__.items()],
            "seconds": round(self.seconds, 3),
        }


def make_plan(path: Path, assumptions: Assumptions = Assumptions()) -> Plan:
    """A platform stack's plan, or a team stack's (its platform evaluated first: the StackReference reads its outputs)."""
    started = time.perf_counter()
    cohort = load_cohort(path)  # a bad stack file, or a cohort that does not fit, stops here (exit 2)
    config = cohort.as_platform()
    evaluation = evaluate_stack_file(path)
    resources = [r for r in evaluation.resources if not r.type.startswith(PROVIDER_PREFIX)]
    team = next((s.team for s in cohort.stacks if s.path.name == path.name), None)
    cost = team_monthly_cost(config, team, assumptions) if team else monthly_cost(config, resources, assumptions)
    declared_in = {t.name: cohort.platform.environment for t in cohort.platform.teams} | {s.team.name: s.stack for s in cohort.stacks}
    return Plan(evaluation.environment, path, config, resources, top_components(evaluation), verdicts(evaluation),
                cost, time.perf_counter() - started, assumptions, team, quota_rows(config, team) if team else [], declared_in)


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
    return verdicts_over(*policy_view(evaluation))


def verdicts_over(per_resource: list[tuple[str, str, dict[str, Any], dict[str, Any]]], whole: list[StackResource]) -> list[Violation]:
    """The pack's rules over a policy view (policy_view's, or one a test changed)."""
    names = {r.urn: r.name for r in whole}
    found = []
    for rule in rules():
        if rule.is_stack_rule:
            found += [Violation(rule.name, names.get(urn or "", "stack"), rule.level.value, m) for m, urn in check_stack(rule, whole)]
            continue
        for resource_type, name, props, provider in per_resource:
            found += [Violation(rule.name, name, rule.level.value, m) for m in check_resource(rule, resource_type, props, name=name, provider_props=provider)]
    return found


@contextlib.contextmanager
def stack_file_at_revision(path: Path, revision: str) -> Iterator[Path]:
    """The same stack file as it was at a git revision, in a temporary directory (named as Pulumi names stack files), with
    the stack files next to it at that revision: a team stack's platform, a platform's team stacks (the cohort then).
    The directory is removed when the block ends."""
    from trainforge.errors import TrainforgeError

    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], capture_output=True, text=True, check=True).stdout

    try:
        relative = git("ls-files", "--full-name", str(path)).strip() or str(path)
        directory = str(Path(relative).parent)
        siblings = [f for f in git("ls-tree", "--name-only", f"{revision}:{directory}" if directory != "." else revision).splitlines()
                    if f.startswith("Pulumi.") and f.endswith(".yaml")]
        if Path(relative).name not in siblings:
            git("show", f"{revision}:{relative}")  # fails with git's own reason
        files = {name: git("show", f"{revision}:{Path(directory) / name}") for name in siblings}
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = (getattr(exc, "stderr", "") or str(exc)).strip().splitlines()[-1:]
        raise TrainforgeError("", [f"--against-rev: cannot read {path} at {revision!r}: {' '.join(detail)}. Fix: a commit that has the file"]) from None
    with tempfile.TemporaryDirectory(prefix="trainforge-plan-") as scratch:
        for name, text in files.items():
            (Path(scratch) / name).write_text(text)
        yield Path(scratch) / path.name


@dataclass
class Difference:
    added: list[str]
    removed: list[str]
    changed: list[str]
    cost: list[dict[str, Any]]  # per line: before, after, delta
    teams_added: list[str] = field(default_factory=list)  # the cohort's teams (a team stack added or removed shows here)
    teams_removed: list[str] = field(default_factory=list)

    @property
    def monthly_delta_usd(self) -> float:
        return round(sum(row["delta"] or 0.0 for row in self.cost), 2)

    def to_json(self) -> dict[str, Any]:
        return {"added": self.added, "removed": self.removed, "changed": self.changed, "cost": self.cost,
                "monthly_delta_usd": self.monthly_delta_usd, "teams_added": self.teams_added, "teams_removed": self.teams_removed}


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
    teams_before, teams_after = {t.name for t in before.config.teams}, {t.name for t in after.config.teams}
    return Difference(sorted(new.keys() - old.keys()), sorted(old.keys() - new.keys()), changed, rows,
                      sorted(teams_after - teams_before), sorted(teams_before - teams_after))


def _canonical(inputs: dict[str, Any]) -> str:
    return json.dumps(inputs, sort_keys=True, default=str)
