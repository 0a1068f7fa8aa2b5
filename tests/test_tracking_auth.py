"""MLflow as the stack deploys it: authenticated, each team its own user, no team reading or deleting another's runs,
and team A, attacking with its own valid credentials, gets nothing of team B's.

A real MLflow server on loopback runs the auth app the pinned chart renders from the program's values (its
`--app-name`, its artifact flags, the env the chart passes, the `auth_template.ini` ConfigMap with its placeholders
filled from the program's admin Secret as the chart's init container does; the one change: `database_uri` points at
SQLite instead of the RDS auth database, and artifacts at a local directory instead of S3). Each team's user is made by
running the program's per-team Job command with the env the Job resolves from the program's Secrets. Then real training
jobs log with their team's credentials, and team A tries what basic-auth alone lets through (issue 37): a model
version whose source is B's run, B's experiment name squatted (with and without a grant to B), a grant to B's user,
the AI gateway's proxy, the server-side jobs API and scorer invocation.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support.helm import rendered_program
from support.servers import chart_auth_ini, mlflow_server
from support.evaluated import kubernetes_objects, manifest, typed_config
from support.lanes import stack_variants
from support import training
from support.cli import run_command

from trainforge import contract, run_tags
from trainforge.platform.manifests import tracking

# One worker holds the module, so its server (about 30 s to start and seed) is started once, not once per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("mlflow-auth")]


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


def exchange(uri: str, method: str, path: str, credentials: tuple[str, str] | None, data: bytes | None = None,
             content_type: str = "application/json", host: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": content_type, **({"Host": host} if host else {})}
    if credentials:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(credentials).encode()).decode()
    request = urllib.request.Request(uri + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def call(uri: str, method: str, path: str, credentials: tuple[str, str] | None, body: dict | None = None) -> tuple[int, dict]:
    """A JSON request; the answer's JSON (an error's too: MLflow's error_code and message), or {"text": ...}."""
    status, raw = exchange(uri, method, path, credentials, json.dumps(body).encode() if body is not None else None)
    try:
        return status, json.loads(raw or b"{}")
    except ValueError:
        return status, {"text": raw.decode(errors="replace")}


@pytest.fixture(scope="module", params=stack_variants())
def deployed_mlflow(request, evaluations, tmp_path_factory):
    """The server as the chart configures it, every team's user made by the program's Jobs; yields (uri, objects, cfg,
    the admin's credentials, the users' database).
    One server per stack for the module: its tests use their own job names."""
    evaluation, cfg = evaluations(request.param), typed_config(request.param)
    tmp_path = tmp_path_factory.mktemp("mlflow-auth")
    objects = program_objects(evaluation)
    charts, _ = rendered_program(evaluation)
    (deployment,) = [o for o in charts["mlflow"] if o["kind"] == "Deployment"]
    (server,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "mlflow"]
    (app_name,) = [a.split("=", 1)[1] for a in server["args"] if a.startswith("--app-name=")]
    assert app_name == contract.MLFLOW_AUTH_APP, "the team boundary is trainforge's auth app, not basic-auth's alone"
    assert "--serve-artifacts" in server["args"] and any(a.startswith("--artifacts-destination=s3://") for a in server["args"])
    rendered_env = {v["name"]: v["value"] for v in server.get("env", []) if "value" in v
                    and (v["name"].startswith("TRAINFORGE_") or v["name"] == tracking.JOB_EXECUTION_ENV)}
    assert rendered_env.get(tracking.JOB_EXECUTION_ENV) == "false", "no job runner beside a server whose jobs are off"
    # The chart's ConfigMap the server takes its env from: the Host allowlist (serverAllowedHosts) among it.
    (hosts,) = [o["data"]["MLFLOW_SERVER_ALLOWED_HOSTS"] for o in charts["mlflow"] if o["kind"] == "ConfigMap"
                and "MLFLOW_SERVER_ALLOWED_HOSTS" in o.get("data", {})]
    rendered_env["MLFLOW_SERVER_ALLOWED_HOSTS"] = hosts
    admin = (secret_value(objects, contract.NAMESPACE_MLFLOW, tracking.ADMIN_SECRET, "username"),
             secret_value(objects, contract.NAMESPACE_MLFLOW, tracking.ADMIN_SECRET, "password"))
    rendered, ini = chart_auth_ini(charts["mlflow"], admin, tmp_path)
    assert rendered["default_permission"] == "NO_PERMISSIONS"
    assert rendered["database_uri"].endswith(f"/{tracking.AUTH_DATABASE}")
    assert rendered["authorization_function"] == contract.MLFLOW_AUTH_FUNCTION
    env = {**rendered_env, "MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-only-key"}
    with mlflow_server(tmp_path, env=env, app_name=app_name, proxied_artifacts=True) as uri:
        jobs = [o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].startswith("trainforge-mlflow-user-")]
        assert len(jobs) == len(cfg.teams)
        for job in jobs:
            (container,) = job["spec"]["template"]["spec"]["containers"]
            for expected in ("created", "updated"):  # a re-run (a new `pulumi up`) resets the password to the Secret's
                done = run_command(container["command"], env={**os.environ, **job_env(objects, job, uri)}, timeout=120)
                assert done.returncode == 0 and done.stdout.strip().endswith(expected), done.stdout + done.stderr
        yield uri, objects, cfg, admin, tmp_path / "auth.db"


