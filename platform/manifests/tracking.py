"""MLflow with authentication: every team signs in as its own user and sees only what it created.

MLflow signs in to PostgreSQL as its own role (`mlflow_server`), never as the RDS master user: the master user belongs
to every team's sweep role (it created them), so a server running as master could read every team's studies. A Job
run as master (bootstrap only, `database_sql`) creates the role, hands it the tracking and auth databases and what is
in them (tables an earlier release created as master included), and closes `mlflow`, `mlflow_auth` and `postgres` to
PUBLIC, so a team's sweep role can connect to none of them (tests/test_databases.py runs the script on a real
PostgreSQL).

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
from typing import Any, Sequence

from trainforge import contract
from trainforge.platform.manifests import sweeps, tenancy
from trainforge.stackconfig import PlatformConfig, TeamConfig

AUTH_DATABASE = "mlflow_auth"
SERVER_ROLE = "mlflow_server"  # MLflow's own PostgreSQL role (the RDS master user is for bootstrap Jobs only)
SERVER_SECRET = "mlflow-server-database"  # its credentials, for the chart (tracking store, auth database, migrations)
ADMIN_SECRET = "mlflow-admin"
ADMIN_USERNAME = "admin"
DATABASE_SQL_CONFIG_MAP = "mlflow-databases"
PASSWORD_ENV = "MLFLOW_SERVER_PASSWORD"
# MLflow >= 3.5 starts a job runner beside the server (mlflow/server/__init__.py: seven Huey consumer processes, each a
# full MLflow import, ~200 MB apiece) unless this says false. Only server-side jobs and scorer invocation use it.
JOB_EXECUTION_ENV = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"
JOB_FEATURES = ("jobs", "scorers")
DEFAULT_PERMISSION = "NO_PERMISSIONS"
USER_ENV = contract.MLFLOW_USER_ENV
# Closed to PUBLIC: MLflow's two databases, and the RDS maintenance database (nobody but the master user needs it).
CLOSED_DATABASES = (contract.MLFLOW_DATABASE, AUTH_DATABASE, contract.POSTGRES_MAINTENANCE_DATABASE)


def server_env(features: Sequence[str]) -> dict[str, str]:
    """The server's environment beyond the chart's own keys: the features a stack turns on (trainer/mlflow_auth.py
    reads them), and MLflow's job runner off unless a feature that needs it is on."""
    env = {contract.MLFLOW_FEATURES_ENV: ",".join(features)} if features else {}
    return {**env, JOB_EXECUTION_ENV: "true" if set(features) & set(JOB_FEATURES) else "false"}


def _reown(database: str) -> list[str]:
    """In `database`: everything in `public` the master user created (an earlier release ran MLflow as master) becomes
    the server role's. Not REASSIGN OWNED: that would also hand over every database the master user owns."""
    role = SERVER_ROLE
    owned = ("FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
             "WHERE n.nspname = 'public' AND c.relowner = (SELECT oid FROM pg_roles WHERE rolname = current_user)")
    return [
        f"\\connect {database}",
        "DO $$DECLARE r record; BEGIN",
        # Tables and views (a table's own sequences follow it); then sequences no table owns; then enum types.
        f"  FOR r IN SELECT c.oid::regclass AS name {owned} AND c.relkind IN ('r', 'p', 'v', 'm', 'f') LOOP",
        f"    EXECUTE format('ALTER TABLE %s OWNER TO {role}', r.name); END LOOP;",
        f"  FOR r IN SELECT c.oid::regclass AS name {owned} AND c.relkind = 'S' AND NOT EXISTS (SELECT FROM pg_depend d "
        "WHERE d.objid = c.oid AND d.deptype IN ('a', 'i')) LOOP",
        f"    EXECUTE format('ALTER SEQUENCE %s OWNER TO {role}', r.name); END LOOP;",
        "  FOR r IN SELECT t.oid::regtype AS name FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace "
        "WHERE n.nspname = 'public' AND t.typtype = 'e' AND t.typowner = (SELECT oid FROM pg_roles WHERE rolname = current_user) LOOP",
        f"    EXECUTE format('ALTER TYPE %s OWNER TO {role}', r.name); END LOOP;",
        "END$$;",
    ]


