"""A Kubernetes API on loopback for tests: an HTTP server that speaks the API's JSON for the resources trainforge
uses, so the official `kubernetes` client is exercised over the wire exactly as against a cluster.

What it does as the API server does: bearer-token authentication (401 Status); authorisation (403 Status) either with
Kubernetes RBAC semantics over Role/ClusterRole/RoleBinding/ClusterRoleBinding objects for a token's identity (user and
groups: `identities` + `rbac`, see `Rbac`), or, for older tests, a per-token namespace allowlist (`tokens`); 404 as a Status for a missing object or namespace and as plain text for an API the server does not
serve, 409 on create of an existing name, `generateName`, label selectors (`k`, `k=v`, `k!=v`, comma = and), JSON
merge patches (RFC 7386; a strategic merge patch is treated as one, which is exact for the maps patched here), a JSON
patch must be a list (else 400, like the API server), DeleteOptions' propagationPolicy, pod logs as text.

What it leaves out (kept in mind by the tests): no watch, no resourceVersion conflicts, no admission or defaulting,
no controllers. Tests play the controllers: they set a job's conditions as Kueue and the Trainer would.

Considered instead: the `kmock` package (0.8). It is asyncio/aiohttp-based (the CLI runs in a subprocess and the
client is synchronous, so it would need its own loop thread), and its documented gaps — no label selectors, no
PUT — hit the pod listing by label and the selector on team ClusterQueues. A stand-in of our own is ~200 lines.
"""

from __future__ import annotations

import base64
import copy
import json
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

from trainforge import selectors

CORE = ("", "v1")
# (group, version, plural) -> (kind, namespaced)
SERVED: dict[tuple[str, str, str], tuple[str, bool]] = {
    ("", "v1", "configmaps"): ("ConfigMap", True),
    ("", "v1", "pods"): ("Pod", True),
    ("", "v1", "events"): ("Event", True),
    ("", "v1", "secrets"): ("Secret", True),  # Helm's release records (`trainforge platform verify`)
    ("apps", "v1", "deployments"): ("Deployment", True),
    ("apps", "v1", "daemonsets"): ("DaemonSet", True),
    ("trainer.kubeflow.org", "v1alpha1", "trainjobs"): ("TrainJob", True),
    ("kubeflow.org", "v1", "pytorchjobs"): ("PyTorchJob", True),
    ("kueue.x-k8s.io", "v1beta2", "clusterqueues"): ("ClusterQueue", False),
    ("kueue.x-k8s.io", "v1beta2", "localqueues"): ("LocalQueue", True),
    ("kueue.x-k8s.io", "v1beta2", "resourceflavors"): ("ResourceFlavor", False),
    ("", "v1", "namespaces"): ("Namespace", False),
    ("", "v1", "nodes"): ("Node", False),  # `platform verify` reads what each node's runtime can do
    ("", "v1", "resourcequotas"): ("ResourceQuota", True),
    ("", "v1", "limitranges"): ("LimitRange", True),
    ("", "v1", "serviceaccounts"): ("ServiceAccount", True),
    ("", "v1", "persistentvolumeclaims"): ("PersistentVolumeClaim", True),
    ("batch", "v1", "jobs"): ("Job", True),
    ("networking.k8s.io", "v1", "networkpolicies"): ("NetworkPolicy", True),
    ("rbac.authorization.k8s.io", "v1", "roles"): ("Role", True),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"): ("RoleBinding", True),
    ("rbac.authorization.k8s.io", "v1", "clusterroles"): ("ClusterRole", False),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings"): ("ClusterRoleBinding", False),
}
RBAC_KINDS = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}


ANNOTATIONS_MAX_BYTES = 256 * 1024  # the API server's limit on all of an object's annotations, keys and values together