def credentials(objects, team: str) -> tuple[str, str]:
    namespace = contract.namespace_name(team)
    return (secret_value(objects, namespace, contract.MLFLOW_SECRET, contract.MLFLOW_USERNAME_KEY),
            secret_value(objects, namespace, contract.MLFLOW_SECRET, contract.MLFLOW_PASSWORD_KEY))


def train(workdir: Path, uri: str, team: str, login: tuple[str, str], job: str, experiment: str = "trainforge",
          expect: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_TRACKING_USERNAME": login[0], "MLFLOW_TRACKING_PASSWORD": login[1]}
    workdir.mkdir(parents=True)
    done = training.run(workdir, f"job_id={job}", f"team={team}", f"tracking.uri={uri}", f"tracking.experiment={experiment}",
                        "max_steps=10", "warmup_steps=2", "log_every=5", "eval_every=10", nproc=None, check=False, env=env)
    assert done.returncode == expect, done.stderr[-3000:]
    if expect:
        return done
    # What the MLflow client says of a refusal (a bare "403" also appears in timestamps, run ids and memory sizes).
    assert "unreachable" not in done.stderr and "PERMISSION_DENIED" not in done.stderr and "error code 403" not in done.stderr, \
        done.stderr[-3000:]
    return done


def runs_of(uri: str, login: tuple[str, str], team: str, job: str) -> list[dict]:
    status, found = call(uri, "GET", f"/api/2.0/mlflow/experiments/get-by-name?experiment_name={run_tags.team_experiment(team, 'trainforge')}", login)
    assert status == 200, status
    status, runs = call(uri, "POST", "/api/2.0/mlflow/runs/search", login, {
        "experiment_ids": [found["experiment"]["experiment_id"]], "filter": f"tags.`{run_tags.JOB}` = '{job}'"})
    assert status == 200
    return runs.get("runs", [])


def test_teams_log_to_their_own_runs_and_cannot_read_or_delete_each_others(deployed_mlflow, tmp_path):
    uri, objects, cfg, _, _ = deployed_mlflow
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
    uri, objects, cfg, _, _ = deployed_mlflow
    job = next(o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].startswith("trainforge-mlflow-user-"))
    env = {**job_env(objects, job, uri), contract.MLFLOW_USER_ENV["admin_password"]: "not-the-admins-password"}
    done = run_command(["python", "-m", "trainforge.trainer.tracking_users"], env={**os.environ, **env}, timeout=120)
    assert done.returncode == 1 and "refused the admin's credentials (401)" in done.stderr and "Traceback" not in done.stderr


# ---- team A attacks team B with its own valid credentials (issue 37) -------------------------------------------

def experiment(uri: str, login: tuple[str, str], name: str) -> str:
    status, made = call(uri, "POST", "/api/2.0/mlflow/experiments/create", login, {"name": name})
    assert status == 200, (status, made)
    return made["experiment_id"]


def run_with_artifact(uri: str, login: tuple[str, str], experiment_id: str, name: str, content: bytes) -> tuple[str, str]:
    """A run holding one file, uploaded through the server's artifact proxy as a client does; (run id, artifact URI)."""
    status, made = call(uri, "POST", "/api/2.0/mlflow/runs/create", login, {"experiment_id": experiment_id})
    assert status == 200, made
    info = made["run"]["info"]
    artifact_uri = info["artifact_uri"]
    assert artifact_uri.startswith("mlflow-artifacts:/"), "artifacts proxied by the server, as the chart runs it"
    path = artifact_uri.removeprefix("mlflow-artifacts:").lstrip("/")
    status, _ = exchange(uri, "PUT", f"/api/2.0/mlflow-artifacts/artifacts/{path}/{name}", login, content, "application/octet-stream")
    assert status == 200
    return info["run_id"], artifact_uri


