"""The MLflow server's auth app on the platform: MLflow's basic-auth, plus the team boundary basic-auth does not draw.

The chart runs `mlflow server --app-name=trainforge-auth` (pyproject's `mlflow.app` entry point) on the runtime
image. `create_app` installs MLflow's own basic-auth app first (users, passwords, per-resource permissions, the
`NO_PERMISSIONS` default), then adds checks that run only on requests basic-auth already let through:

- **A model version's source must be readable by the caller, whatever fields are given.** basic-auth checks the source
  run only when `run_id` is present; a version whose `source` names another team's run artifacts without `run_id`
  would make the server (which reads every team's artifacts with its own role) hand them out through
  `model-versions/get-artifact`. Here the source itself is resolved: `runs:/<run>`, `models:/<logged model>`,
  `models:/<registered model>/<version>` or `mlflow-artifacts:/<experiment>/...`, each checked for READ; any other
  scheme, a `..` segment or an unknown run is refused.
- **Names are the team's.** Experiments are `<team>/<name>` and registered models (and prompts) `<team>.<name>`
  (MLflow refuses `/` in model names), at create and at rename: team A cannot squat `b/trainforge`, the experiment
  team B's runtime logs into by name.
- **Permissions go only to the caller's own team's users**: no granting another team EDIT on an experiment you squat.
  Roles (MLflow's RBAC) are the admin's.
- **What the platform does not use is off**: the AI gateway (its model definitions take any `api_base`, and
  `/gateway/proxy` then makes the server POST anywhere and return the answer: a request forgery into the cluster),
  the server-side jobs API and scorer invocation (they take another team's experiment id). A stack turns one on
  with `kubernetes.mlflow.server_features`, which reaches the server as TRAINFORGE_MLFLOW_FEATURES.

**A password is verified once per stored hash, not by scrypt at every check** (`authenticate_request`, the chart's
`auth.authorizationFunction`). MLflow calls its credential check several times per request (its own hook, the admin
test, this app's hook, a search's filter: four for an admin's experiment search), and basic-auth's runs scrypt each
time (~0.1 s of the server's CPU by design): 0.42 s per request here, 14 ms with this check
(benchmarks/bench_mlflow_auth.py; MLflow issue 9684). The user's row is still read at every check, and a verification
is remembered against the stored hash it matched: a password changed (a new hash, a new salt) through the API or in the
database, or a deleted user, misses at once, in every worker, as with basic-auth alone. MLflow's own cache
(`auth_cache_ttl_seconds`, off by default and not settable through the chart's ini template) would keep a credential
for its TTL in the workers that did not see the change. With a server feature on (`server_features`), the chart keeps
basic-auth's check (platform/manifests/tracking.py `credential_check`). The UI's change-password and logout
affordances show only under basic-auth's own check; team passwords are the platform's (each `up` resets them).

The admin (the platform's user-making Jobs) passes the team checks; the switched-off features are off for everyone.
Refusals are 403 with MLflow's error body, `PERMISSION_DENIED` and a message that says what to do instead.

This module reads basic-auth's permission lookups (`_get_experiment_permission`, the auth `store`): private names of
mlflow 3.15.1, the version the chart pins and the tests run (tests/test_tracking_auth.py attacks each rule there).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
from collections import OrderedDict
from typing import Any, Callable
from urllib.parse import unquote, urlparse

from trainforge import contract

FEATURES_ENV = contract.MLFLOW_FEATURES_ENV
FEATURES = contract.MLFLOW_SERVER_FEATURES  # what a stack may switch back on
# Paths of the switched-off features (after the /api/<v>.0 or /ajax-api/<v>.0 prefix, or at the root for FastAPI's).
_FEATURE_PATHS: dict[str, re.Pattern[str]] = {
    "gateway": re.compile(r"(^|/)gateway(/|$)"),
    "jobs": re.compile(r"(^|/)jobs(/|$)"),
    "scorers": re.compile(r"/scorer/invoke$|/scorers/online-configs?$"),
}
_API_PREFIX = re.compile(r"^.*?/(?:ajax-)?api/\d+\.\d+")


def enabled_features(environ: dict[str, str] | None = None) -> frozenset[str]:
    raw = (environ if environ is not None else os.environ).get(FEATURES_ENV, "")
    return frozenset(f.strip() for f in raw.split(",") if f.strip())


def refused_feature(path: str, enabled: frozenset[str]) -> str | None:
    """The switched-off feature `path` belongs to, if any."""
    for feature, pattern in _FEATURE_PATHS.items():
        if feature not in enabled and pattern.search(path):
            return feature
    return None


def endpoint(path: str) -> str:
    """`/api/2.0/mlflow/experiments/create` (behind any static prefix) -> `/mlflow/experiments/create`."""
    return _API_PREFIX.sub("", path, count=1)


def experiment_prefix(team: str) -> str:
    return f"{team}/"


def model_prefix(team: str) -> str:
    return f"{team}."


# ---- a model version's source -----------------------------------------------------------------------------

class SourceRefused(Exception):
    pass


def _segments(path: str) -> list[str]:
    decoded = unquote(path)
    parts = [p for p in decoded.replace("\\", "/").split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise SourceRefused(f"source {path!r} holds a '.' or '..' segment")
    return parts


def source_owner(source: str) -> tuple[str, str]:
    """What a model version's `source` reads from, as (kind, id): ("run", run id), ("experiment", id),
    ("logged_model", id) or ("registered_model", name). Anything else is refused."""
    parsed = urlparse(source)
    if parsed.scheme == "runs":
        parts = _segments(parsed.netloc + parsed.path)
        if parts:
            return "run", parts[0]
    elif parsed.scheme == "models":
        parts = _segments(parsed.netloc + parsed.path)
        if len(parts) == 1 and parts[0].startswith("m-"):
            return "logged_model", parts[0]
        if len(parts) >= 2:
            return "registered_model", parts[0]
    elif parsed.scheme == "mlflow-artifacts":
        parts = _segments(parsed.path)
        if parts[:1] == ["workspaces"]:
            parts = parts[2:]
        if parts and parts[0].isdigit():
            return "experiment", parts[0]
    raise SourceRefused(f"source {source!r} is not a run, a logged model or an experiment's artifacts on this server: "
                        "register from runs:/<run id>/<path>, models:/<model id> or the run's mlflow-artifacts:/ URI")


# ---- the app ----------------------------------------------------------------------------------------------

def _refusal(message: str):
    from flask import Response
    return Response(json.dumps({"error_code": "PERMISSION_DENIED", "message": message}), status=403,
                    mimetype="application/json")


def _body() -> dict[str, Any]:
    from flask import request
    body = request.get_json(force=True, silent=True) if request.method in ("POST", "PATCH", "PUT", "DELETE") else None
    return {**request.args.to_dict(), **(body if isinstance(body, dict) else {})}


class _Rules:
    """The team checks, over basic-auth's own lookups (imported once the server's auth app is set up)."""

    def __init__(self, auth: Any):
        self.auth = auth

    def can_read_experiment(self, experiment_id: str, username: str) -> bool:
        return self.auth._get_experiment_permission(str(experiment_id), username).can_read

    def can_read_source(self, source: str, username: str) -> str | None:
        """None when `username` may read what `source` names; else why not."""
        try:
            kind, ident = source_owner(source)
        except SourceRefused as e:
            return str(e)
        store = self.auth._get_tracking_store()
        try:
            if kind == "run":
                experiment = store.get_run(ident).info.experiment_id
            elif kind == "logged_model":
                experiment = store.get_logged_model(ident).experiment_id
            elif kind == "experiment":
                experiment = ident
            else:  # a registered model's version, copied: the model must be the caller's team's
                team = contract.team_of_mlflow_user(username)
                return None if team and ident.startswith(model_prefix(team)) else f"source {source!r}: registered model {ident!r} is not your team's"
        except Exception:  # noqa: BLE001 - an unknown run or model reads as nothing to read
            return f"source {source!r}: no such {kind.replace('_', ' ')} {ident!r}"
        if not self.can_read_experiment(experiment, username):
            return f"source {source!r} belongs to an experiment you cannot read"
        return None

    def check(self, path: str, method: str, username: str) -> str | None:
        """Why the request is refused (None: it goes on). `username` is a non-admin, authenticated by basic-auth."""
        team = contract.team_of_mlflow_user(username)
        where = endpoint(path)
        params = _body()
        if "/permissions/" in where or where.endswith("/permissions"):
            target = params.get("username")
            if method != "GET" and target is not None and contract.team_of_mlflow_user(str(target)) != team:
                return f"permissions may be given only to your own team's user ({contract.mlflow_user(team) if team else 'none'}), not {target!r}"
        if where.startswith("/mlflow/roles/") and method != "GET":
            return "roles are managed by the platform admin"
        if team is None:
            return None  # a user the platform did not make for a team: basic-auth's rules alone
        if method == "POST" and where == "/mlflow/experiments/create":
            return self._named(params.get("name"), experiment_prefix(team), "experiment")
        if method == "POST" and where == "/mlflow/experiments/update" and params.get("new_name") is not None:
            return self._named(params.get("new_name"), experiment_prefix(team), "experiment")
        if method == "POST" and where == "/mlflow/registered-models/create":
            return self._named(params.get("name"), model_prefix(team), "registered model")
        if method == "POST" and where == "/mlflow/registered-models/rename":
            return self._named(params.get("new_name"), model_prefix(team), "registered model")
        if method == "POST" and where == "/mlflow/model-versions/create":
            return self.can_read_source(str(params.get("source", "")), username)
        return None

    @staticmethod
    def _named(name: Any, prefix: str, what: str) -> str | None:
        if isinstance(name, str) and name.startswith(prefix) and len(name) > len(prefix):
            return None
        return f"{what} names start with your team's prefix {prefix!r} (got {name!r}): e.g. {prefix}my-{what.replace(' ', '-')}"


def _feature_refusal(path: str, enabled: frozenset[str]) -> str | None:
    feature = refused_feature(path, enabled)
    if feature is None:
        return None
    return (f"MLflow's {feature} API is turned off on this platform; a platform engineer turns it on with the stack's "
            f"kubernetes.mlflow.server_features: [{feature}]")


def _flask_hook(rules: _Rules, enabled: frozenset[str]) -> Callable[[], Any]:
    def trainforge_before_request():
        from flask import g, request
        if (why := _feature_refusal(request.path, enabled)) is not None:
            return _refusal(why)
        username = getattr(g, "mlflow_authenticated_user", None)
        if username is None or rules.auth.sender_is_admin():
            return None  # an unprotected route (basic-auth answered every other unauthenticated request), or the admin
        if (why := rules.check(request.path, request.method, username)) is not None:
            return _refusal(why)
        return None
    return trainforge_before_request


def _asgi_guard(fastapi_app: Any, enabled: frozenset[str]) -> None:
    """The same switched-off paths for routes FastAPI serves itself (the gateway proxy, the jobs router), which never
    reach Flask's hooks."""
    from starlette.responses import JSONResponse

    @fastapi_app.middleware("http")
    async def trainforge_features(request, call_next):
        if (why := _feature_refusal(request.url.path, enabled)) is not None:
            return JSONResponse({"error_code": "PERMISSION_DENIED", "message": why}, status_code=403)
        return await call_next(request)