def annotations_size(obj: dict[str, Any]) -> int:
    return sum(len(k.encode()) + len(str(v).encode()) for k, v in ((obj.get("metadata") or {}).get("annotations") or {}).items())


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def selected(labels: dict[str, str], selector: str | None) -> bool:
    for term in filter(None, (selector or "").split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value:
                return False
        elif term not in labels:
            return False
    return True


@dataclass(frozen=True)
class Identity:
    user: str
    groups: tuple[str, ...] = ()

    @property
    def all_groups(self) -> tuple[str, ...]:
        return (*self.groups, "system:authenticated")


def service_account(namespace: str, name: str) -> Identity:
    return Identity(f"system:serviceaccount:{namespace}:{name}", ("system:serviceaccounts", f"system:serviceaccounts:{namespace}"))


MASTERS = Identity("kubernetes-admin", ("system:masters",))

# The API server's bootstrap roles that trainforge's bindings can reach: cluster-admin (system:masters) and the
# aggregated `view` (its own rules live in system:aggregate-to-view; charts aggregate theirs by label). Rules as in
# kubernetes plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go (read-only; never Secrets).
_READ = ["get", "list", "watch"]
AGGREGATE_TO_VIEW = "rbac.authorization.k8s.io/aggregate-to-view"
BOOTSTRAP_ROLES: list[dict[str, Any]] = [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "cluster-admin"},
     "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "cluster-admin"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:masters"}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "view"},
     "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {AGGREGATE_TO_VIEW: "true"}}]}, "rules": []},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
     "metadata": {"name": "system:aggregate-to-view", "labels": {AGGREGATE_TO_VIEW: "true"}},
     "rules": [{"apiGroups": [""], "verbs": _READ, "resources": [
                   "configmaps", "endpoints", "persistentvolumeclaims", "persistentvolumeclaims/status", "pods", "replicationcontrollers",
                   "replicationcontrollers/scale", "serviceaccounts", "services", "services/status", "bindings", "events", "limitranges",
                   "namespaces/status", "pods/log", "pods/status", "replicationcontrollers/status", "resourcequotas",
                   "resourcequotas/status", "namespaces"]},
               {"apiGroups": ["apps"], "verbs": _READ, "resources": [
                   "controllerrevisions", "daemonsets", "daemonsets/status", "deployments", "deployments/scale", "deployments/status",
                   "replicasets", "replicasets/scale", "replicasets/status", "statefulsets", "statefulsets/scale", "statefulsets/status"]},
               {"apiGroups": ["batch"], "verbs": _READ, "resources": ["cronjobs", "cronjobs/status", "jobs", "jobs/status"]},
               {"apiGroups": ["policy"], "verbs": _READ, "resources": ["poddisruptionbudgets", "poddisruptionbudgets/status"]},
               {"apiGroups": ["networking.k8s.io"], "verbs": _READ, "resources": ["ingresses", "ingresses/status", "networkpolicies"]},
               {"apiGroups": ["discovery.k8s.io"], "verbs": _READ, "resources": ["endpointslices"]}]},
]


def _verb_matches(rule: dict[str, Any], verb: str) -> bool:
    return "*" in rule.get("verbs", []) or verb in rule.get("verbs", [])


def _resource_matches(rule: dict[str, Any], group: str, resource: str, subresource: str | None) -> bool:
    if not ("*" in rule.get("apiGroups", []) or group in rule.get("apiGroups", [])):
        return False
    wanted = f"{resource}/{subresource}" if subresource else resource
    names = rule.get("resources", [])
    return "*" in names or wanted in names or (subresource is not None and f"*/{subresource}" in names)


def _name_matches(rule: dict[str, Any], name: str | None) -> bool:
    names = rule.get("resourceNames") or []
    return not names or (name is not None and name in names)


