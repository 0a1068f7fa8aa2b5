"""Every `pulumi up` after the first, modelled over two evaluations of the program: the deployed one and the next.

The engine matches each resource of the next program to the deployed one by URN (or by one of its aliases), then
creates what is new, deletes what is gone, and updates or replaces what changed. A property the provider cannot change
in place forces a replacement, and Pulumi replaces by creating the new resource before deleting the old one. An `up`
goes through only if none of those steps breaks a rule of the cloud; `problems()` returns each place one does, with
the rule and where it is written down (as platform/plan/first_up.py does for the first `up`).

What the model does not know it does not guess: types missing from REPLACED_BY count every change as an update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping

from trainforge import contract
from trainforge.infra.engine import Evaluation, RegisteredResource
from trainforge.platform.plan import first_up
from trainforge.platform.plan.first_up import CRD_TYPES, RELEASE, Fact

ACCESS_ENTRY = "aws:eks/accessEntry:AccessEntry"
ACCESS_POLICY = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"
IMAGE = "docker-build:index:Image"
REPOSITORY = "aws:ecr/repository:Repository"
JOB = "kubernetes:batch/v1:Job"

# The inputs a provider cannot change in place (its ForceNew / immutable fields): a change to one replaces the resource.
REPLACED_BY: dict[str, tuple[str, ...]] = {
    # terraform-provider-aws internal/service/eks/access_entry.go: cluster_name, principal_arn, type are ForceNew.
    ACCESS_ENTRY: ("clusterName", "principalArn", "type"),
    # ... access_policy_association.go: every argument is ForceNew.
    ACCESS_POLICY: ("clusterName", "principalArn", "policyArn", "accessScope"),
    # ... ecr/repository.go: name is ForceNew.
    REPOSITORY: ("name",),
    # Kubernetes: a Job's pod template is immutable (batch/v1 validation); pulumi-kubernetes replaces the Job.
    JOB: ("spec",),
    # ... a StorageClass's provisioner, parameters and reclaim policy are immutable.
    "kubernetes:storage.k8s.io/v1:StorageClass": ("provisioner", "parameters", "reclaimPolicy", "volumeBindingMode"),
    # ... a PersistentVolume's source is immutable once created.
    "kubernetes:core/v1:PersistentVolume": ("spec",),
}


FACTS = {
    "one-entry-per-principal": Fact(
        "EKS holds one access entry per IAM principal; Pulumi creates a replacement (or a renamed resource) before it "
        "deletes the old one, so a new entry for a principal whose old entry is still there is refused",
        "EKS API CreateAccessEntry (ResourceInUseException: 'The specified access entry resource is already in use'); "
        "Pulumi docs, 'deleteBeforeReplace' (replacements create first by default)"),
    "crds-never-upgraded": Fact(
        "Helm installs the CRDs in a chart's crds/ directory, its subcharts' included, on the first install only: an "
        "upgrade to a new chart version leaves the cluster's CRDs as they were",
        "Helm docs, chart best practices, 'Custom Resource Definitions' ('There is no support at this time for upgrading or "
        "deleting CRDs using Helm'); helm pkg/action/install.go (the crds/ step, SkipCRDs) and upgrade.go (none)"),
    "crds-deleted-with-owner": Fact(
        "Deleting a CRD deletes every object of its kind. A Helm release deletes the CRDs among its templates when it is "
        "uninstalled; the engine deletes a resource the program stops declaring, and the old one after a replacement, "
        "unless it is retained (retainOnDelete) or protected",
        "Kubernetes docs, 'Extend the Kubernetes API with CustomResourceDefinitions', 'Delete a CustomResourceDefinition'; "
        "Pulumi docs, resource options retainOnDelete and protect; pulumi-kubernetes helm_release.go (Delete uninstalls)"),
    "immutable-tag": Fact(
        "An ECR repository with IMMUTABLE tags refuses a push of a tag it already holds for other content",
        "Amazon ECR user guide, 'Image tag mutability' (ImageTagAlreadyExistsException)"),
}


Action = Literal["create", "delete", "update", "replace"]


@dataclass(frozen=True)
class Change:
    urn: str
    type: str
    action: Action
    properties: tuple[str, ...] = ()  # the top-level inputs that differ

    def __str__(self) -> str:
        return f"{self.action} {self.urn}" + (f" ({', '.join(self.properties)})" if self.properties else "")


class Problem(first_up.Problem):
    facts = FACTS


def _deployed_match(resource: RegisteredResource, deployed: dict[str, RegisteredResource]) -> RegisteredResource | None:
    """The deployed resource the engine takes this one to be: its own URN's, else the first alias's that exists."""
    for urn in (resource.urn, *resource.aliases):
        if urn in deployed:
            return deployed[urn]
    return None


def _differing(before: dict[str, Any], after: dict[str, Any]) -> tuple[str, ...]:
    return tuple(sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k) and k != "__defaults"))


def changes(deployed: Evaluation, next_up: Evaluation) -> list[Change]:
    """What the next `up` does to each resource, in URN order (the next program's URN where it has one)."""
    before = {r.urn: r for r in deployed.resources if r.urn}
    matched: set[str] = set()
    out: list[Change] = []
    for resource in next_up.resources:
        if not resource.urn:
            continue
        old = _deployed_match(resource, before)
        if old is None:
            out.append(Change(resource.urn, resource.type, "create"))
            continue
        matched.add(old.urn)
        differing = _differing(old.inputs, resource.inputs)
        if not differing:
            continue
        forced = set(differing) & set(REPLACED_BY.get(resource.type, ()))
        out.append(Change(resource.urn, resource.type, "replace" if forced else "update", differing))
    out += [Change(urn, r.type, "delete") for urn, r in before.items() if urn not in matched]
    return sorted(out, key=lambda c: c.urn)


def problems(deployed: Evaluation, next_up: Evaluation) -> list[Problem]:
    """Every place the next `up` breaks one of FACTS' rules."""
    found = changes(deployed, next_up)
    return [*_principals_taken(deployed, next_up, found), *_tags_pushed_twice(deployed, next_up, found),
            *_crds_deleted(deployed, found)]


def crd_problems(evaluation: Evaluation, rendered: Mapping[str, list[dict[str, Any]]], chart_crds: Mapping[str, frozenset[str]],
                 template_crds: Mapping[str, frozenset[str]]) -> list[Problem]:
    """Every CRD the program relies on outlives the `up`s after the first: it moves with the version the program pins,
    and no step of the engine deletes it. `rendered`: release name -> every object its install creates, hooks included;
    `chart_crds`: release name -> the kinds its chart's crds/ directories define (its enabled subcharts' included);
    `template_crds`: release name -> the kinds CRDs among its templates define (the caller reads all three from the
    charts: tests/support/helm.py)."""
    out = []
    for release in evaluation.of_type(RELEASE):
        name = release.inputs.get("name", release.name)
        if chart_crds.get(name) and not release.inputs.get("skipCrds") and not upgrades_own_crds(rendered.get(name, [])):
            out.append(Problem("crds-never-upgraded", release.urn, f"installs {sorted(chart_crds[name])} from its chart's crds/: "
                                                                   f"the next chart version would leave them as they are"))
        if template_crds.get(name) and not (release.retain_on_delete or release.protect):
            out.append(Problem("crds-deleted-with-owner", release.urn,
                               f"its templates hold the CRDs of {sorted(template_crds[name])}: when the engine uninstalls it "
                               f"(a replacement, or the program no longer declaring it) every such object goes with them"))
    for crd in evaluation.resources:
        if crd.type in CRD_TYPES and not (crd.retain_on_delete or crd.protect):
            out.append(Problem("crds-deleted-with-owner", crd.urn, f"a replacement or removal deletes the CRD "
                                                                   f"{crd.inputs['metadata']['name']} and every object of its kind"))
    return out


def upgrades_own_crds(objects: list[dict[str, Any]]) -> bool:
    """A chart that applies its crds/ itself on every upgrade: a pre-upgrade hook Job, and a hook ClusterRole that may
    patch or update CRDs (kube-prometheus-stack's `crds.upgradeJob`: `kubectl apply --server-side` of its CRDs)."""
    hooks = [o for o in objects if "pre-upgrade" in ((o["metadata"].get("annotations") or {}).get("helm.sh/hook") or "")]
    may_write = any(o["kind"] == "ClusterRole" and any("customresourcedefinitions" in (rule.get("resources") or [])
                                                      and {"patch", "update"} & set(rule.get("verbs") or [])
                                                      for rule in o.get("rules") or [])
                    for o in hooks)
    return may_write and any(o["kind"] == "Job" for o in hooks)


def _crds_deleted(deployed: Evaluation, found: Iterable[Change]) -> list[Problem]:
    """A deployed CRD resource the next `up` deletes or replaces, the engine free to delete it in the cluster."""
    before = {r.urn: r for r in deployed.resources if r.type in CRD_TYPES}
    return [Problem("crds-deleted-with-owner", change.urn, f"{change.action}s the CRD {before[change.urn].inputs['metadata']['name']}: "
                                                           f"every object of its kind is deleted with it")
            for change in found if change.urn in before and change.action in ("delete", "replace")
            and not (before[change.urn].retain_on_delete or before[change.urn].protect)]


def _principals_taken(deployed: Evaluation, next_up: Evaluation, found: Iterable[Change]) -> list[Problem]:
    """An entry created (or replaced) while the deployed entry of the same principal still exists at that moment."""
    before = {r.urn: r for r in deployed.of_type(ACCESS_ENTRY)}
    after = {r.urn: r for r in next_up.of_type(ACCESS_ENTRY)}
    out = []
    for change in found:
        if change.type != ACCESS_ENTRY or change.action not in ("create", "replace"):
            continue
        principal = after[change.urn].inputs.get("principalArn")
        holders = [urn for urn, r in before.items() if r.inputs.get("principalArn") == principal]
        if holders:
            out.append(Problem("one-entry-per-principal", change.urn,
                               f"{change.action}s an entry for {principal} while {holders[0]} still holds it"))
    return out


def _tags_pushed_twice(deployed: Evaluation, next_up: Evaluation, found: Iterable[Change]) -> list[Problem]:
    """A rebuilt image (its build inputs changed) pushed under a tag the deployed image already holds."""
    before = {r.urn: r for r in deployed.of_type(IMAGE)}
    after = {r.urn: r for r in next_up.of_type(IMAGE)}
    out = []
    for change in found:
        if change.type != IMAGE or change.action == "delete" or change.urn not in before:
            continue
        built_from = ("context", "dockerfile", "buildArgs", "labels", "platforms")
        if not set(change.properties) & set(built_from) and _context_digest(before[change.urn]) == _context_digest(after[change.urn]):
            continue
        again = sorted(set(before[change.urn].inputs.get("tags") or ()) & set(after[change.urn].inputs.get("tags") or ()))
        if again:
            out.append(Problem("immutable-tag", change.urn, f"rebuilds and pushes {again} again with other content"))
    return out


def _context_digest(image: RegisteredResource) -> str | None:
    return (image.inputs.get("labels") or {}).get(contract.IMAGE_CONTEXT_LABEL)
