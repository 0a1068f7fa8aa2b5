"""Stack rules: what only the whole stack shows — resources that must agree with each other."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from trainforge import contract
from trainforge.policies.kubernetes import TEAM_LABEL
from trainforge.policies.registry import Context, StackResource, policy_document, stack_rule, statements

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
    return {str(s.props.get("availabilityZone")) for s in dependencies(resource, resources, "aws:ec2/subnet:Subnet")}


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


def _open_to_itself(props: Mapping[str, Any]) -> bool:
    def all_to_self(rules: Any) -> bool:
        return any(r.get("self") is True and str(r.get("protocol")) == "-1" for r in rules or [])
    return all_to_self(props.get("ingress")) and all_to_self(props.get("egress"))


@stack_rule("Every Kueue ResourceFlavor matches the nodes of some node group (labels present, taints the same).")
def resource_flavours_match_node_groups(resources: list[StackResource], ctx: Context) -> Violations:
    effects = contract.KUBERNETES_TAINT_EFFECTS
    nodes = [({**(g.props.get("labels") or {})}, sorted((t.get("key"), t.get("value"), effects.get(t.get("effect"), t.get("effect")))
                                                        for t in g.props.get("taints") or []))
             for g in of_type(resources, "aws:eks/nodeGroup:NodeGroup")]
    for flavour in of_type(resources, contract.pulumi_type(contract.KUEUE_API, "ResourceFlavor")):
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

    cluster_queues = {(r.props.get("metadata") or {}).get("name") for r in of_type(resources, contract.pulumi_type(contract.KUEUE_API, "ClusterQueue"))}
    for team in sorted(teams):
        namespace = contract.namespace_name(team)
        if namespace not in namespaces:
            yield f"team {team!r} has no namespace {namespace}. Fix: its tenancy component", None
            continue
        quotas = in_namespace("kubernetes:core/v1:ResourceQuota", namespace)
        if not any(contract.quota_requests_key(contract.RESOURCE_GPU) in ((q.props.get("spec") or {}).get("hard") or {}) for q in quotas):
            yield f"namespace {namespace} has no ResourceQuota on requests.{contract.RESOURCE_GPU}. Fix: a quota that backstops Kueue", None
        if not in_namespace("kubernetes:core/v1:LimitRange", namespace):
            yield f"namespace {namespace} has no LimitRange: a pod without requests is unbounded. Fix: LimitRange defaults", None
        if not any(_default_deny(p.props) for p in in_namespace("kubernetes:networking.k8s.io/v1:NetworkPolicy", namespace)):
            yield f"namespace {namespace} has no default-deny NetworkPolicy. Fix: deny all ingress and egress, then allow what jobs need", None
        if not in_namespace(contract.pulumi_type(contract.KUEUE_API, "LocalQueue"), namespace) or contract.cluster_queue_name(team) not in cluster_queues:
            yield f"team {team!r} has no LocalQueue/ClusterQueue: its jobs would never be admitted. Fix: its Kueue queues", None


PLATFORM_NAMESPACES = contract.PLATFORM_NAMESPACES


@stack_rule("Every platform namespace the stack creates denies all traffic by default (its components' allowances follow).")
def platform_namespaces_deny_by_default(resources: list[StackResource], ctx: Context) -> Violations:
    created = {(r.props.get("metadata") or {}).get("name") for r in of_type(resources, "kubernetes:core/v1:Namespace")}
    for namespace in PLATFORM_NAMESPACES:
        policies = [r for r in of_type(resources, "kubernetes:networking.k8s.io/v1:NetworkPolicy")
                    if (r.props.get("metadata") or {}).get("namespace") == namespace]
        if namespace in created and not any(_default_deny(p.props) for p in policies):
            yield (f"namespace {namespace} has no default-deny NetworkPolicy: anything reaching its pods (MLflow's fetches, "
                   "Grafana's data-source proxy) reaches every port. Fix: platform/manifests/network.py"), None


def _default_deny(props: Mapping[str, Any]) -> bool:
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


# What a team's IRSA role may do: read the datasets, read and write its own prefix, use the data key. Anything else
# (another team's prefix, a wildcard, IAM, a managed policy) widens one team into the others'.
TEAM_OBJECT_ACTIONS = {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"}
TEAM_BUCKET_ACTIONS = {"s3:ListBucket", "s3:ListBucketMultipartUploads"}
TEAM_KEY_ACTIONS = {"kms:Decrypt", "kms:GenerateDataKey"}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [] if value is None else [value]


def _team_statement_problems(statement: dict[str, Any], team: str, datasets_arns: set[str]) -> Iterable[str]:
    if statement.get("Effect") != "Allow":
        return
    prefix = contract.team_s3_prefix(team)
    actions, resources = {str(a) for a in _as_list(statement.get("Action"))}, [str(r) for r in _as_list(statement.get("Resource"))]
    if statement.get("NotAction") or statement.get("NotResource"):
        yield "allows by NotAction/NotResource (everything but a list). Fix: list the actions and resources"
    if actions & TEAM_KEY_ACTIONS:
        via = ((statement.get("Condition") or {}).get("StringLike") or {}).get("kms:ViaService") \
            or ((statement.get("Condition") or {}).get("StringEquals") or {}).get("kms:ViaService")
        if not via or any(not str(v).startswith("s3.") for v in _as_list(via)):
            yield ("may use the data key outside S3 (no kms:ViaService condition): it could decrypt whatever else the key "
                   "protects. Fix: a StringLike kms:ViaService of s3.*.amazonaws.com")
    for action in sorted(actions - TEAM_OBJECT_ACTIONS - TEAM_BUCKET_ACTIONS - TEAM_KEY_ACTIONS):
        yield f"allows {action!r}, beyond the storage and data-key actions a team's jobs need. Fix: remove it"
    for resource in resources:
        if resource == "*" or resource.endswith(":*"):
            yield f"allows {sorted(actions)} on {resource!r}. Fix: name the team's buckets and prefix"
            continue
        bucket, _, key = resource.partition("/")
        object_actions = actions & TEAM_OBJECT_ACTIONS
        if key and object_actions and bucket in datasets_arns:
            if object_actions - {"s3:GetObject"}:
                yield f"allows {sorted(object_actions - {'s3:GetObject'})} on the datasets ({resource}). Fix: datasets are read-only"
        elif key and object_actions and not key.startswith(prefix):
            yield f"allows {sorted(object_actions)} on {resource}, outside {prefix}. Fix: {bucket}/{prefix}*"
        if not key and actions & TEAM_BUCKET_ACTIONS and bucket not in datasets_arns:
            prefixes = _as_list(((statement.get("Condition") or {}).get("StringLike") or {}).get("s3:prefix"))
            if not prefixes or any(not str(p).startswith(prefix) for p in prefixes):
                yield f"lists {bucket} beyond {prefix} (s3:prefix {prefixes or 'unset'}). Fix: a StringLike s3:prefix of {prefix}*"


def _trusted_subjects(assume_role_policy: Any) -> list[str]:
    subjects = []
    for statement in statements(policy_document(assume_role_policy)):
        for test in ("StringEquals", "StringLike"):
            subjects += [str(s) for k, v in ((statement.get("Condition") or {}).get(test) or {}).items() if k.endswith(":sub")
                         for s in _as_list(v)]
        if not (statement.get("Condition") or {}):
            subjects.append("*")
    return subjects


@stack_rule("A team's IAM role is assumed only by its namespace's training ServiceAccount and reaches only the datasets "
            "(read), its own S3 prefix and the data key.")
def team_roles_confined(resources: list[StackResource], ctx: Context) -> Violations:
    datasets = {str(b.props.get("arn")) for b in of_type(resources, "aws:s3/bucket:Bucket")
                if (b.props.get("tags") or {}).get("purpose") == "datasets"}
    # A team stack has no buckets of its own: it reads the platform's through its StackReference.
    datasets |= {str(arns["datasets"]) for arns in (platform_outputs(r).get("bucket_arns") for r in _references(resources))
                 if isinstance(arns, dict) and "datasets" in arns}
    for role in of_type(resources, "aws:iam/role:Role"):
        team = (role.props.get("tags") or {}).get(contract.TAG_TEAM)
        if not team:
            continue
        own = contract.service_account_subject(contract.namespace_name(team), contract.TRAINING_SERVICE_ACCOUNT)
        for subject in _trusted_subjects(role.props.get("assumeRolePolicy")):
            if subject != own:
                yield (f"team {team!r}'s role can be assumed by {subject!r}. Fix: trust only {own}"), role.urn
        names = {role.props.get("name"), role.props.get("id"), role.name}

        def attached(resource: StackResource, names: set = names, role: StackResource = role) -> bool:
            return resource.props.get("role") in names or role.urn in resource.dependencies

        for attachment in of_type(resources, "aws:iam/rolePolicyAttachment:RolePolicyAttachment"):
            if attached(attachment):
                yield (f"team {team!r}'s role has the managed policy {attachment.props.get('policyArn')} attached. "
                       "Fix: detach it; a team's permissions are its inline storage policy (infra/teams.py)"), attachment.urn
        for policy in of_type(resources, "aws:iam/rolePolicy:RolePolicy"):
            if attached(policy):
                for statement in statements(policy_document(policy.props.get("policy"))):
                    for problem in _team_statement_problems(statement, team, datasets):
                        yield f"team {team!r}'s policy {policy.name} {problem}", policy.urn


def _references(resources: list[StackResource]) -> list[StackResource]:
    return of_type(resources, "pulumi:pulumi:StackReference")


def platform_outputs(reference: StackResource) -> Mapping[str, Any]:
    outputs = reference.props.get("outputs")
    return outputs if isinstance(outputs, Mapping) else {}


@stack_rule("A team stack's GPU quota fits the capacity its platform stack reports (its StackReference's gpu_capacity).")
def team_quota_within_platform_capacity(resources: list[StackResource], ctx: Context) -> Violations:
    capacity = next((platform_outputs(r).get("gpu_capacity") for r in _references(resources)
                     if isinstance(platform_outputs(r).get("gpu_capacity"), Mapping)), None)
    if capacity is None:
        return  # a platform stack: its own config check sums the cohort against its node groups
    for queue in of_type(resources, contract.pulumi_type(contract.KUEUE_API, "ClusterQueue")):
        for group in (queue.props.get("spec") or {}).get("resourceGroups") or []:
            for flavour in group.get("flavors") or []:
                gpus = next((r.get("nominalQuota") for r in flavour.get("resources") or [] if r.get("name") == contract.RESOURCE_GPU), None)
                have = capacity.get(flavour.get("name"), 0)
                if gpus is not None and float(gpus) > have:
                    yield (f"{queue.name} asks for {float(gpus):g} {flavour.get('name')} GPUs, but the platform's node groups reach at most {have}. "
                           f"Fix: lower the team's gpu_quota, or raise the platform's node groups first"), queue.urn