class Rbac:
    """Kubernetes' RBAC authorizer (plugin/pkg/auth/authorizer/rbac) over a set of RBAC objects: a request is allowed
    when a ClusterRoleBinding, or a RoleBinding in the request's namespace, binds a subject the identity is (its user,
    one of its groups, or as the ServiceAccount it is) to a role with a rule matching the verb, API group, resource
    (and subresource) and, where the rule names any, the object's name. Aggregated ClusterRoles take the rules of every
    ClusterRole their selectors match. There are no deny rules: anything not granted is forbidden."""

    def __init__(self, objects: list[dict[str, Any]]):
        objects = [*BOOTSTRAP_ROLES, *objects]
        self.cluster_roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
        self.roles = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects if o["kind"] == "Role"}
        self.bindings = [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]

    def cluster_role_rules(self, name: str) -> list[dict[str, Any]]:
        role = self.cluster_roles.get(name)
        if role is None:
            return []
        rules = list(role.get("rules") or [])
        for selector in (role.get("aggregationRule") or {}).get("clusterRoleSelectors", []):
            for other in self.cluster_roles.values():
                labels = other["metadata"].get("labels") or {}
                if other is not role and all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
                    rules += other.get("rules") or []
        return rules

    @staticmethod
    def _subject_is(subject: dict[str, Any], who: Identity) -> bool:
        kind = subject.get("kind")
        if kind == "User":
            return subject["name"] == who.user
        if kind == "Group":
            return subject["name"] in who.all_groups
        if kind == "ServiceAccount":
            return who.user == f"system:serviceaccount:{subject.get('namespace')}:{subject['name']}"
        return False

    def rules_for(self, who: Identity, namespace: str | None) -> list[dict[str, Any]]:
        rules = []
        for binding in self.bindings:
            if not any(self._subject_is(s, who) for s in binding.get("subjects") or []):
                continue
            if binding["kind"] == "RoleBinding" and binding["metadata"].get("namespace") != namespace:
                continue
            ref = binding["roleRef"]
            if ref["kind"] == "ClusterRole":
                rules += self.cluster_role_rules(ref["name"])
            else:
                rules += (self.roles.get((binding["metadata"]["namespace"], ref["name"])) or {}).get("rules") or []
        return rules

    def allows(self, who: Identity, verb: str, group: str, resource: str, subresource: str | None, namespace: str | None,
               name: str | None) -> bool:
        return any(_verb_matches(r, verb) and _resource_matches(r, group, resource, subresource) and _name_matches(r, name)
                   for r in self.rules_for(who, namespace))


def verb_of(method: str, name: str | None, query: dict[str, str]) -> str:
    if method == "GET":
        return "get" if name else ("watch" if query.get("watch") in ("true", "1") else "list")
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]


