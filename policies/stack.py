"""Stack rules: what only the whole stack shows — resources that must agree with each other."""

from __future__ import annotations

from typing import Any, Iterable

from trainforge import contract
from trainforge.policies.kubernetes import TEAM_LABEL
from trainforge.policies.registry import Context, StackResource, stack_rule

Violations = Iterable[tuple[str, str | None]]


def of_type(resources: list[StackResource], *types: str) -> list[StackResource]:
    return [r for r in resources if r.resource_type in types]


def dependencies(resource: StackResource, resources: list[StackResource], resource_type: str) -> list[StackResource]:
    by_urn = {r.urn: r for r in resources}
    return [by_urn[u] for u in resource.dependencies if u in by_urn and by_urn[u].resource_type == resource_type]


def _efa_groups(resources: list[StackResource]) -> list[tuple[StackResource, StackResource]]:
    """(node group, launch template) pairs whose template has EFA interfaces."""
    out = []
    for group in of_type(resources, "aws:eks/nodeGroup:NodeGroup"):
        for template in dependencies(group, resources, "aws:ec2/launchTemplate:LaunchTemplate"):
            if any(i.get("interfaceType") in ("efa", "efa-only") for i in template.props.get("networkInterfaces") or []):
                out.append((group, template))
    return out


def _zones(resource: StackResource, resources: list[StackResource]) -> set[str]:
    return {s.props.get("availabilityZone") for s in dependencies(resource, resources, "aws:ec2/subnet:Subnet")}


@stack_rule("EFA node groups live in one AZ, in a cluster placement group, with a security group open to itself; FSx sits in their AZ.")
def efa_groups_coherent(resources: list[StackResource], ctx: Context) -> Violations:
    file_systems = of_type(resources, "aws:fsx/lustreFileSystem:LustreFileSystem")
    for group, template in _efa_groups(resources):
        zones = _zones(group, resources)
        if len(zones) != 1:
            yield f"EFA group {group.name} spans {sorted(zones)}: a placement group lives in one AZ. Fix: one subnet, one AZ", group.urn
        groups = dependencies(template, resources, "aws:ec2/placementGroup:PlacementGroup")
        if not any(p.props.get("strategy") == "cluster" for p in groups):
            yield f"EFA template {template.name} is not in a cluster placement group. Fix: a placement group with strategy 'cluster'", template.urn
        security = dependencies(template, resources, "aws:ec2/securityGroup:SecurityGroup")
        if not any(_open_to_itself(sg.props) for sg in security):
            yield (f"no security group of {template.name} allows all traffic to and from itself: EFA's OS-bypass traffic is dropped. "
                   "Fix: an EFA security group with self ingress and egress on all protocols"), template.urn
        for fs in file_systems:
            fs_zones = _zones(fs, resources)
            if zones and fs_zones and fs_zones != zones:
                yield (f"FSx {fs.name} is in {sorted(fs_zones)}, the EFA group {group.name} in {sorted(zones)}: cross-AZ Lustre is slow "
                       "and billed. Fix: put FSx in the EFA group's AZ"), fs.urn


def _open_to_itself(props: dict[str, Any]) -> bool:
    def all_to_self(rules: Any) -> bool:
        return any(r.get("self") is True and str(r.get("protocol")) == "-1" for r in rules or [])
    return all_to_self(props.get("ingress")) and all_to_self(props.get("egress"))


@stack_rule("Every Kueue ResourceFlavor matches the nodes of some node group (labels present, taints the same).")
def resource_flavours_match_node_groups(resources: list[StackResource], ctx: Context) -> Violations:
    effects = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
    nodes = [({**(g.props.get("labels") or {})}, sorted((t.get("key"), t.get("value"), effects.get(t.get("effect"), t.get("effect")))
                                                        for t in g.props.get("taints") or []))
             for g in of_type(resources, "aws:eks/nodeGroup:NodeGroup")]
    for flavour in of_type(resources, "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor"):
        spec = flavour.props.get("spec") or {}
        wanted = spec.get("nodeLabels") or {}
        taints = sorted((t.get("key"), t.get("value"), t.get("effect")) for t in spec.get("nodeTaints") or [])
        if not any(all(labels.get(k) == v for k, v in wanted.items()) and node_taints == taints for labels, node_taints in nodes):
            yield (f"ResourceFlavor {flavour.props.get('metadata', {}).get('name')} matches no node group: Kueue would admit jobs onto "
                   "nodes that never come. Fix: derive both from trainforge.contract.flavour_traits"), flavour.urn