def refused(answer: tuple[int, dict], why: str) -> bool:
    """403 with MLflow's error body whose message says `why` (the app's own refusal, not any other 403)."""
    status, body = answer
    return status == 403 and why in body.get("message", "")


def teams(deployed_mlflow):
    uri, objects, cfg, admin, _ = deployed_mlflow
    a, b = cfg.teams[0].name, cfg.teams[1].name
    return uri, admin, (a, credentials(objects, a)), (b, credentials(objects, b))


def test_a_model_version_cannot_point_at_another_teams_run(deployed_mlflow, tmp_path):
    """basic-auth checks the source run only when `run_id` is given; the server reads every team's artifacts with its
    own role. Every spelling of B's artifacts as a source is refused; A's own still registers and reads back."""
    uri, _, (a, login_a), (b, login_b) = teams(deployed_mlflow)
    b_run, b_artifacts = run_with_artifact(uri, login_b, experiment(uri, login_b, f"{b}/secret-work"), "weights.txt", b"B's weights")
    a_run, a_artifacts = run_with_artifact(uri, login_a, experiment(uri, login_a, f"{a}/own-work"), "weights.txt", b"A's weights")
    assert call(uri, "POST", "/api/2.0/mlflow/registered-models/create", login_a, {"name": f"{a}.stolen"})[0] == 200
    b_exp = b_artifacts.removeprefix("mlflow-artifacts:/").split("/")[0]
    a_exp = a_artifacts.removeprefix("mlflow-artifacts:/").split("/")[0]
    for source in (b_artifacts, f"mlflow-artifacts:/{b_exp}", f"runs:/{b_run}/", f"runs:/{b_run}/weights.txt",
                   f"mlflow-artifacts:/{a_exp}/../{b_exp}/{b_run}/artifacts", f"mlflow-artifacts:/{a_exp}/%2e%2e/{b_exp}/{b_run}/artifacts",
                   f"mlflow-artifacts://mlflow:5000/{b_exp}/{b_run}/artifacts", f"mlflow-artifacts:/workspaces/default/{b_exp}/{b_run}/artifacts",
                   f"s3://bucket/mlflow/{b_exp}/{b_run}/artifacts", f"file:///{tmp_path}", f"models:/{b}.model/1", "runs:/no-such-run/"):
        answer = call(uri, "POST", "/api/2.0/mlflow/model-versions/create", login_a, {"name": f"{a}.stolen", "source": source})
        assert answer[0] == 403 and "source" in answer[1].get("message", ""), (source, answer)
    # Nothing registered, so nothing of B's to read through A's model.
    assert call(uri, "GET", f"/model-versions/get-artifact?name={a}.stolen&version=1&path=weights.txt", login_a)[0] != 200
    # A's own run registers, and its file reads back through the version: the rule does not break the real use.
    made = call(uri, "POST", "/api/2.0/mlflow/model-versions/create", login_a, {"name": f"{a}.stolen", "source": a_artifacts, "run_id": a_run})
    assert made[0] == 200, made
    version = made[1]["model_version"]["version"]
    status, content = exchange(uri, "GET", f"/model-versions/get-artifact?name={a}.stolen&version={version}&path=weights.txt", login_a)
    assert (status, content) == (200, b"A's weights")
    # And B's file is still B's to read.
    path = b_artifacts.removeprefix("mlflow-artifacts:").lstrip("/")
    assert exchange(uri, "GET", f"/api/2.0/mlflow-artifacts/artifacts/{path}/weights.txt", login_b) == (200, b"B's weights")
    assert exchange(uri, "GET", f"/api/2.0/mlflow-artifacts/artifacts/{path}/weights.txt", login_a)[0] == 403