@dataclass
class KubeApi:
    """The store and the rules; `serve()` puts it on a port."""

    namespaces: set[str] = field(default_factory=set)
    tokens: dict[str, set[str] | None] = field(default_factory=dict)  # token -> namespaces it may use (None: all)
    identities: dict[str, Identity] = field(default_factory=dict)  # token -> who (authorised by `rbac`)
    rbac: Rbac | None = None
    objects: dict[tuple, dict[str, Any]] = field(default_factory=dict)  # (group, version, plural, namespace, name) -> object
    pod_logs: dict[tuple[str, str], str] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    unserved: set[str] = field(default_factory=set)  # plurals this cluster lacks (an operator not installed)
    faults: dict[str, list[int]] = field(default_factory=dict)  # token -> the statuses its next requests get (an outage)
    # Called with each object just created, before the creator hears 201: a test plays what a controller does at once
    # (a trial that runs and reports before its creator records that it created it).
    on_create: Any = None
    # Called with (method, namespace, name) before a write is served, outside the store's lock: a test plays another
    # client's write landing between this client's read and its write.
    on_write: Any = None
    revision: int = 0  # the store's resourceVersion: each write through the API (and each put) takes the next
    # The service proxy (/api/v1/namespaces/<ns>/services/<name:port>/proxy/<path>): (ns, "name:port") ->
    # handler(path, query) -> (status, JSON body or text). Tests play Prometheus and MLflow behind it.
    proxies: dict[tuple[str, str], Any] = field(default_factory=dict)
    policies: Any = None  # admission_policies.AdmissionPolicies over the program's ValidatingAdmissionPolicies
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def holding(cls, manifests: list[dict[str, Any]], identities: dict[str, Identity]) -> KubeApi:
        """An API server holding these objects (those of kinds it serves), authorising `identities` by RBAC over the
        RBAC objects among them (plus the API server's bootstrap roles)."""
        from support.admission_policies import AdmissionPolicies
        api = cls(identities=dict(identities), rbac=Rbac([m for m in manifests if m.get("kind") in RBAC_KINDS]),
                  policies=AdmissionPolicies(manifests))
        served = {(f"{g}/{v}".lstrip("/"), kind) for (g, v, _), (kind, _) in SERVED.items()}
        for manifest in manifests:
            if (manifest.get("apiVersion"), manifest.get("kind")) in served:
                obj = copy.deepcopy(manifest)
                if obj["kind"] == "Secret" and "stringData" in obj:  # the API server stores stringData as base64 data
                    obj.setdefault("data", {}).update({k: base64.b64encode(str(v).encode()).decode() for k, v in obj.pop("stringData").items()})
                api.put(obj)
        return api

    # Test-side helpers (the tests play the controllers and the platform).
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        group, _, version = obj["apiVersion"].rpartition("/")
        plural = next(p for (g, v, p), (kind, _) in SERVED.items() if (g, v, kind) == (group, version, obj["kind"]))
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        with self.lock:
            meta.setdefault("resourceVersion", self.next_revision())
            self.objects[(group, version, plural, meta.get("namespace"), meta["name"])] = obj
            if obj["kind"] == "Namespace":
                self.namespaces.add(meta["name"])
        return obj

    def next_revision(self) -> str:
        """Opaque to clients, as the API server's: only equality means anything (optimistic concurrency)."""
        self.revision += 1
        return str(self.revision)

    def find(self, group: str, version: str, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.objects.get((group, version, plural, namespace, name))

    def admission_denials(self, operation: str, obj: dict[str, Any], group: str, version: str, plural: str) -> list:
        """What the program's admission policies say of a create or update (after authorisation, as in the server)."""
        if self.policies is None:
            return []
        namespace = obj.get("metadata", {}).get("namespace")
        ns = self.objects.get(("", "v1", "namespaces", None, namespace)) if namespace else None
        labels = selectors.namespace_labels(namespace, ns["metadata"].get("labels")) if ns is not None else None
        return self.policies.denials(operation, obj, group=group, version=version, plural=plural, namespace_labels=labels,
                                     param=lambda n, name: self.objects.get(("", "v1", "configmaps", n, name)))

    def of_kind(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """In the order they were created."""
        return [o for (g, v, p, ns, _), o in self.objects.items() if p == plural and (namespace is None or ns == namespace)]


def status(code: int, reason: str, message: str, details: dict | None = None) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason,
            "code": code, **({"details": details} if details else {})}


class Handler(BaseHTTPRequestHandler):
    api: KubeApi

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _request(self):
        """(group, version, plural, namespace, name, subresource, query) of a resource path, served or not; None else."""
        url = urlparse(self.path)
        parts = [p for p in url.path.split("/") if p]
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if rest[:1] == ["namespaces"] and len(rest) >= 3:  # (else: the namespace objects themselves)
            namespace, rest = rest[1], rest[2:]
        if not rest:
            return None
        return group, version, rest[0], namespace, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None, query

    def _route(self):
        """The request when this server serves its resource (or it is the service proxy); None: a plain-text 404."""
        request = self._request()
        if request is None:
            return None
        group, version, plural, _, _, sub, _ = request
        if plural == "services" and sub == "proxy":
            return request
        if (group, version, plural) not in SERVED or plural in self.api.unserved:
            return None
        return request

    def _attributes(self, method: str) -> tuple | None:
        """(verb, group, resource, subresource, namespace, name) of a resource request; None for a non-resource path."""
        request = self._request()
        if request is None:
            return None
        group, _, plural, namespace, name, sub, query = request
        return verb_of(method, name, query), group, plural, sub, namespace, name

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def _handle(self, method: str) -> None:
        api = self.api
        body = self._body()
        route = self._route()
        api.requests.append({"method": method, "path": self.path, "content_type": self.headers.get("Content-Type"), "body": body})
        token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if token not in api.tokens and token not in api.identities:
            return self._send(401, status(401, "Unauthorized", "Unauthorized"))
        with api.lock:
            fault = api.faults[token].pop(0) if api.faults.get(token) else None
        if fault is not None:  # an injected outage: a 5xx, a 429
            return self._send(fault, status(fault, "InternalError" if fault >= 500 else "TooManyRequests", "injected"))
        who = api.identities.get(token)
        if who is not None:  # the API server authorises before it looks for the resource or the object
            attributes = self._attributes(method)
            if attributes is not None and not api.rbac.allows(who, *attributes):
                verb, group, plural, sub, namespace, name = attributes
                resource = f"{plural}/{sub}" if sub else plural
                what = f'{resource} "{name}"' if name else resource
                where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
                return self._send(403, status(403, "Forbidden", f'{what} is forbidden: User "{who.user}" cannot {verb} resource '
                                              f'"{resource}" in API group "{group}"{where}', {"name": name, "kind": plural}))
        if route is None:
            return self._send(404, "404 page not found\n", "text/plain")
        if route[2] == "services" and route[5] == "proxy":
            return self._proxy(route, token)
        group, version, plural, namespace, name, sub, query = route
        kind, namespaced = SERVED[(group, version, plural)]
        allowed = api.tokens.get(token)
        if who is None and (namespaced and allowed is not None and namespace not in allowed
                            or not namespaced and allowed is not None and method != "GET"):
            where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
            return self._send(403, status(403, "Forbidden", f'{plural} is forbidden: User "tester" cannot {method.lower()} resource '
                                          f'"{plural}" in API group "{group}"{where}', {"kind": plural}))
        if namespaced and namespace is not None and namespace not in api.namespaces:
            return self._send(404, status(404, "NotFound", f'namespaces "{namespace}" not found', {"name": namespace, "kind": "namespaces"}))
        key = (group, version, plural, namespace, name)
        if method != "GET" and api.on_write is not None:
            api.on_write(method, namespace, name)
        with api.lock:
            found = api.objects.get(key)
            if method == "GET" and name is None:
                items = [o for (g, v, p, ns, _), o in api.objects.items() if (g, v, p) == (group, version, plural)
                         and (namespace is None or ns == namespace) and selected(o["metadata"].get("labels") or {}, query.get("labelSelector"))]
                return self._send(200, {"apiVersion": f"{group}/{version}".lstrip("/"), "kind": f"{kind}List", "metadata": {}, "items": items})
            if method == "POST" and name is None:
                meta = body.setdefault("metadata", {})
                if "name" not in meta and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                meta["namespace"] = namespace if namespaced else None
                key = (group, version, plural, namespace, meta["name"])
                if key in api.objects:
                    return self._send(409, status(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists',
                                                  {"name": meta["name"], "kind": plural}))
                denied = api.admission_denials("CREATE", body, group, version, plural)
                if denied:
                    return self._send(denied[0].status, status(denied[0].status, denied[0].reason, str(denied[0]), {"name": meta["name"], "kind": plural}))
                meta.update(uid=str(uuid.uuid4()), creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            resourceVersion=api.next_revision())
                if not namespaced:
                    meta.pop("namespace")
                api.objects[key] = body
                if api.on_create is not None:
                    api.on_create(body)
                return self._send(201, body)
            if found is None:
                return self._send(404, status(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural}))
            if method == "GET" and sub == "log":
                return self._send(200, api.pod_logs.get((namespace, name), ""), "text/plain")
            if method == "GET":
                return self._send(200, found)
            if method == "PATCH":
                content_type = self.headers.get("Content-Type", "")
                if content_type == "application/json-patch+json" and not isinstance(body, list):
                    return self._send(400, status(400, "BadRequest", "the body of the request was in an unknown format - "
                                                  "accepted media types include: application/json-patch+json"))
                if content_type not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                    return self._send(415, status(415, "UnsupportedMediaType", f"the stand-in takes merge patches, not {content_type}"))
                expected = ((body or {}).get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
                if expected is not None and expected != found["metadata"].get("resourceVersion"):
                    # A patch naming the version it was computed from is refused once another write has landed.
                    return self._send(409, status(409, "Conflict", f'Operation cannot be fulfilled on {plural}.{group} "{name}": the '
                                                  "object has been modified; please apply your changes to the latest version and try again",
                                                  {"name": name, "kind": plural}))
                patched = merge_patch(found, body)
                if annotations_size(patched) > ANNOTATIONS_MAX_BYTES:
                    return self._send(422, status(422, "Invalid", f'{plural}.{group} "{name}" is invalid: metadata.annotations: Too long: '
                                                  f"must have at most {ANNOTATIONS_MAX_BYTES} bytes", {"name": name, "kind": plural}))
                denied = api.admission_denials("UPDATE", patched, group, version, plural)
                if denied:
                    return self._send(denied[0].status, status(denied[0].status, denied[0].reason, str(denied[0]), {"name": name, "kind": plural}))
                patched["metadata"] = {**patched["metadata"], "resourceVersion": api.next_revision()}
                api.objects[key] = patched
                return self._send(200, api.objects[key])
            if method == "DELETE":
                del api.objects[key]
                return self._send(200, {**found, "metadata": {**found["metadata"], "deletionTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ")}})
        return self._send(405, status(405, "MethodNotAllowed", method))

    def _proxy(self, route, token: str) -> None:
        _, _, _, namespace, service, _, query = route
        if token in self.api.tokens and self.api.tokens[token] is not None and namespace not in self.api.tokens[token]:
            return self._send(403, status(403, "Forbidden", f'services "{service}" is forbidden: cannot get resource "services/proxy"'))
        handler = self.api.proxies.get((namespace, service))
        if handler is None:
            return self._send(503, status(503, "ServiceUnavailable", f'no endpoints available for service "{service}"'))
        path = "/" + urlparse(self.path).path.split("/proxy/", 1)[1]
        code, body = handler(path, query)
        return self._send(code, body, "application/json" if not isinstance(body, str) else "text/plain")

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PUT(self) -> None:
        self._handle("PUT")