class VerifiedCredentials:
    """Passwords this process has verified, each against the stored hash it matched. A key is (user, stored hash,
    HMAC of the password under a key drawn at start): no password is kept, and a digest is no use outside this
    process. Bounded, least recently used out first."""

    def __init__(self, size: int = 10_000):
        self._key = secrets.token_bytes(32)
        self._seen: OrderedDict[tuple[str, str, bytes], None] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()  # the WSGI app answers from a pool of threads

    def _entry(self, username: str, stored_hash: str, password: str) -> tuple[str, str, bytes]:
        return username, stored_hash, hmac.new(self._key, password.encode(), hashlib.sha256).digest()

    def matches(self, username: str, stored_hash: str, password: str, check: Callable[[str, str], bool]) -> bool:
        """Whether `password` is the one `stored_hash` was made from: `check(stored_hash, password)` the first time."""
        entry = self._entry(username, stored_hash, password)
        with self._lock:
            if entry in self._seen:
                self._seen.move_to_end(entry)
                return True
        if not check(stored_hash, password):  # outside the lock: other credentials verify meanwhile
            return False
        with self._lock:
            self._seen[entry] = None
            while len(self._seen) > self._size:
                self._seen.popitem(last=False)
        return True


_VERIFIED = VerifiedCredentials()


