"""The local backend end to end: real torchrun, real signals, the supervisor, the registry and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.lanes import TRAINING

import yaml

pytest.importorskip("torch", reason="the runtime extra (torch) is not installed")

from support.cli import run_cli  # noqa: E402
from trainforge import exits  # noqa: E402
from support.waiting import wait_until

pytestmark = [pytest.mark.slow, TRAINING]


def spec_file(tmp: Path, name: str, **hyper) -> Path:
    spec = {"name": name, "team": "vision", "entry": {"task": "classifier"}, "workers": {"nodes": 1, "procs_per_node": 2},
            "resources": {"instance_type": "g6.xlarge"}, "capacity": "spot", "checkpoint": {"interval_steps": 10, "keep_last": 2},
            "hyperparameters": {"max_steps": 150, "eval_every": 50, "batch_size": 32, "warmup_steps": 10, **hyper},
            "limits": {"max_runtime": "10m", "max_restarts": 3}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def cli(home: Path, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    result = run_cli(*argv, home=home, timeout=300)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def status(home: Path, name: str) -> dict:
    return json.loads(cli(home, "status", name, "-o", "json").stdout)


def test_a_killed_worker_is_restarted_from_the_checkpoint_and_the_job_succeeds(tmp_path):
    home = tmp_path / "home"
    cli(home, "submit", "--detach", str(spec_file(tmp_path, "kill-me", step_sleep_s=0.03)))
    wait_until(lambda: (status(home, "kill-me")["progress"].get("step") or 0) >= 35)
    rank1 = int((home / "jobs" / "kill-me" / "run" / "pids" / "rank1.pid").read_text())
    os.kill(rank1, signal.SIGKILL)
    final = wait_until(lambda: (s := status(home, "kill-me"))["state"] in ("succeeded", "failed") and s)
    assert final["state"] == "succeeded", final
    assert final["restarts"] == 1 and final["attempts"] == 2
    assert final["history"][0]["outcome"] == "retry"
    assert final["progress"]["result"]["resumed_from"] >= 30, "the restart must resume, not start over"
    assert final["progress"]["step"] == 150
    costs = json.loads(cli(home, "cost", "-o", "json").stdout)
    (job,) = costs["jobs"]
    assert job["name"] == "kill-me" and job["node_hours"] > 0 and 0 < job["cost_usd"] < job["on_demand_usd"]
    assert costs["teams"][0]["team"] == "vision" and costs["teams"][0]["savings_usd"] > 0
    assert "restart 1/3" in cli(home, "logs", "kill-me").stdout


def test_cancel_leaves_a_committed_checkpoint_and_a_second_submit_resumes_from_it(tmp_path):
    home = tmp_path / "home"
    path = spec_file(tmp_path, "cancel-me", step_sleep_s=0.03)
    cli(home, "submit", "--detach", str(path))
    wait_until(lambda: (status(home, "cancel-me")["progress"].get("step") or 0) >= 25)
    cancelled = cli(home, "cancel", "cancel-me")
    assert "cancelled" in cancelled.stdout
    report = status(home, "cancel-me")
    assert report["state"] == "cancelled" and report["restarts"] == 0
    preempted = json.loads((home / "jobs" / "cancel-me" / "run" / "preempted.json").read_text())
    step = preempted["step"]
    assert (home / "jobs" / "cancel-me" / "checkpoints" / f"step-{step:08d}" / "COMMITTED").exists()
    assert cli(home, "list", "-o", "json").stdout.count('"cancelled"') == 1

    resumed = cli(home, "submit", str(path))  # foreground this time: progress bar and summary
    assert "succeeded" in resumed.stdout
    report = status(home, "cancel-me")
    assert report["state"] == "succeeded" and report["progress"]["result"]["resumed_from"] == step


def test_a_user_error_is_not_retried(tmp_path):
    home = tmp_path / "home"
    outcome = cli(home, "submit", str(spec_file(tmp_path, "bad-precision", precision="fp16")), check=False)
    assert outcome.returncode == 1
    report = status(home, "bad-precision")
    assert report["state"] == "failed" and report["restarts"] == 0 and report["exit_code"] == exits.EXIT_USER_ERROR
    assert "fp16 needs a CUDA device" in cli(home, "logs", "bad-precision").stdout


def test_a_job_admitted_against_a_stack_is_priced_in_the_stacks_region(tmp_path):
    home = tmp_path / "home"
    repo = Path(__file__).resolve().parents[1]
    # A refreshed us-west-2 price (the dev stack's region) that no other region has: the cost must use it.
    (home / "prices").mkdir(parents=True)
    (home / "prices" / "us-west-2.yaml").write_text(yaml.safe_dump({
        "region": "us-west-2", "as_of": "2026-11-01", "source": "test", "on_demand": {"g6.xlarge": 100.0}, "spot": {"g6.xlarge": 40.0}}))
    cli(home, "submit", "--stack", str(repo / "stacks" / "Pulumi.dev.yaml"), "--spent", "0",
        str(spec_file(tmp_path, "priced", max_steps=20, eval_every=10)))
    (job,) = json.loads(cli(home, "cost", "-o", "json").stdout)["jobs"]
    assert job["priced_in"] == "us-west-2"
    # the shipped price (~$0.80/h) is far off
    assert job["on_demand_usd"] == pytest.approx(job["node_hours"] * 100.0, rel=1e-9)
    assert job["cost_usd"] == pytest.approx(job["node_hours"] * 40.0, rel=1e-9)  # submitted as spot


def test_an_active_job_cannot_be_submitted_twice(tmp_path):
    home = tmp_path / "home"
    path = spec_file(tmp_path, "twice", step_sleep_s=0.05)
    cli(home, "submit", "--detach", str(path))
    second = cli(home, "submit", str(path), check=False)
    assert second.returncode == 2 and ("is pending" in second.stderr or "is running" in second.stderr)
    # At once, as a script would: the supervisor may still be starting (it took the whole 60 s wait to say nothing).
    started = time.monotonic()
    cli(home, "cancel", "twice")
    assert status(home, "twice")["state"] == "cancelled" and time.monotonic() - started < 30


def test_a_command_entry_gets_its_hyperparameters_as_json(tmp_path):
    """A command reads no RunConfig: its hyperparameters reach every rank in $TRAINFORGE_HYPERPARAMETERS."""
    home = tmp_path / "home"
    reader = ("import json, os; hp = json.loads(os.environ['TRAINFORGE_HYPERPARAMETERS']); "
              "open(f\"hp-{os.environ['RANK']}.json\", 'w').write(json.dumps(hp))")
    spec = {"name": "own-command", "team": "vision", "entry": {"command": [sys.executable, "-c", reader]},
            "workers": {"nodes": 1, "procs_per_node": 2}, "resources": {"instance_type": "g6.xlarge"},
            "hyperparameters": {"lr": 0.01, "layers": 4, "schedule": "cosine"}, "limits": {"max_runtime": "10m"}}
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(spec))
    cli(home, "submit", str(path))
    for rank in (0, 1):
        seen = json.loads((home / "jobs" / "own-command" / f"hp-{rank}.json").read_text())
        assert seen == {"lr": 0.01, "layers": 4, "schedule": "cosine"}


def test_a_local_job_gets_its_own_grace_class_not_always_spots(tmp_path, monkeypatch):
    """Issue 23: a default argument gave every local job the spot notice's window (105 s of a 120 s grace); an
    on-demand job's is a cancel's minute (45 s), as on the cluster."""
    import yaml as _yaml

    from trainforge import contract
    from trainforge.trainer.backends.local import worker_command, worker_environment
    from trainforge.trainer.spec import parse_spec
    monkeypatch.setenv("TRAINFORGE_HOME", str(tmp_path))
    monkeypatch.delenv(contract.TORCHRUN_SHUTDOWN_TIMEOUT_ENV, raising=False)
    from support.repo import REPO
    raw = _yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    for capacity, grace in (("on-demand", contract.ON_DEMAND_TERMINATION_GRACE_S), ("spot", contract.SPOT_TERMINATION_GRACE_S)):
        spec = parse_spec({**raw, "capacity": capacity})
        command = worker_command(spec, tmp_path)
        assert f"checkpoint.preemption_grace_s={contract.preemption_window_s(grace)}" in command, (capacity, command)
        # and torchrun waits for that window's emergency checkpoint, as in the pods (tests/test_render.py)
        waits = int(worker_environment(spec)[contract.TORCHRUN_SHUTDOWN_TIMEOUT_ENV])
        assert contract.preemption_window_s(grace) < waits == contract.torchrun_shutdown_timeout_s(grace) < grace