@dataclass
class Served:
    api: KubeApi
    url: str
    server: ThreadingHTTPServer

    def kubeconfig(self, path: Path, token: str) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": token}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "tester"}}]}))
        return path

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def serve(api: KubeApi):
    handler = type("BoundHandler", (Handler,), {"api": api})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    served = Served(api, f"http://127.0.0.1:{server.server_address[1]}", server)
    try:
        yield served
    finally:
        try:
            served.stop()
        except OSError:
            pass


def running_jobs(api: KubeApi, namespace: str, execute):
    """The Job controller and a kubelet for the Jobs created in `namespace` while the block runs: each new Job gets a
    pod (labelled `job-name`, as the controller labels it) whose container `execute(job)` really runs, returning (exit
    code, output); the output becomes the pod's log and the exit code the Job's status (Complete, or Failed)."""
    from support.waiting import repeating

    def step() -> None:
        with api.lock:
            pending = [o for (g, _, p, ns, _), o in api.objects.items() if (g, p, ns) == ("batch", "jobs", namespace) and "status" not in o]
            for job in pending:
                job["status"] = {"active": 1}
        for job in pending:
            code, output = execute(job)
            name = job["metadata"]["name"]
            pod = f"{name}-{uuid.uuid4().hex[:5]}"
            api.put({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": namespace, "labels": {"job-name": name}},
                     "status": {"phase": "Succeeded" if code == 0 else "Failed"}})
            api.pod_logs[(namespace, pod)] = output
            job["status"] = ({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]} if code == 0 else
                             {"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]})
    return repeating(step, 0.1)


def container_env(api: KubeApi, namespace: str, container: dict[str, Any]) -> dict[str, str]:
    """A container's env as the kubelet resolves it: values, and secretKeyRefs from the Secrets the API holds."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in var.get("valueFrom", {}):
            ref = var["valueFrom"]["secretKeyRef"]
            secret = api.find("", "v1", "secrets", namespace, ref["name"])
            if secret is not None and ref["key"] in secret.get("data", {}):
                env[var["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
    return env
