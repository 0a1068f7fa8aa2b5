"""The tracking server's auth app's pure rules (trainer/mlflow_auth.py) and how the chart is told to run it; the same
rules attacked on a real MLflow server: tests/test_tracking_auth.py."""

from __future__ import annotations

import pytest
from support.evaluated import typed_config
from support.repo import STACK_FILES

from trainforge import contract
from trainforge.platform.manifests import tracking, values
from trainforge.trainer import mlflow_auth


@pytest.mark.parametrize("source,owner", [
    ("runs:/abc123/model", ("run", "abc123")),
    ("runs:/abc123", ("run", "abc123")),
    ("models:/m-0123", ("logged_model", "m-0123")),
    ("models:/vision.model/3", ("registered_model", "vision.model")),
    ("mlflow-artifacts:/7/abc/artifacts/model", ("experiment", "7")),
    ("mlflow-artifacts://mlflow.mlflow:5000/7/abc/artifacts", ("experiment", "7")),
    ("mlflow-artifacts:/workspaces/default/7/abc/artifacts", ("experiment", "7")),
])
def test_a_sources_owner_is_what_it_reads_from(source, owner):
    assert mlflow_auth.source_owner(source) == owner


@pytest.mark.parametrize("source", [
    "s3://bucket/mlflow/7/abc/artifacts", "file:///etc", "/var/mlflow/7", "7/abc/artifacts", "",
    "mlflow-artifacts:/7/../8/abc/artifacts", "mlflow-artifacts:/7/%2e%2e/8/abc", "mlflow-artifacts:/7/..%2f8/abc",
    "mlflow-artifacts:/experiment/abc", "runs:/", "runs:/../abc", "models:/", "http://169.254.169.254/latest",
])
def test_any_other_source_is_refused(source):
    with pytest.raises(mlflow_auth.SourceRefused):
        mlflow_auth.source_owner(source)


@pytest.mark.parametrize("path,feature", [
    ("/gateway/proxy/e/v1/chat", "gateway"), ("/api/3.0/mlflow/gateway/secrets/create", "gateway"),
    ("/ajax-api/3.0/jobs", "jobs"), ("/ajax-api/3.0/jobs/search", "jobs"), ("/ajax-api/3.0/mlflow/jobs/abc", "jobs"),
    ("/api/3.0/mlflow/prompt-optimization/jobs", "jobs"), ("/ajax-api/3.0/mlflow/scorer/invoke", "scorers"),
    ("/api/3.0/mlflow/scorers/online-config", "scorers"), ("/static-prefix/api/3.0/mlflow/gateway/endpoints/list", "gateway"),
    ("/api/2.0/mlflow/experiments/create", None), ("/api/2.0/mlflow/runs/log-batch", None), ("/api/3.0/mlflow/scorers/list", None),
    ("/api/2.0/mlflow-artifacts/artifacts/1/jobsx/artifacts/gateway.txt", None),
])
def test_the_features_the_platform_keeps_off(path, feature):
    assert mlflow_auth.refused_feature(path, frozenset()) == feature
    assert mlflow_auth.refused_feature(path, frozenset(contract.MLFLOW_SERVER_FEATURES)) is None, "a stack may turn each on"


def test_team_users_and_the_admin():
    assert contract.team_of_mlflow_user(contract.mlflow_user("vision")) == "vision"
    assert contract.team_of_mlflow_user("admin") is None and contract.team_of_mlflow_user("team-") is None
    assert mlflow_auth.endpoint("/prefix/ajax-api/3.0/mlflow/users/permissions/grant") == "/mlflow/users/permissions/grant"


@pytest.mark.parametrize("ref,expected", [
    ("123.dkr.ecr.us-east-1.amazonaws.com/trainforge-prod-runtime:v0.1.0@sha256:" + "a" * 64,
     {"repository": "123.dkr.ecr.us-east-1.amazonaws.com/trainforge-prod-runtime", "tag": "v0.1.0", "digest": "sha256:" + "a" * 64}),
    ("registry.local:5000/team/runtime:v2", {"repository": "registry.local:5000/team/runtime", "tag": "v2"}),
    ("registry.local:5000/team/runtime@sha256:" + "b" * 64,
     {"repository": "registry.local:5000/team/runtime", "tag": "latest", "digest": "sha256:" + "b" * 64}),
])
def test_the_runtime_image_ref_becomes_the_charts_image_values(ref, expected):
    assert values.chart_image(ref) == expected


