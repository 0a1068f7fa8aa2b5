"""MLflow with authentication: every team signs in as its own user and sees only what it created.

The chart runs MLflow's basic-auth app (`auth.enabled`) with `defaultPermission: NO_PERMISSIONS`: an experiment (and
a registered model) belongs to the user who created it — MANAGE for its creator, nothing for anyone else — and an
anonymous request gets 401. Its users live in their own database (`mlflow_auth` on the stack's PostgreSQL, created
by a Job, closed to PUBLIC), so the tracking store's tables and the auth app's never meet.

Per team: a user `team-<team>` with a random password, kept in the Secret `trainforge-mlflow` in the team's namespace
(pods read it into MLFLOW_TRACKING_USERNAME / _PASSWORD; members may `get` it to use the UI and the API), and in the
MLflow namespace for the Job that creates the user, or resets its password to the Secret's, as the admin
(`trainforge.trainer.tracking_users`). Runs go to the team's experiments (`<team>/<experiment>`) and are found by job
and team: two teams' jobs of one name are two runs.
"""

from __future__ import annotations

import hashlib
from typing import Any

from trainforge import contract
from trainforge.platform.manifests import sweeps, tenancy
from trainforge.stackconfig import PlatformConfig, TeamConfig

AUTH_DATABASE = "mlflow_auth"
ADMIN_SECRET = "mlflow-admin"
ADMIN_USERNAME = "admin"
AUTH_SQL_CONFIG_MAP = "mlflow-auth-database"
DEFAULT_PERMISSION = "NO_PERMISSIONS"
USER_ENV = contract.MLFLOW_USER_ENV


def auth_database_sql() -> str:
    """Idempotent: the auth app's database created once, and no one but its owner (the master user) may connect."""
    return "\n".join([
        f"SELECT 'CREATE DATABASE {AUTH_DATABASE}' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{AUTH_DATABASE}')\\gexec",
        f"REVOKE ALL ON DATABASE {AUTH_DATABASE} FROM PUBLIC;",
    ]) + "\n"


def auth_database_objects(*, host: Any, master_secret: str) -> list[dict[str, Any]]:
    """The SQL and the Job that runs it (named by the SQL's hash), in the MLflow namespace."""
    sql = auth_database_sql()
    labels = {"app.kubernetes.io/name": "mlflow-auth-database", "app.kubernetes.io/part-of": "trainforge"}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": AUTH_SQL_CONFIG_MAP, "namespace": contract.NAMESPACE_MLFLOW, "labels": labels},
                  "data": {"auth.sql": sql}}
    digest = hashlib.sha256(sql.encode()).hexdigest()[:8]
    job = sweeps.psql_job(f"{AUTH_SQL_CONFIG_MAP}-{digest}", labels, host=host, master_secret=master_secret,
                          config_map=AUTH_SQL_CONFIG_MAP, script="auth.sql")
    return [config_map, job]


def container_defaults() -> dict[str, Any]:
    """Requests for the chart's containers that cannot be given any: its auth ini-file-initializer init container has
    no `resources` in chart 1.11.5, and a pod without requests is scheduled as if it cost nothing on the small system
    nodes. The API server fills them in from this LimitRange at admission."""
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "mlflow-container-defaults", "namespace": contract.NAMESPACE_MLFLOW},
            "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "50m", "memory": "64Mi"}}]}}


def admin_secret(password: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": ADMIN_SECRET, "namespace": contract.NAMESPACE_MLFLOW},
            "stringData": {"username": ADMIN_USERNAME, "password": password}}


def chart_auth(*, database_host: Any, database_secret: str) -> dict[str, Any]:
    """The chart's `auth` values: basic-auth, nobody sees what they did not create, users in their own database."""
    return {"enabled": True, "appName": "basic-auth", "defaultPermission": DEFAULT_PERMISSION,
            "existingAdminSecret": {"name": ADMIN_SECRET, "usernameKey": "username", "passwordKey": "password"},
            "postgres": {"enabled": True, "host": database_host, "port": contract.POSTGRES_PORT, "database": AUTH_DATABASE,
                         "driver": "psycopg2",
                         "existingSecret": {"name": database_secret, "usernameKey": "username", "passwordKey": "password"}}}


def _user_secret_name(team: TeamConfig) -> str:
    return f"trainforge-mlflow-user-{team.name}"


def team_objects(cfg: PlatformConfig, team: TeamConfig, *, password: Any, image: Any) -> list[dict[str, Any]]:
    """The team's credentials (its namespace, and the MLflow namespace for the Job) and the Job that makes the user."""
    labels = tenancy.cost_labels(team, cfg.environment)
    user = contract.mlflow_user(team.name)
    data = {contract.MLFLOW_USERNAME_KEY: user, contract.MLFLOW_PASSWORD_KEY: password}
    in_team = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
               "metadata": {"name": contract.MLFLOW_SECRET, "namespace": contract.namespace_name(team.name), "labels": labels},
               "stringData": dict(data)}
    for_job = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
               "metadata": {"name": _user_secret_name(team), "namespace": contract.NAMESPACE_MLFLOW, "labels": labels},
               "stringData": dict(data)}
    return [in_team, for_job, user_job(cfg, team, image)]


def user_job(cfg: PlatformConfig, team: TeamConfig, image: Any) -> dict[str, Any]:
    """Named by what it does: a changed command is a new Job, which `pulumi up` runs once; a re-run is harmless."""
    command = ["python", "-m", "trainforge.trainer.tracking_users"]
    digest = hashlib.sha256(" ".join(command + [team.name]).encode()).hexdigest()[:8]
    labels = tenancy.cost_labels(team, cfg.environment)

    def from_secret(name: str, key: str) -> dict[str, Any]:
        return {"secretKeyRef": {"name": name, "key": key}}
    env = [{"name": "MLFLOW_TRACKING_URI", "value": contract.MLFLOW_TRACKING_URI},
           {"name": USER_ENV["admin_username"], "valueFrom": from_secret(ADMIN_SECRET, "username")},
           {"name": USER_ENV["admin_password"], "valueFrom": from_secret(ADMIN_SECRET, "password")},
           {"name": USER_ENV["username"], "valueFrom": from_secret(_user_secret_name(team), contract.MLFLOW_USERNAME_KEY)},
           {"name": USER_ENV["password"], "valueFrom": from_secret(_user_secret_name(team), contract.MLFLOW_PASSWORD_KEY)}]
    container = {"name": "user", "image": image, "command": command, "env": env,
                 "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                 "securityContext": {"runAsNonRoot": True, "runAsUser": contract.RUNTIME_UID, "allowPrivilegeEscalation": False,
                                     "capabilities": {"drop": ["ALL"]}}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"{_user_secret_name(team)}-{digest}", "namespace": contract.NAMESPACE_MLFLOW, "labels": labels},
            "spec": {"backoffLimit": 6,
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"restartPolicy": "OnFailure",
                                           "nodeSelector": dict(contract.flavour_traits(contract.Flavour.SYSTEM).labels),
                                           "containers": [container]}}}}