def database_sql() -> str:
    """Idempotent, run as the master user: MLflow's role (its password (re)set from the Secret), its two databases
    and what is in them, and nobody else connecting to those or to `postgres`."""
    role, tracking_db = SERVER_ROLE, contract.MLFLOW_DATABASE
    return "\n".join([
        f"SELECT 'CREATE ROLE {role} LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}')\\gexec",
        f"ALTER ROLE {role} PASSWORD :'password';",
        f"GRANT {role} TO CURRENT_USER;",  # RDS: the master user may hand a database to a role it belongs to
        f"SELECT 'CREATE DATABASE {AUTH_DATABASE} OWNER {role}' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{AUTH_DATABASE}')\\gexec",
        f"ALTER DATABASE {tracking_db} OWNER TO {role};",
        f"ALTER DATABASE {AUTH_DATABASE} OWNER TO {role};",
        *(f"REVOKE ALL ON DATABASE {database} FROM PUBLIC;" for database in CLOSED_DATABASES),
        *_reown(tracking_db),
        *_reown(AUTH_DATABASE),
    ]) + "\n"


def server_secret(password: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": SERVER_SECRET, "namespace": contract.NAMESPACE_MLFLOW},
            "stringData": {"username": SERVER_ROLE, "password": password}}


def database_objects(*, host: Any, master_secret: str) -> list[dict[str, Any]]:
    """The SQL and the Job that runs it as the master user (named by the SQL's hash), in the MLflow namespace."""
    sql = database_sql()
    labels = {"app.kubernetes.io/name": DATABASE_SQL_CONFIG_MAP, "app.kubernetes.io/part-of": "trainforge"}
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": DATABASE_SQL_CONFIG_MAP, "namespace": contract.NAMESPACE_MLFLOW, "labels": labels},
                  "data": {"databases.sql": sql}}
    digest = hashlib.sha256(sql.encode()).hexdigest()[:8]
    password = {"name": PASSWORD_ENV, "valueFrom": {"secretKeyRef": {"name": SERVER_SECRET, "key": "password"}}}
    job = sweeps.psql_job(f"{DATABASE_SQL_CONFIG_MAP}-{digest}", labels, host=host, master_secret=master_secret,
                          config_map=DATABASE_SQL_CONFIG_MAP, script="databases.sql", env=[password],
                          variables=f'-v password="${PASSWORD_ENV}"')
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


def credential_check(features: Sequence[str]) -> str:
    """The chart's `auth.authorizationFunction`: trainforge-auth's (a password verified once per stored hash, not by
    scrypt on each of the several checks MLflow makes per request; trainer/mlflow_auth.py), unless the stack turns a
    server feature on. Then MLflow's own: the gateway's clients sign in through its X-MLflow-Authorization header, and
    the server's scorer and evaluation jobs with its internal gateway token, which only basic-auth's own check reads."""
    return contract.MLFLOW_BASIC_AUTH_FUNCTION if features else contract.MLFLOW_AUTH_FUNCTION


def chart_auth(*, database_host: Any, database_secret: str = SERVER_SECRET, features: Sequence[str] = ()) -> dict[str, Any]:
    """The chart's `auth` values: trainforge's auth app (basic-auth and the team boundary, trainer/mlflow_auth.py),
    nobody sees what they did not create, users in their own database, reached as MLflow's own role."""
    return {"enabled": True, "appName": contract.MLFLOW_AUTH_APP, "authorizationFunction": credential_check(features),
            "defaultPermission": DEFAULT_PERMISSION,
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

    env = [*_admin_env(),
           {"name": USER_ENV["username"], "valueFrom": _from_secret(_user_secret_name(team), contract.MLFLOW_USERNAME_KEY)},
           {"name": USER_ENV["password"], "valueFrom": _from_secret(_user_secret_name(team), contract.MLFLOW_PASSWORD_KEY)}]
    container = _admin_container("user", image, command, env)
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"{_user_secret_name(team)}-{digest}", "namespace": contract.NAMESPACE_MLFLOW, "labels": labels},
            "spec": {"backoffLimit": 6,
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"restartPolicy": "OnFailure",
                                           "nodeSelector": dict(contract.flavour_traits(contract.Flavour.SYSTEM).labels),
                                           "containers": [container]}}}}


