"""A Kubernetes API on loopback for tests: an HTTP server that speaks the API's JSON for the resources trainforge
uses, so the official `kubernetes` client is exercised over the wire exactly as against a cluster.

What it does as the API server does: bearer-token authentication (401 Status), per-token namespace authorisation
(403 Status), 404 as a Status for a missing object or namespace and as plain text for an API the server does not
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
}


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


@dataclass
class KubeApi:
    """The store and the rules; `serve()` puts it on a port."""

    namespaces: set[str] = field(default_factory=set)
    tokens: dict[str, set[str] | None] = field(default_factory=dict)  # token -> namespaces it may use (None: all)
    objects: dict[tuple, dict[str, Any]] = field(default_factory=dict)  # (group, version, plural, namespace, name) -> object
    pod_logs: dict[tuple[str, str], str] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    unserved: set[str] = field(default_factory=set)  # plurals this cluster lacks (an operator not installed)
    # The service proxy (/api/v1/namespaces/<ns>/services/<name:port>/proxy/<path>): (ns, "name:port") ->
    # handler(path, query) -> (status, JSON body or text). Tests play Prometheus and MLflow behind it.
    proxies: dict[tuple[str, str], Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # Test-side helpers (the tests play the controllers and the platform).
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        group, _, version = obj["apiVersion"].rpartition("/")
        plural = next(p for (g, v, p), (kind, _) in SERVED.items() if (g, v, kind) == (group, version, obj["kind"]))
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        with self.lock:
            self.objects[(group, version, plural, meta.get("namespace"), meta["name"])] = obj
        return obj

    def find(self, group: str, version: str, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.objects.get((group, version, plural, namespace, name))

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

    def _route(self):
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
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        if not rest:
            return None
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
        if plural == "services" and sub == "proxy":
            return group, version, plural, namespace, name, sub, query
        if (group, version, plural) not in SERVED or plural in self.api.unserved:
            return None
        return group, version, plural, namespace, name, sub, query

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def _handle(self, method: str) -> None:
        api = self.api
        body = self._body()
        route = self._route()
        api.requests.append({"method": method, "path": self.path, "content_type": self.headers.get("Content-Type"), "body": body})
        token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if token not in api.tokens:
            return self._send(401, status(401, "Unauthorized", "Unauthorized"))
        if route is None:
            return self._send(404, "404 page not found\n", "text/plain")
        if route[2] == "services" and route[5] == "proxy":
            return self._proxy(route, token)
        group, version, plural, namespace, name, sub, query = route
        kind, namespaced = SERVED[(group, version, plural)]
        allowed = api.tokens[token]
        if namespaced and allowed is not None and namespace not in allowed or not namespaced and allowed is not None and method != "GET":
            where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
            return self._send(403, status(403, "Forbidden", f'{plural} is forbidden: User "tester" cannot {method.lower()} resource '
                                          f'"{plural}" in API group "{group}"{where}', {"kind": plural}))
        if namespaced and namespace is not None and namespace not in api.namespaces:
            return self._send(404, status(404, "NotFound", f'namespaces "{namespace}" not found', {"name": namespace, "kind": "namespaces"}))
        key = (group, version, plural, namespace, name)
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
                meta.update(uid=str(uuid.uuid4()), creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                if not namespaced:
                    meta.pop("namespace")
                api.objects[key] = body
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
                api.objects[key] = merge_patch(found, body)
                return self._send(200, api.objects[key])
            if method == "DELETE":
                del api.objects[key]
                return self._send(200, {**found, "metadata": {**found["metadata"], "deletionTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ")}})
        return self._send(405, status(405, "MethodNotAllowed", method))

    def _proxy(self, route, token: str) -> None:
        _, _, _, namespace, service, _, query = route
        if self.api.tokens[token] is not None and namespace not in self.api.tokens[token]:
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
