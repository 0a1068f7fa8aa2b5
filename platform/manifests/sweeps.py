"""Sweeps on the cluster: one Optuna database per team on the platform's PostgreSQL (the MLflow RDS instance),
owned by a role of that team's own, so one team's trials cannot read or write another's studies.

A Job in the MLflow namespace (it already holds the master credentials) creates or updates the roles and databases,
idempotently; each team gets a Secret with its storage URL (trial pods mount it as a file, contract.SWEEP_STORAGE_DIR, so no
password is in a TrainJob) and a NetworkPolicy letting its pods reach PostgreSQL inside the VPC.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

from trainforge import contract
from trainforge.platform.manifests import tenancy
from trainforge.stackconfig import PlatformConfig, TeamConfig

PSQL_IMAGE = "public.ecr.aws/docker/library/postgres:16-alpine"
PASSWORD_ENV = "SWEEPS_PASSWORD"


def _labels(cfg: PlatformConfig, team: TeamConfig) -> dict[str, str]:
    return {"app.kubernetes.io/name": "trainforge-sweeps", "app.kubernetes.io/part-of": "trainforge", **tenancy.cost_labels(team, cfg.environment)}


def _name(team: TeamConfig) -> str:
    return f"trainforge-sweeps-{team.name}"


def sql(team: TeamConfig) -> str:
    """Idempotent: the role created once and its password (re)set, the database created once and closed to others."""
    database, role = contract.sweep_database(team.name)
    return "\n".join([
        f"SELECT 'CREATE ROLE {role} LOGIN' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}')\\gexec",
        f"ALTER ROLE {role} PASSWORD :'password';",
        f"GRANT {role} TO CURRENT_USER;",  # RDS: the master user may create a database owned by a role it belongs to
        f"SELECT 'CREATE DATABASE {database} OWNER {role}' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '{database}')\\gexec",
        f"REVOKE ALL ON DATABASE {database} FROM PUBLIC;",
    ]) + "\n"


def sql_config_map(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": _name(team), "namespace": contract.NAMESPACE_MLFLOW, "labels": _labels(cfg, team)},
            "data": {"sweeps.sql": sql(team)}}


def password_secret(cfg: PlatformConfig, team: TeamConfig, password: Any) -> dict[str, Any]:
    """The role's password, beside the master credentials in the MLflow namespace, for the Job."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": _name(team), "namespace": contract.NAMESPACE_MLFLOW, "labels": _labels(cfg, team)},
            "stringData": {"password": password}}


def database_job(cfg: PlatformConfig, team: TeamConfig, *, host: Any, master_secret: str) -> dict[str, Any]:
    """Named by its SQL's hash: changed SQL is a new Job, which `pulumi up` runs once."""
    digest = hashlib.sha256(sql(team).encode()).hexdigest()[:8]
    password = {"name": PASSWORD_ENV, "valueFrom": {"secretKeyRef": {"name": _name(team), "key": "password"}}}
    return psql_job(f"{_name(team)}-{digest}", _labels(cfg, team), host=host, master_secret=master_secret, config_map=_name(team),
                    script="sweeps.sql", env=[password], variables=f'-v password="${PASSWORD_ENV}"')


def psql_job(name: str, labels: dict[str, str], *, host: Any, master_secret: str, config_map: str, script: str,
             env: Sequence[dict[str, Any]] = (), variables: str = "") -> dict[str, Any]:
    """A Job in the MLflow namespace running one SQL script from a ConfigMap as the master user (bootstrap only)."""
    # The maintenance database, which the master user owns: MLflow's own is its role's, and closed to others.
    master = [{"name": "PGHOST", "value": host}, {"name": "PGPORT", "value": str(contract.POSTGRES_PORT)}, {"name": "PGDATABASE", "value": contract.POSTGRES_MAINTENANCE_DATABASE},
              {"name": "PGSSLMODE", "value": "require"},
              {"name": "PGUSER", "valueFrom": {"secretKeyRef": {"name": master_secret, "key": "username"}}},
              {"name": "PGPASSWORD", "valueFrom": {"secretKeyRef": {"name": master_secret, "key": "password"}}}]
    container = {"name": "psql", "image": PSQL_IMAGE,
                 "command": ["sh", "-c", f'psql -v ON_ERROR_STOP=1 {variables} -f /sql/{script}'.replace("  ", " ")],
                 "env": [*master, *env], "volumeMounts": [{"name": "sql", "mountPath": "/sql", "readOnly": True}],
                 "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                 "securityContext": {"runAsNonRoot": True, "runAsUser": 70, "allowPrivilegeEscalation": False,
                                     "capabilities": {"drop": ["ALL"]}}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": contract.NAMESPACE_MLFLOW, "labels": labels},
            "spec": {"backoffLimit": 6, "ttlSecondsAfterFinished": 86400,
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"restartPolicy": "OnFailure", "nodeSelector": dict(contract.flavour_traits(contract.Flavour.SYSTEM).labels),
                                           "containers": [container],
                                           "volumes": [{"name": "sql", "configMap": {"name": config_map}}]}}}}


def storage_url(team: str, host: str, password: str) -> str:
    database, role = contract.sweep_database(team)
    return f"postgresql+psycopg2://{role}:{password}@{host}:{contract.POSTGRES_PORT}/{database}?sslmode=require"


def team_secret(cfg: PlatformConfig, team: TeamConfig, storage: Any) -> dict[str, Any]:
    meta = {"name": contract.SWEEP_STORAGE_SECRET, "namespace": contract.namespace_name(team.name),
            "labels": tenancy.cost_labels(team, cfg.environment)}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta, "stringData": {contract.SWEEP_STORAGE_KEY: storage}}


def team_network_policy(cfg: PlatformConfig, team: TeamConfig) -> dict[str, Any]:
    """Trial pods report to PostgreSQL: egress to its port inside the VPC (the RDS security group admits the nodes)."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "allow-sweep-database", "namespace": contract.namespace_name(team.name),
                         "labels": tenancy.cost_labels(team, cfg.environment)},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [database_egress(cfg)]}}


def database_egress(cfg: PlatformConfig) -> dict[str, Any]:
    """An egress rule to the stack's PostgreSQL: its port inside the VPC (RDS picks the address; its security group
    admits the nodes)."""
    return {"to": [{"ipBlock": {"cidr": str(cfg.network.vpc_cidr)}}], "ports": [{"protocol": "TCP", "port": contract.POSTGRES_PORT}]}


def team_sweep_objects(cfg: PlatformConfig, team: TeamConfig, *, host: Any, password: Any, storage: Any, master_secret: str) -> list[dict[str, Any]]:
    """In the MLflow namespace: the SQL, the role's password and the Job; in the team's: its storage URL and the egress."""
    return [sql_config_map(cfg, team), password_secret(cfg, team, password), database_job(cfg, team, host=host, master_secret=master_secret),
            team_secret(cfg, team, storage), team_network_policy(cfg, team)]
