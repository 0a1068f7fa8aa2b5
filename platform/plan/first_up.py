"""The first `pulumi up` on a new account, modelled over the dependency graph the engine records.

The engine creates a resource once everything it depends on exists (its `depends_on`, the resources its inputs come
from, its provider) and runs the rest in parallel. A first `up` goes through only if, for every resource, what the
cluster needs at that moment is already there. Each rule below is one fact about EKS, Kubernetes, Helm or
pulumi-kubernetes, with where it is written down; `problems()` returns every place the program breaks one.

The model reads the program's own resources (an `Evaluation`) and, for each Helm release, the objects its chart
really renders with the program's values and the CRDs it installs (the caller renders them: tests/support/helm.py does,
through the vendored charts) — never a picture of either.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Iterable, Mapping

from pulumi.runtime import rpc

from trainforge import selectors
from trainforge.infra.engine import Evaluation, RegisteredResource
from trainforge.platform.manifests.crds import defined_kind

RELEASE = "kubernetes:helm.sh/v3:Release"
CACHE_RULE = "aws:ecr/pullThroughCacheRule:PullThroughCacheRule"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
# A CRD the program applies itself (platform/manifests/crds.py), whole or as a server-side patch.
CRD_TYPES = ("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition", "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinitionPatch")
KUBERNETES_PROVIDER = "pulumi:providers:kubernetes"
ACCESS_POLICY = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"
STORAGE_CLASS = "kubernetes:storage.k8s.io/v1:StorageClass"
EKS_ADDON = "aws:eks/addon:Addon"
IMAGE = "docker-build:index:Image"
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "Job", "ReplicaSet"}


@dataclass(frozen=True)
class Fact:
    rule: str
    source: str


FACTS = {
    "api-access": Fact(
        "With authentication mode API and no bootstrap admin, the API server answers the deployer only once its access "
        "entry and its cluster-admin policy association exist; before that every call is 401/403",
        "EKS user guide, 'Grant IAM users access to Kubernetes with EKS access entries' (access policies; "
        "bootstrapClusterCreatorAdminPermissions)"),
    "endpoint": Fact(
        "The deployer reaches the API server only through a public endpoint allowing its address: a private-only "
        "endpoint answers only inside the VPC, and this program creates that VPC",
        "EKS user guide, 'Cluster API server endpoint' (private access: 'from within the cluster's VPC')"),
    "crd": Fact(
        "An object of a custom kind is refused ('no matches for kind') until the CRD defining it exists; a Helm "
        "release installs its chart's crds/ before its templates, and a failed atomic release rolls back whole",
        "Kubernetes API concepts (custom resources are served once their CRD is established); Helm docs, 'Custom "
        "Resource Definitions' (crds/ directory); pulumi-kubernetes helm.v3.Release `atomic`"),
    "webhook": Fact(
        "An admission webhook with failurePolicy Fail rejects every request it matches while its service has no ready "
        "pod; a release is ready only when its pods are (pulumi waits), so a resource that neither comes after the "
        "webhook's release nor before it can be rejected",
        "Kubernetes docs, 'Dynamic Admission Control' (failurePolicy); Kueue 0.19.2 chart templates/webhook/manifests.yaml"),
    "image": Fact(
        "A pod whose image is not in the registry never becomes ready (ErrImagePull), and pulumi-kubernetes awaits "
        "Deployments, Jobs and releases until ready (~10 min, then the update fails). An image pulled through an ECR "
        "pull-through cache is fetched on its first pull only if the cache rule exists and the puller may import it and "
        "create its repository",
        "pulumi-kubernetes await logic (Deployment readiness, `pulumi.com/skipAwait`); Kubernetes docs, 'Images'; Amazon "
        "ECR user guide, 'Sync an upstream registry' (ecr:BatchImportUpstreamImage, ecr:CreateRepository)"),
    "storage-class": Fact(
        "A volume claim without a storageClassName binds only through the default StorageClass, and EKS >= 1.30 has "
        "none; a named class must exist, or the claim stays Pending and its pod never starts",
        "EKS user guide, Kubernetes 1.30 release notes (gp2 no longer default); Kubernetes docs, 'Persistent Volumes'"),
}

BUILTIN_PLURALS = {"Ingress": "ingresses", "NetworkPolicy": "networkpolicies", "PriorityClass": "priorityclasses",
                   "StorageClass": "storageclasses", "Endpoints": "endpoints"}


@dataclass(frozen=True)
class Problem:
    fact: str
    resource: str
    detail: str
    facts: ClassVar[dict[str, Fact]] = FACTS  # the model's rules the fact names one of (day_two.py has its own)

    def __str__(self) -> str:
        fact = self.facts[self.fact]
        return f"[{self.fact}] {self.resource}: {self.detail} (rule: {fact.rule}; source: {fact.source})"


def group_of(api_version: str) -> str:
    return api_version.split("/")[0] if "/" in api_version else ""


def is_builtin(group: str) -> bool:
    """Groups the API server serves itself: the core group, un-dotted groups (apps, batch) and *.k8s.io."""
    return "." not in group or group.endswith(".k8s.io")


def plural(kind: str) -> str:
    if kind in BUILTIN_PLURALS:
        return BUILTIN_PLURALS[kind]
    lower = kind.lower()
    return lower[:-1] + "ies" if lower.endswith("y") else lower + ("es" if lower.endswith("s") else "s")


def pod_templates(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods an object makes its controller create: Deployments, DaemonSets, Jobs... and a Pod itself."""
    if obj.get("kind") == "Pod":
        return [dict(obj)]
    if obj.get("kind") in WORKLOADS:
        template = (obj.get("spec") or {}).get("template") or {}
        return [{"apiVersion": "v1", "kind": "Pod", "metadata": {**(template.get("metadata") or {}),
                                                                 "namespace": obj["metadata"].get("namespace")},
                 "spec": template.get("spec") or {}}]
    return []