def test_names_are_the_teams_own_and_permissions_stay_inside_a_team(deployed_mlflow):
    uri, _, (a, login_a), (b, login_b) = teams(deployed_mlflow)
    for name in (f"{b}/trainforge", f"{b}/squat", "trainforge", f"{a}", f"{a}/", f"{a}-x/trainforge"):
        answer = call(uri, "POST", "/api/2.0/mlflow/experiments/create", login_a, {"name": name})
        assert refused(answer, "prefix"), (name, answer)
    mine = experiment(uri, login_a, f"{a}/to-rename")
    assert refused(call(uri, "POST", "/api/2.0/mlflow/experiments/update", login_a, {"experiment_id": mine, "new_name": f"{b}/trainforge"}), "prefix")
    assert call(uri, "POST", "/api/2.0/mlflow/experiments/update", login_a, {"experiment_id": mine, "new_name": f"{a}/renamed"})[0] == 200
    for name in (f"{b}.model", "model"):
        answer = call(uri, "POST", "/api/2.0/mlflow/registered-models/create", login_a, {"name": name})
        assert refused(answer, "prefix"), (name, answer)
    assert call(uri, "POST", "/api/2.0/mlflow/registered-models/create", login_a, {"name": f"{a}.to-rename"})[0] == 200
    assert refused(call(uri, "POST", "/api/2.0/mlflow/registered-models/rename", login_a, {"name": f"{a}.to-rename", "new_name": f"{b}.model"}), "prefix")
    # A grant to another team's user is refused: a shared experiment is how B's runs would reach A.
    grant = {"username": contract.mlflow_user(b), "resource_type": "experiment", "resource_id": mine, "permission": "EDIT"}
    assert refused(call(uri, "POST", "/api/3.0/mlflow/users/permissions/grant", login_a, grant), "your own team")
    status, seen = call(uri, "GET", f"/api/3.0/mlflow/users/permissions/get?username={contract.mlflow_user(b)}&resource_type=experiment&resource_id={mine}", login_b)
    assert status == 200 and seen["permission"] == "NO_PERMISSIONS", seen
    assert call(uri, "POST", "/api/3.0/mlflow/roles/create", login_a, {"name": "everyone", "workspace": "default"})[0] == 403


def test_a_squatted_or_blinding_experiment_fails_the_job_loudly_and_b_logs_nothing_into_it(deployed_mlflow, tmp_path):
    """What a server without the app (or an experiment from before it) would allow, made by the admin as a stand-in
    for the squatter: `<b>/captured` granted EDIT to B (B would log into A's experiment), `<b>/blinded` granted nothing
    (B's tracker would buffer for ever). B's job exits 2 naming the experiment and the fix; no run is created in it."""
    uri, admin, _, (b, login_b) = teams(deployed_mlflow)
    captured = experiment(uri, admin, f"{b}/captured")
    grant = {"username": contract.mlflow_user(b), "resource_type": "experiment", "resource_id": captured, "permission": "EDIT"}
    assert call(uri, "POST", "/api/3.0/mlflow/users/permissions/grant", admin, grant)[0] == 200
    experiment(uri, admin, f"{b}/blinded")
    for name in ("captured", "blinded"):
        done = train(tmp_path / name, uri, b, login_b, f"victim-{name}", experiment=name, expect=2)
        assert f"MLflow experiment '{b}/{name}'" in done.stderr and "Fix:" in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    status, runs = call(uri, "POST", "/api/2.0/mlflow/runs/search", admin, {"experiment_ids": [captured]})
    assert status == 200 and not runs.get("runs"), "B logged nothing into the experiment it does not own"


def test_the_gateway_jobs_and_scorer_endpoints_are_off_for_everyone(deployed_mlflow):
    """The gateway's model definitions take any `api_base` and /gateway/proxy then makes the server POST there (a
    request forgery into the cluster); jobs and scorer invocation accept another team's experiment. The platform uses
    none of them: refused for every user, the admin too, before anything is stored or called."""
    uri, admin, (a, login_a), _ = teams(deployed_mlflow)
    attempts = [("POST", "/api/3.0/mlflow/gateway/secrets/create", {"secret_name": "k", "secret_value": {"api_key": "x"}, "provider": "openai"}),
                ("POST", "/ajax-api/3.0/mlflow/gateway/model-definitions/create", {"name": "m", "provider": "openai", "model_name": "x"}),
                ("POST", "/api/3.0/mlflow/gateway/endpoints/create", {"name": "e"}),
                ("GET", "/api/3.0/mlflow/gateway/endpoints/list", None),
                ("POST", "/gateway/proxy/e/v1/anything", {"x": 1}),
                ("POST", "/gateway/mlflow/v1/chat/completions", {"model": "e"}),
                ("POST", "/ajax-api/3.0/jobs", {"job_name": "x", "params": {}}),
                ("GET", "/ajax-api/3.0/jobs/search", None),
                ("POST", "/ajax-api/3.0/mlflow/scorer/invoke", {"experiment_id": "1", "serialized_scorer": "{}"}),
                ("PUT", "/api/3.0/mlflow/scorers/online-config", {"experiment_id": "1"})]
    for login in (login_a, admin):
        for method, path, body in attempts:
            answer = call(uri, method, path, login, body)
            assert refused(answer, "turned off on this platform"), (login[0], method, path, answer)
    # What the platform does use still answers.
    assert call(uri, "POST", "/api/2.0/mlflow/experiments/search", login_a, {"max_results": 5})[0] == 200