def authenticate_request() -> Any:
    """The chart's `auth.authorizationFunction`: basic-auth's `authenticate_request_basic_auth` (the request's
    Authorization, or the 401 that asks for one), with the user's stored hash read on every request and a password
    verified once per hash (VerifiedCredentials)."""
    from flask import request
    from mlflow.exceptions import MlflowException
    from mlflow.server import auth
    from werkzeug.security import check_password_hash

    credentials = request.authorization
    if credentials is None or credentials.username is None or credentials.password is None:
        return auth.make_basic_auth_response()
    try:
        user = auth.store.get_user(credentials.username)
    except MlflowException:  # no such user
        return auth.make_basic_auth_response()
    if _VERIFIED.matches(user.username, user.password_hash, credentials.password, check_password_hash):
        return credentials
    return auth.make_basic_auth_response()


def create_app(app: Any = None) -> Any:
    """The `mlflow.app` factory: basic-auth's app with the rules above. Unknown feature names stop the server."""
    from mlflow.server import app as flask_app
    from mlflow.server import auth

    enabled = enabled_features()
    unknown = sorted(enabled - set(FEATURES))
    if unknown:
        raise SystemExit(f"{FEATURES_ENV}: unknown feature(s) {unknown}; known: {list(FEATURES)}")
    flask_app = app or flask_app
    served = auth.create_app(flask_app)
    # Registered after basic-auth's own hook: Flask stops at the first hook that answers, so these run only on
    # requests basic-auth authenticated and authorised.
    flask_app.before_request(_flask_hook(_Rules(auth), enabled))
    if served is not flask_app:
        _asgi_guard(served, enabled)
    return served
