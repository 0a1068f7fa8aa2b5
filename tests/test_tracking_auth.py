"""MLflow as the stack deploys it: authenticated, each team its own user, no team reading or deleting another's runs.

A real MLflow server on loopback runs the auth app with the configuration the pinned chart renders from the program's
values (the `auth_template.ini` ConfigMap, its placeholders filled from the program's admin Secret as the chart's init
container does; the one change: `database_uri` points at SQLite instead of the RDS auth database). Each team's user is
made by running the program's per-team Job command with the env the Job resolves from the program's Secrets. Then two
real training jobs of the same name, one per team, log with their team's credentials.
"""

from __future__ import annotations

import base64
import configparser
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support.helm import rendered_program
from support.servers import mlflow_server
from support.evaluated import kubernetes_objects, manifest, typed_config
from support.lanes import stack_variants
from support.training import command

from trainforge import contract, run_tags
from trainforge.platform.manifests import tracking

pytestmark = pytest.mark.slow


def program_objects(evaluation) -> list[dict]:
    return [manifest(r) for r in kubernetes_objects(evaluation)]


def secret_value(objects, namespace: str, name: str, key: str) -> str:
    (secret,) = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == name and o["metadata"].get("namespace") == namespace]
    return secret["stringData"][key]


def job_env(objects, job: dict, uri: str) -> dict[str, str]:
    """The Job's container env as the kubelet resolves it (Secrets from the program), the server at `uri`."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secret_value(objects, job["metadata"]["namespace"], ref["name"], ref["key"])
    return {**env, "MLFLOW_TRACKING_URI": uri}


def call(uri: str, method: str, path: str, credentials: tuple[str, str] | None, body: dict | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if credentials:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(credentials).encode()).decode()
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(uri + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, {}


@pytest.fixture(scope="module", params=stack_variants())
def deployed_mlflow(request, evaluations, tmp_path_factory):
    """The server as the chart configures it, every team's user made by the program's Jobs; yields (uri, objects, cfg).
    One server per stack for the module: its tests use their own job names."""
    evaluation, cfg = evaluations(request.param), typed_config(request.param)
    tmp_path = tmp_path_factory.mktemp("mlflow-auth")
    objects = program_objects(evaluation)
    charts, _ = rendered_program(evaluation)
    (template,) = [o["data"]["auth_template.ini"] for o in charts["mlflow"] if o["kind"] == "ConfigMap" and "auth_template.ini" in o.get("data", {})]
    (deployment,) = [o for o in charts["mlflow"] if o["kind"] == "Deployment"]
    (server,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "mlflow"]
    assert "--app-name=basic-auth" in server["args"]
    admin = (secret_value(objects, contract.NAMESPACE_MLFLOW, tracking.ADMIN_SECRET, "username"),
             secret_value(objects, contract.NAMESPACE_MLFLOW, tracking.ADMIN_SECRET, "password"))
    ini = template.replace("$(ADMIN_USERNAME_PLACEHOLDER)", admin[0]).replace("$(ADMIN_PASSWORD_PLACEHOLDER)", admin[1])
    parsed = configparser.ConfigParser()
    parsed.read_string(ini)
    assert parsed["mlflow"]["default_permission"] == "NO_PERMISSIONS"
    assert parsed["mlflow"]["database_uri"].endswith(f"/{tracking.AUTH_DATABASE}")
    parsed["mlflow"]["database_uri"] = f"sqlite:///{tmp_path}/auth.db"
    with open(tmp_path / "basic_auth.ini", "w") as f:
        parsed.write(f)
    env = {"MLFLOW_AUTH_CONFIG_PATH": str(tmp_path / "basic_auth.ini"), "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-only-key"}
    with mlflow_server(tmp_path, env=env, app_name="basic-auth") as uri:
        jobs = [o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].startswith("trainforge-mlflow-user-")]
        assert len(jobs) == len(cfg.teams)
        for job in jobs:
            (container,) = job["spec"]["template"]["spec"]["containers"]
            for expected in ("created", "updated"):  # a re-run (a new `pulumi up`) resets the password to the Secret's
                done = subprocess.run([sys.executable if part == "python" else part for part in container["command"]],
                                      env={**os.environ, **job_env(objects, job, uri)}, capture_output=True, text=True, timeout=120)
                assert done.returncode == 0 and done.stdout.strip().endswith(expected), done.stdout + done.stderr
        yield uri, objects, cfg


def credentials(objects, team: str) -> tuple[str, str]:
    namespace = contract.namespace_name(team)
    return (secret_value(objects, namespace, contract.MLFLOW_SECRET, contract.MLFLOW_USERNAME_KEY),
            secret_value(objects, namespace, contract.MLFLOW_SECRET, contract.MLFLOW_PASSWORD_KEY))


def train(workdir: Path, uri: str, team: str, login: tuple[str, str], job: str) -> None:
    env = {**os.environ, "MLFLOW_TRACKING_USERNAME": login[0], "MLFLOW_TRACKING_PASSWORD": login[1]}
    workdir.mkdir(parents=True)
    done = subprocess.run(command(workdir, [f"job_id={job}", f"team={team}", f"tracking.uri={uri}", "max_steps=10", "warmup_steps=2", "log_every=5",
                                            "eval_every=10"], None), cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # A word of its own: a run id (hex) may hold the digits 403 (CI printed one).
    assert "unreachable" not in done.stderr and not re.search(r"\b403\b", done.stderr), done.stderr[-3000:]


def runs_of(uri: str, login: tuple[str, str], team: str, job: str) -> list[dict]:
    status, found = call(uri, "GET", f"/api/2.0/mlflow/experiments/get-by-name?experiment_name={run_tags.team_experiment(team, 'trainforge')}", login)
    assert status == 200, status
    status, runs = call(uri, "POST", "/api/2.0/mlflow/runs/search", login, {
        "experiment_ids": [found["experiment"]["experiment_id"]], "filter": f"tags.`{run_tags.JOB}` = '{job}'"})
    assert status == 200
    return runs.get("runs", [])


def test_teams_log_to_their_own_runs_and_cannot_read_or_delete_each_others(deployed_mlflow, tmp_path):
    uri, objects, cfg = deployed_mlflow
    a, b = cfg.teams[0].name, cfg.teams[1].name
    login_a, login_b = credentials(objects, a), credentials(objects, b)
    assert login_a[0] == contract.mlflow_user(a) and login_a[1] != login_b[1]
    train(tmp_path / a, uri, a, login_a, "shared")
    train(tmp_path / b, uri, b, login_b, "shared")
    (run_a,) = runs_of(uri, login_a, a, "shared")
    (run_b,) = runs_of(uri, login_b, b, "shared")
    assert run_a["info"]["run_id"] != run_b["info"]["run_id"], "two teams' jobs of one name are two runs"
    assert {t["key"]: t["value"] for t in run_b["data"]["tags"]}[run_tags.TEAM] == b
    assert any(m["key"] == "loss" for m in run_b["data"]["metrics"])
    b_run = run_b["info"]["run_id"]
    # Team a, with its own valid credentials, cannot see, read, change or delete team b's run or experiment.
    assert call(uri, "GET", f"/api/2.0/mlflow/runs/get?run_id={b_run}", login_a)[0] == 403
    assert call(uri, "POST", "/api/2.0/mlflow/runs/delete", login_a, {"run_id": b_run})[0] == 403
    assert call(uri, "POST", "/api/2.0/mlflow/runs/log-metric", login_a, {"run_id": b_run, "key": "loss", "value": 0.0, "timestamp": 0, "step": 0})[0] == 403
    status, listed = call(uri, "POST", "/api/2.0/mlflow/experiments/search", login_a, {"max_results": 100})
    assert status == 200 and {e["name"] for e in listed["experiments"]} == {run_tags.team_experiment(a, "trainforge")}
    # Nobody without credentials gets anything; a wrong password is no better.
    assert call(uri, "GET", f"/api/2.0/mlflow/runs/get?run_id={b_run}", None)[0] == 401
    assert call(uri, "GET", f"/api/2.0/mlflow/runs/get?run_id={b_run}", (login_b[0], "wrong"))[0] == 401
    # b's run is intact and b still reads it.
    status, still = call(uri, "GET", f"/api/2.0/mlflow/runs/get?run_id={b_run}", login_b)
    assert status == 200 and still["run"]["info"]["lifecycle_stage"] == "active"


def test_the_user_job_fails_clearly_on_wrong_admin_credentials(deployed_mlflow):
    uri, objects, cfg = deployed_mlflow
    job = next(o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].startswith("trainforge-mlflow-user-"))
    env = {**job_env(objects, job, uri), contract.MLFLOW_USER_ENV["admin_password"]: "not-the-admins-password"}
    done = subprocess.run([sys.executable, "-m", "trainforge.trainer.tracking_users"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "refused the admin's credentials (401)" in done.stderr and "Traceback" not in done.stderr