def _from_secret(name: str, key: str) -> dict[str, Any]:
    return {"secretKeyRef": {"name": name, "key": key}}


def _admin_env() -> list[dict[str, Any]]:
    """The server by its in-cluster name and the admin's credentials, from the mlflow-admin Secret."""
    return [{"name": "MLFLOW_TRACKING_URI", "value": contract.MLFLOW_TRACKING_URI},
            {"name": USER_ENV["admin_username"], "valueFrom": _from_secret(ADMIN_SECRET, "username")},
            {"name": USER_ENV["admin_password"], "valueFrom": _from_secret(ADMIN_SECRET, "password")}]


def _admin_container(name: str, image: Any, command: list[str], env: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "image": image, "command": command, "env": env,
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
            "securityContext": {"runAsNonRoot": True, "runAsUser": contract.RUNTIME_UID, "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}}}


# The MLflow server's pods, as the chart labels them (tests/test_isolation.py checks the rendered Deployment's).
SERVER_POD_LABELS = {"app.kubernetes.io/name": "mlflow", "app.kubernetes.io/instance": "mlflow"}


def network_policies(cfg: PlatformConfig) -> list[dict[str, Any]]:
    """MLflow's namespace denies everything, then allows: anyone to the server's port (team pods, the Jobs here, the
    API server's service proxy), every pod here DNS and the stack's PostgreSQL (the server, the migration, the bootstrap
    Jobs), the Jobs here the server, and the server alone HTTPS out of the cluster (S3 for artifacts, STS for its
    IRSA role). So a request that makes the server fetch an address a user chose (a model source, a gateway endpoint)
    reaches no platform service: not Prometheus, Alertmanager, the operators or the API server."""
    def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": name, "namespace": contract.NAMESPACE_MLFLOW, "labels": {"app.kubernetes.io/part-of": "trainforge"}},
                "spec": spec}
    server = {"matchLabels": dict(SERVER_POD_LABELS)}
    server_port = [{"protocol": "TCP", "port": contract.MLFLOW_PORT}]
    return [
        policy("default-deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        policy("allow-server-in", {"podSelector": server, "policyTypes": ["Ingress"], "ingress": [{"ports": server_port}]}),
        policy("allow-dns-and-database", {"podSelector": {}, "policyTypes": ["Egress"],
                                          "egress": [tenancy.dns_egress(), sweeps.database_egress(cfg)]}),
        policy("allow-jobs-to-server", {"podSelector": {}, "policyTypes": ["Egress"],
                                        "egress": [{"to": [{"podSelector": server}], "ports": server_port}]}),
        policy("allow-server-object-store", {"podSelector": server, "policyTypes": ["Egress"],
                                             "egress": [tenancy.https_out_of_cluster(cfg)]}),
    ]


PROBE_JOB_PREFIX = "trainforge-verify-mlflow-"
PROBE_DEADLINE_S = 120  # the Job's own limit: an image pull on a fresh system node, the server's answer


def probe_job(name: str, image: str) -> dict[str, Any]:
    """`trainforge platform verify`'s MLflow check, as a Job in MLflow's namespace: from inside the cluster, by the
    service's in-cluster name, as the admin (the API server's service proxy can do neither: it strips the
    Authorization header and sends the pod's address as Host). One try, a deadline, and gone ten minutes after."""
    container = _admin_container("probe", image, ["python", "-m", "trainforge.trainer.tracking_users", "--probe"], _admin_env())
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": contract.NAMESPACE_MLFLOW, "labels": {"app.kubernetes.io/name": "trainforge-verify"}},
            "spec": {"backoffLimit": 0, "activeDeadlineSeconds": PROBE_DEADLINE_S, "ttlSecondsAfterFinished": 600,
                     "template": {"metadata": {"labels": {"app.kubernetes.io/name": "trainforge-verify"}},
                                  "spec": {"restartPolicy": "Never",
                                           "nodeSelector": dict(contract.flavour_traits(contract.Flavour.SYSTEM).labels),
                                           "containers": [container]}}}}