@stack_rule("Every team has its namespace, GPU quota, limits, default-deny network policy and queues.")
def teams_have_their_tenancy(resources: list[StackResource], ctx: Context) -> Violations:
    teams = {r.props.get("tags", {}).get(contract.TAG_TEAM) for r in of_type(resources, "aws:iam/role:Role")} - {None}
    namespaces = {(r.props.get("metadata") or {}).get("name"): r for r in of_type(resources, "kubernetes:core/v1:Namespace")
                  if TEAM_LABEL in ((r.props.get("metadata") or {}).get("labels") or {})}
    teams |= {(r.props.get("metadata") or {}).get("labels", {}).get(TEAM_LABEL) for r in namespaces.values()}

    def in_namespace(kind: str, namespace: str) -> list[StackResource]:
        return [r for r in of_type(resources, kind) if (r.props.get("metadata") or {}).get("namespace") == namespace]

    cluster_queues = {(r.props.get("metadata") or {}).get("name") for r in of_type(resources, "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue")}
    for team in sorted(teams):
        namespace = contract.namespace_name(team)
        if namespace not in namespaces:
            yield f"team {team!r} has no namespace {namespace}. Fix: its tenancy component", None
            continue
        quotas = in_namespace("kubernetes:core/v1:ResourceQuota", namespace)
        if not any(f"requests.{contract.RESOURCE_GPU}" in ((q.props.get("spec") or {}).get("hard") or {}) for q in quotas):
            yield f"namespace {namespace} has no ResourceQuota on requests.{contract.RESOURCE_GPU}. Fix: a quota that backstops Kueue", None
        if not in_namespace("kubernetes:core/v1:LimitRange", namespace):
            yield f"namespace {namespace} has no LimitRange: a pod without requests is unbounded. Fix: LimitRange defaults", None
        if not any(_default_deny(p.props) for p in in_namespace("kubernetes:networking.k8s.io/v1:NetworkPolicy", namespace)):
            yield f"namespace {namespace} has no default-deny NetworkPolicy. Fix: deny all ingress and egress, then allow what jobs need", None
        if not in_namespace("kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue", namespace) or contract.cluster_queue_name(team) not in cluster_queues:
            yield f"team {team!r} has no LocalQueue/ClusterQueue: its jobs would never be admitted. Fix: its Kueue queues", None


def _default_deny(props: dict[str, Any]) -> bool:
    spec = props.get("spec") or {}
    return spec.get("podSelector") == {} and set(spec.get("policyTypes") or []) == {"Ingress", "Egress"} \
        and not spec.get("ingress") and not spec.get("egress")


BUCKET_GUARDS = {
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": "a KMS encryption configuration",
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": "a public access block",
    "aws:s3/bucketPolicy:BucketPolicy": "a policy that denies plain HTTP",
}


@stack_rule("Every S3 bucket has its encryption configuration, public access block and TLS-only policy.")
def buckets_fully_guarded(resources: list[StackResource], ctx: Context) -> Violations:
    for bucket in of_type(resources, "aws:s3/bucket:Bucket"):
        guards = {r.resource_type for r in resources if bucket.urn in r.dependencies and r.resource_type in BUCKET_GUARDS}
        for missing in sorted(set(BUCKET_GUARDS) - guards):
            yield (f"bucket {bucket.name} has no {BUCKET_GUARDS[missing]}: the per-resource rules cannot see what is absent. "
                   f"Fix: create it for this bucket (infra/storage.py Buckets does)"), bucket.urn
