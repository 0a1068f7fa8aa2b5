"""The cluster backend. Offline: the refusals that happen before any API call. With KUBECONFIG: the real thing."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
import yaml
from support.cli import run_cli
from support.repo import REPO


def cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli(*argv, env=env, timeout=120)


def test_kubernetes_submit_needs_the_stack_for_quota_and_budget():
    result = cli("submit", "examples/quickstart.yaml", "--backend", "kubernetes")
    assert result.returncode == 2 and "Fix: --stack stacks/Pulumi.<env>.yaml" in result.stderr


def test_without_a_kubeconfig_the_message_names_the_fix(tmp_path):
    result = cli("submit", "examples/quickstart.yaml", "--backend", "kubernetes", "--stack", "stacks/Pulumi.dev.yaml",
                 env={"KUBECONFIG": str(tmp_path / "none")})
    assert result.returncode == 2 and "no usable kubeconfig" in result.stderr and "Traceback" not in result.stderr


def test_a_job_over_the_team_budget_is_refused_before_anything_starts(tmp_path):
    result = cli("submit", "examples/llm-pretrain-efa.yaml", "--stack", "stacks/Pulumi.prod.yaml", "--spent", "249000",
                 env={"TRAINFORGE_HOME": str(tmp_path)})
    assert result.returncode == 3
    assert "team 'foundation' has $1,000.00 left of $250,000.00 this month" in result.stderr
    assert not (tmp_path / "jobs").exists(), "a refused job must leave nothing behind"


@pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="no cluster: set KUBECONFIG to a trainforge cluster "
                    "(Kubeflow Trainer v2, Kueue, a team namespace) to run this test")
@pytest.mark.parametrize("kind", ["trainjob", "pytorchjob"])
def test_submit_status_and_cancel_on_a_real_cluster(tmp_path, kind):
    stack = os.environ.get("TRAINFORGE_STACK", "stacks/Pulumi.dev.yaml")
    spec = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    spec["name"] = f"e2e-{kind}-{uuid.uuid4().hex[:6]}"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    created = cli("submit", str(path), "--backend", "kubernetes", "--kind", kind, "--stack", stack)
    assert created.returncode == 0, created.stderr
    try:
        status = cli("status", spec["name"], "--backend", "kubernetes", "--team", spec["team"], "--kind", kind, "-o", "json")
        assert status.returncode == 0, status.stderr
        json.loads(status.stdout)
    finally:
        cancelled = cli("cancel", spec["name"], "--backend", "kubernetes", "--team", spec["team"], "--kind", kind)
        assert cancelled.returncode == 0, cancelled.stderr
