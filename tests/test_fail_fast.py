"""A bad job spec fails before anything starts: `check`, `render` and `submit` exit 2 naming the field and the fix,
nothing is created, and torch is never imported. An error only the worker can find reaches `submit` and `status`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from support.repo import REPO

QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
HEAVY = ("torch", "pulumi", "pulumi_aws", "mlflow")

BAD_SPECS = {
    "a hyperparameter of the wrong type": ({"hyperparameters": {"lr": "fast"}}, "hyperparameters.lr", "Fix: a number"),
    "a misspelt run-config field": ({"hyperparameters": {"max_stepz": 100}}, "hyperparameters.max_stepz", "correct the spelling"),
    "an unknown bundled task": ({"entry": {"task": "char-lm"}}, "entry.task", "bundled tasks ['char_lm', 'classifier']"),
    "an unknown precision": ({"hyperparameters": {"precision": "fp7"}}, "hyperparameters.precision", "'fp32', 'bf16' or 'fp16'"),
    "an argument the task does not take": ({"entry": {"task": "char_lm", "args": {"contxt": 64}}}, "entry.args", "Fix: use ['context'"),
    "warmup longer than the run": ({"hyperparameters": {"warmup_steps": 500, "max_steps": 100}}, "hyperparameters", "Fix: lower warmup_steps"),
}
COMMANDS = {
    "check": ["check", "{spec}", "--stack", "stacks/Pulumi.dev.yaml"],
    "render": ["render", "{spec}"],
    "submit": ["submit", "{spec}"],
    "submit --detach": ["submit", "--detach", "{spec}"],
    "submit to the cluster": ["submit", "{spec}", "--backend", "kubernetes", "--stack", "stacks/Pulumi.dev.yaml"],
}


def bad_spec(tmp_path, change: dict):
    spec = {**QUICKSTART, **{k: v for k, v in change.items() if k != "hyperparameters"}}
    spec["hyperparameters"] = {**QUICKSTART.get("hyperparameters", {}), **change.get("hyperparameters", {})}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", BAD_SPECS)
def test_a_bad_spec_stops_every_command_before_anything_starts(tmp_path, case, command):
    change, field, fix = BAD_SPECS[case]
    path = bad_spec(tmp_path, change)
    home = tmp_path / "home"
    argv = [a.format(spec=path) for a in COMMANDS[command]]
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "trainforge.trainer.cli", *argv], capture_output=True, text=True,
                            cwd=REPO, env={"PATH": "/usr/bin:/bin", "TRAINFORGE_HOME": str(home), "KUBECONFIG": str(tmp_path / "none")})
    errors = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    message = "\n".join(errors)
    assert result.returncode == 2, message
    assert f"  - {field}" in message and fix in message, message
    assert "Traceback" not in message
    assert not home.exists(), "a job record was created for a spec that cannot run"
    imported = {line.split("|")[-1].strip().split(".")[0] for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert not imported & set(HEAVY), f"imported {imported & set(HEAVY)} before rejecting the spec"


FAILING_TASK = '''
def build():
    raise ValueError("the dataset shard /data/train-0007 is empty")
'''


@pytest.mark.slow
def test_a_worker_only_user_error_shows_its_message_in_the_summary_and_status(tmp_path):
    (tmp_path / "broken_task.py").write_text(FAILING_TASK)
    spec = {**QUICKSTART, "name": "broken", "entry": {"task": "broken_task:build"}, "workers": {"nodes": 1, "procs_per_node": 1}}
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {"PATH": "/usr/bin:/bin", "TRAINFORGE_HOME": str(tmp_path / "home"), "PYTHONPATH": str(tmp_path), "COLUMNS": "250"}
    submitted = subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", "submit", str(path)], capture_output=True, text=True,
                               cwd=REPO, env=env, timeout=300)
    assert submitted.returncode == 1, submitted.stdout + submitted.stderr
    summary = " ".join(submitted.stdout.split())  # Rich wraps the table's cells
    assert "ValueError: the dataset shard /data/train-0007 is empty" in summary, submitted.stdout
    status = subprocess.run([sys.executable, "-m", "trainforge.trainer.cli", "status", "broken", "-o", "json"], capture_output=True,
                            text=True, cwd=REPO, env=env)
    report = json.loads(status.stdout)
    assert report["state"] == "failed" and report["restarts"] == 0, "a user error is not retried"
    assert "ValueError: the dataset shard /data/train-0007 is empty" in report["reason"]