def volume_claims(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Claim specs an object makes: a PVC, a StatefulSet's templates, a Prometheus or Alertmanager's storage."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "PersistentVolumeClaim":
        return [spec]
    if obj.get("kind") == "StatefulSet":
        return [(t.get("spec") or {}) for t in spec.get("volumeClaimTemplates") or []]
    if obj.get("kind") in ("Prometheus", "Alertmanager"):
        template = ((spec.get("storage") or {}).get("volumeClaimTemplate") or {})
        return [template.get("spec") or {}] if template else []
    return []


class FirstUp:
    """The program's graph, with what each resource asks of the cluster."""

    def __init__(self, evaluation: Evaluation, rendered: Mapping[str, list[dict[str, Any]]], installs: Mapping[str, set[str]]):
        self.evaluation = evaluation
        self.rendered = rendered  # release name -> every object `helm install` creates, hooks included
        self.installs = installs  # release name -> "group/Kind" of each CRD it installs
        self._by_urn = {r.urn: r for r in evaluation.resources}
        self._ancestors: dict[str, frozenset[str]] = {}

    # ---- the graph -------------------------------------------------------------------------------------------
    def direct(self, resource: RegisteredResource) -> set[str]:
        deps = set(resource.dependencies)
        if resource.provider:
            deps.add(resource.provider.rsplit("::", 1)[0])  # a provider reference is "<urn>::<id>"
        return deps

    def ancestors(self, resource: RegisteredResource) -> frozenset[str]:
        """URNs the engine has finished creating before it starts `resource`."""
        if resource.urn in self._ancestors:
            return self._ancestors[resource.urn]
        out: set[str] = set()
        todo = list(self.direct(resource))
        while todo:
            urn = todo.pop()
            if urn in out:
                continue
            out.add(urn)
            other = self._by_urn.get(urn)
            if other is not None:
                if other.urn in self._ancestors:
                    out |= self._ancestors[other.urn]
                else:
                    todo += self.direct(other)
        self._ancestors[resource.urn] = frozenset(out)
        return self._ancestors[resource.urn]

    def before(self, first: RegisteredResource, then: RegisteredResource) -> bool:
        return first.urn in self.ancestors(then)

    @cached_property
    def releases(self) -> dict[str, RegisteredResource]:
        return {r.inputs["name"]: r for r in self.evaluation.of_type(RELEASE)}

    @cached_property
    def kubernetes_resources(self) -> list[RegisteredResource]:
        return [r for r in self.evaluation.resources if r.type.startswith("kubernetes:") and not r.type.startswith("kubernetes:kustomize")]

    def creates(self, resource: RegisteredResource) -> list[dict[str, Any]]:
        """The objects the API server receives for a resource: a release's rendered chart, or the object itself."""
        if resource.type == RELEASE:
            return self.rendered.get(resource.inputs["name"], [])
        return [_plain(resource.inputs)] if "metadata" in resource.inputs else []

    @cached_property
    def namespace_labels(self) -> dict[str, dict[str, str]]:
        out = {}
        for r in self.kubernetes_resources:
            for obj in self.creates(r):
                if obj.get("kind") == "Namespace":
                    name = obj["metadata"]["name"]
                    out[name] = selectors.namespace_labels(name, obj["metadata"].get("labels"))
        return out

    def labels_of_namespace(self, name: str) -> dict[str, str]:
        return self.namespace_labels.get(name) or selectors.namespace_labels(name)

    # ---- the facts -------------------------------------------------------------------------------------------
    def problems(self) -> list[Problem]:
        return [*self.api_access(), *self.endpoint(), *self.crds(), *self.webhooks(), *self.images(), *self.storage_classes()]

    def api_access(self) -> Iterable[Problem]:
        admins = self.evaluation.of_type(ACCESS_POLICY)
        for provider in self.evaluation.of_type(KUBERNETES_PROVIDER):
            missing = [a.name for a in admins if not self.before(a, provider)]
            if missing or not admins:
                yield Problem("api-access", provider.name, f"the Kubernetes provider does not wait for the admin access policies "
                                                           f"{missing or '(none registered)'}: its first calls can be refused")

    def endpoint(self) -> Iterable[Problem]:
        for cluster in self.evaluation.of_type("aws:eks/cluster:Cluster"):
            vpc = cluster.inputs.get("vpcConfig") or {}
            if not vpc.get("endpointPublicAccess"):
                yield Problem("endpoint", cluster.name, "the API endpoint is private only; the Kubernetes layer is applied from "
                                                        "where `pulumi up` runs, outside the VPC this program creates")
            elif not vpc.get("publicAccessCidrs"):
                yield Problem("endpoint", cluster.name, "the public endpoint names no allowed CIDRs (EKS then opens it to 0.0.0.0/0)")

    def crds(self) -> Iterable[Problem]:
        for resource in self.kubernetes_resources:
            own = self.installs.get(resource.inputs.get("name", ""), set()) if resource.type == RELEASE else set()
            for kind in sorted({f"{group_of(o['apiVersion'])}/{o['kind']}" for o in self.creates(resource)
                                if not is_builtin(group_of(o["apiVersion"]))}):
                if kind in own:
                    continue
                sources = [self.releases[n] for n, kinds in self.installs.items() if kind in kinds and n in self.releases]
                sources += self.program_crds.get(kind, [])
                if not sources:
                    yield Problem("crd", resource.name, f"creates a {kind} and neither a release nor the program installs its CRD")
                elif not any(self.before(s, resource) for s in sources):
                    yield Problem("crd", resource.name, f"creates a {kind} but is not ordered after "
                                                        f"{[s.inputs.get('name') or s.name for s in sources]}, which installs its CRD")

    @cached_property
    def program_crds(self) -> dict[str, list[RegisteredResource]]:
        """`group/Kind` -> the program's own resources that apply its CRD."""
        out: dict[str, list[RegisteredResource]] = {}
        for resource in self.kubernetes_resources:
            if resource.type in CRD_TYPES:
                out.setdefault(defined_kind(_plain(resource.inputs)), []).append(resource)
        return out

    def webhooks(self) -> Iterable[Problem]:
        for name, owner in self.releases.items():
            for config in self.rendered.get(name, []):
                if config.get("kind") not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                    continue
                for hook in config.get("webhooks") or []:
                    if hook.get("failurePolicy", "Fail") != "Fail":
                        continue
                    for resource in self.kubernetes_resources:
                        if resource is owner or self.before(owner, resource) or self.before(resource, owner):
                            continue
                        hit = next((o for o in self.creates(resource) for p in [o, *pod_templates(o)] if self._hooked(hook, p)), None)
                        if hit is not None:
                            yield Problem("webhook", resource.name,
                                          f"its {hit['kind']} {hit['metadata'].get('namespace', '')}/{hit['metadata'].get('name')} "
                                          f"is admitted by {name}'s webhook {hook['name']} (failurePolicy Fail), and nothing "
                                          f"orders the two")

    def _hooked(self, hook: Mapping[str, Any], obj: Mapping[str, Any]) -> bool:
        group, resource = group_of(obj.get("apiVersion", "v1")), plural(obj.get("kind", ""))
        namespace = obj["metadata"].get("namespace")
        if not any(("CREATE" in rule.get("operations", []) or "*" in rule.get("operations", []))
                   and (group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", []))
                   and (resource in rule.get("resources", []) or "*" in rule.get("resources", []))
                   for rule in hook.get("rules") or []):
            return False
        if namespace and not selectors.matches(hook.get("namespaceSelector", {}), self.labels_of_namespace(namespace)):
            return False
        return selectors.matches(hook.get("objectSelector", {}), obj["metadata"].get("labels"))

    def images(self) -> Iterable[Problem]:
        repositories = [r.state.get("repositoryUrl") for r in self.evaluation.of_type("aws:ecr/repository:Repository")]
        registries = {url.split("/")[0] for url in repositories if url}
        pushers = [r for r in self.evaluation.of_type(IMAGE) if r.inputs.get("push")]
        for resource in self.kubernetes_resources:
            for image in self.images_run_by(resource):
                if any(repo and image.startswith(f"{repo}:") or image.startswith(f"{repo}@") for repo in repositories):
                    pushed = [p for p in pushers if self.before(p, resource) and image.split("@")[0] in (p.inputs.get("tags") or [])]
                    if not pushed:
                        yield Problem("image", resource.name, f"runs {image}, which nothing the program creates before it pushes "
                                                              f"(the stack's repository is empty on a first up)")
                elif any(image.startswith(f"{host}/") for host in registries):
                    yield from self._pulled_through_cache(resource, image)

    def images_run_by(self, resource: RegisteredResource) -> set[str]:
        out = set()
        for obj in self.creates(resource):
            for pod in pod_templates(obj):
                out |= {str(c.get("image", "")) for c in [*(pod["spec"].get("initContainers") or []), *(pod["spec"].get("containers") or [])]}
            if obj.get("kind") in ("Prometheus", "Alertmanager") and (obj.get("spec") or {}).get("image"):
                out.add(str(obj["spec"]["image"]))  # the operator's StatefulSet runs the spec's image
        return out

    def _pulled_through_cache(self, resource: RegisteredResource, image: str) -> Iterable[Problem]:
        """An image of the stack's registry outside the program's repository: a first pull through a pull-through cache
        rule, which must exist, with the node role's right to import and create, before the pod pulls."""
        path = image.split("/", 1)[1]
        rules = [r for r in self.evaluation.of_type(CACHE_RULE) if path.startswith(f"{r.inputs.get('ecrRepositoryPrefix')}/")]
        rights = [p for p in self.evaluation.of_type(ROLE_POLICY) if "ecr:CreateRepository" in str(p.inputs.get("policy"))]
        if not rules:
            yield Problem("image", resource.name, f"runs {image}: in the stack's registry, but no repository of the program "
                                                  f"nor any pull-through cache rule serves it")
        elif not any(self.before(r, resource) for r in rules) or not any(self.before(p, resource) for p in rights):
            yield Problem("image", resource.name, f"pulls {image} through the cache before its rule "
                                                  f"({rules[0].inputs.get('ecrRepositoryPrefix')}) and the nodes' right to fill it exist")

    def storage_classes(self) -> Iterable[Problem]:
        classes = [r for r in self.evaluation.of_type(STORAGE_CLASS)]
        default = [c for c in classes if (c.inputs.get("metadata", {}).get("annotations") or {})
                   .get("storageclass.kubernetes.io/is-default-class") == "true"]
        for resource in self.kubernetes_resources:
            for obj in self.creates(resource):
                for claim in volume_claims(obj):
                    if claim.get("volumeName"):
                        continue  # bound statically to a named PersistentVolume: no class involved
                    wanted = claim.get("storageClassName")
                    candidates = default if wanted is None else [c for c in classes if c.inputs["metadata"]["name"] == wanted]
                    if not any(self.before(c, resource) for c in candidates):
                        what = "names no storage class and no default StorageClass" if wanted is None else f"names storage class {wanted!r}, which"
                        yield Problem("storage-class", resource.name, f"{obj['kind']} {obj['metadata'].get('name')}: claim {what} "
                                                                      "is created by the program before it")


def _plain(value: Any) -> Any:
    """Inputs as the provider sends them: secrets unwrapped."""
    if isinstance(value, dict):
        if value.get(rpc._special_sig_key) == rpc._special_secret_sig:
            return _plain(value["value"])
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def problems(evaluation: Evaluation, rendered: Mapping[str, list[dict[str, Any]]], installs: Mapping[str, set[str]]) -> list[Problem]:
    return FirstUp(evaluation, rendered, installs).problems()