def test_the_server_answers_the_names_people_reach_it_by_and_no_other(deployed_mlflow):
    """Through the rendered allowlist: the service's in-cluster names (jobs, the sweep controller, the budget view),
    `kubectl port-forward`'s local end on any port (the UI from a laptop), and nothing else: not another name, not a
    pod IP (serverAllowedHosts replaces MLflow's defaults, which admit every private address)."""
    uri, _, _, admin, _ = deployed_mlflow
    service, namespace, port = contract.MLFLOW_SERVICE_NAME, contract.NAMESPACE_MLFLOW, contract.MLFLOW_PORT
    answered = [f"{service}.{namespace}:{port}", f"{service}.{namespace}.svc.cluster.local:{port}", f"{service}:{port}",
                "localhost:8080", "localhost:5000", "127.0.0.1:15000", "localhost"]
    refused = ["mlflow.evil.example.com", f"{service}.{namespace}.evil.example.com:{port}", "10.0.3.7:5000", "172.20.0.1",
               "evil.localhost:5000"]
    path = "/api/2.0/mlflow/experiments/search?max_results=1"
    for host in answered:
        status, body = exchange(uri, "GET", path, admin, host=host)
        assert status == 200, (host, status, body[:200])
    for host in refused:
        status, body = exchange(uri, "GET", path, admin, host=host)
        assert status == 403 and b"Invalid Host header" in body, (host, status, body[:200])


def test_a_password_stops_working_the_moment_it_changes_or_its_user_goes_though_it_was_just_verified(deployed_mlflow):
    """The server verifies a password once per stored hash, not per request (trainer/mlflow_auth.py,
    authenticate_request): nothing it remembers outlives a change. A password changed through the API or in the users'
    database behind the server's back (another replica, a restore) and a deleted user are refused on the next request."""
    import sqlite3

    from werkzeug.security import generate_password_hash

    uri, _, _, admin, users = deployed_mlflow
    search = "/api/2.0/mlflow/experiments/search?max_results=1"
    first, second, third = "first-secret-Aa1" * 2, "second-secret-Bb2" * 2, "third-secret-Cc3" * 2
    assert call(uri, "POST", "/api/2.0/mlflow/users/create", admin, {"username": "rotating", "password": first})[0] == 200
    for _ in range(2):  # verified, then remembered
        assert call(uri, "GET", search, ("rotating", first))[0] == 200
    assert call(uri, "GET", search, ("rotating", first[:-1]))[0] == 401, "a wrong password beside a remembered one"
    assert call(uri, "GET", search, (admin[0], first))[0] == 401, "a remembered password under another user's name"
    # The artifact routes FastAPI serves itself reach the same check through MLflow's bridge.
    artifact = "/api/2.0/mlflow-artifacts/artifacts/0/probe.txt"
    assert exchange(uri, "GET", artifact, ("rotating", first[:-1]))[0] == 401
    assert exchange(uri, "PUT", artifact, ("rotating", "x"), b"x", "application/octet-stream")[0] == 401
    bearer = urllib.request.Request(uri + search, headers={"Authorization": "Bearer " + first})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(bearer, timeout=30)
    assert refused.value.code == 401, "only Basic credentials"

    assert call(uri, "PATCH", "/api/2.0/mlflow/users/update-password", admin, {"username": "rotating", "password": second})[0] == 200
    assert call(uri, "GET", search, ("rotating", first))[0] == 401, "the old password after a change through the API"
    assert call(uri, "GET", search, ("rotating", second))[0] == 200

    with sqlite3.connect(users) as db:  # as another replica's change or a restored backup reaches this one
        db.execute("UPDATE users SET password_hash = ? WHERE username = ?", (generate_password_hash(third), "rotating"))
    assert call(uri, "GET", search, ("rotating", second))[0] == 401, "the old password after a change in the database"
    assert call(uri, "GET", search, ("rotating", third))[0] == 200

    assert call(uri, "DELETE", "/api/2.0/mlflow/users/delete", admin, {"username": "rotating"})[0] == 200
    assert call(uri, "GET", search, ("rotating", third))[0] == 401, "a deleted user's remembered password"