def test_a_stack_turns_a_feature_on_through_the_servers_environment():
    cfg = typed_config(next(p for p in STACK_FILES if p.name == "Pulumi.prod.yaml"))
    kwargs = dict(database_host="db", database_secret="s", artifacts_bucket="b", role_arn="arn", flask_secret_key="k",
                  image=values.chart_image("r.local/x:v1"))
    off = values.mlflow(cfg, **kwargs)
    assert off["extraEnvVars"] == {tracking.JOB_EXECUTION_ENV: "false"} and off["auth"]["appName"] == contract.MLFLOW_AUTH_APP
    assert off["image"] == off["initImages"]["mlflowDbMigration"] == {"repository": "r.local/x", "tag": "v1"}
    pinned = values.mlflow(cfg, **{**kwargs, "image": values.chart_image("r.local/x:v1@sha256:" + "c" * 64)})
    assert pinned["initImages"]["mlflowDbMigration"] == {"repository": "r.local/x", "tag": "v1@sha256:" + "c" * 64}, \
        "the migration runs the same pinned image (its values take no digest)"
    on = values.mlflow(cfg.model_copy(update={"kubernetes": cfg.kubernetes.model_copy(update={
        "mlflow": cfg.kubernetes.mlflow.model_copy(update={"server_features": ["gateway"]})})}), **kwargs)
    assert on["extraEnvVars"] == {contract.MLFLOW_FEATURES_ENV: "gateway", tracking.JOB_EXECUTION_ENV: "false"}
    assert mlflow_auth.enabled_features(on["extraEnvVars"]) == {"gateway"}
    scoring = values.mlflow(cfg.model_copy(update={"kubernetes": cfg.kubernetes.model_copy(update={
        "mlflow": cfg.kubernetes.mlflow.model_copy(update={"server_features": ["scorers"]})})}), **kwargs)
    assert scoring["extraEnvVars"][tracking.JOB_EXECUTION_ENV] == "true", "scorer invocation runs on MLflow's job runner"
    # The platform's credential check with every feature off; MLflow's own with one on (its gateway clients and its
    # server-side jobs sign in in ways only basic-auth's check reads: trainer/mlflow_auth.py).
    assert off["auth"]["authorizationFunction"] == contract.MLFLOW_AUTH_FUNCTION
    assert on["auth"]["authorizationFunction"] == scoring["auth"]["authorizationFunction"] == contract.MLFLOW_BASIC_AUTH_FUNCTION


def test_a_verified_password_is_checked_once_per_stored_hash_and_the_memory_is_bounded():
    """trainer/mlflow_auth.py VerifiedCredentials: the slow check (scrypt on the server) runs once per user, stored
    hash and password; a wrong password, another hash or another user runs it again; the least recently used goes first."""
    checked = []

    def check(stored_hash: str, password: str) -> bool:
        checked.append((stored_hash, password))
        return password == f"password-of-{stored_hash}"

    memory = mlflow_auth.VerifiedCredentials(size=2)
    for _ in range(3):
        assert memory.matches("a", "h1", "password-of-h1", check)
    assert checked == [("h1", "password-of-h1")]
    assert not memory.matches("a", "h1", "wrong", check) and not memory.matches("a", "h1", "wrong", check)
    assert not memory.matches("a", "h2", "password-of-h1", check), "the same password against a changed hash"
    assert memory.matches("b", "h1", "password-of-h1", check)  # another user: verified on its own
    assert len(checked) == 5
    memory.matches("a", "h1", "password-of-h1", check)  # remembered: a is now the most recently used
    assert len(checked) == 5
    assert memory.matches("c", "h3", "password-of-h3", check)  # a third entry: b, the least recently used, goes
    memory.matches("a", "h1", "password-of-h1", check)
    memory.matches("b", "h1", "password-of-h1", check)
    assert checked[5:] == [("h3", "password-of-h3"), ("h1", "password-of-h1")], "a kept, b checked again"
