"""One duration grammar (trainforge/durations.py) for job specs, sweep specs and stack files (issue 23): a value that
one accepts, the others accept, meaning the same; Kubernetes components get it as a Go duration (no days)."""

from __future__ import annotations

import copy

import pytest
import yaml
from support.repo import REPO

from trainforge import durations
from trainforge.platform.manifests.values import kueue_configuration
from trainforge.stackconfig import load_stack_file
from trainforge.trainer.spec import SpecError, parse_spec
from trainforge.trainer.sweeps.spec import SweepSpecError, parse_sweep

GOOD = {"45m": 2700, "2h": 7200, "1h30m": 5400, "1d": 86400, "1d12h": 129600, "90s": 90, "1h0m30s": 3630}
BAD = ["soon", "1h30", "-5m", "", "2 h", "1.5h", "30m1h"]
BASE = yaml.safe_load((REPO / "examples" / "sweep-base.yaml").read_text())
SWEEP = yaml.safe_load((REPO / "examples" / "sweeps" / "classifier-lr.yaml").read_text())


def job_runtime_s(text: str) -> float:
    return parse_spec({**BASE, "limits": {**BASE["limits"], "max_runtime": text}}).limits.max_runtime_hours * 3600


def sweep_wall_s(text: str) -> float | None:
    return parse_sweep({**SWEEP, "base": BASE, "budget": {"wall_time": text}}, "s.yaml").spec.budget.wall_time_s


@pytest.mark.parametrize("text", sorted(GOOD))
def test_every_setting_reads_a_duration_alike(text):
    assert durations.seconds(text) == GOOD[text]
    assert job_runtime_s(text) == pytest.approx(GOOD[text]), "a job's max_runtime"
    assert sweep_wall_s(text) == GOOD[text], "a sweep's wall_time (a max_runtime pasted there was refused: 1h30m)"


@pytest.mark.parametrize("text", BAD)
def test_every_setting_refuses_what_is_no_duration_with_the_fix(text):
    with pytest.raises(ValueError) as plain:
        durations.seconds(text)
    assert "is not a duration. Fix:" in str(plain.value)
    with pytest.raises(SpecError) as job:
        job_runtime_s(text)
    assert "limits.max_runtime" in str(job.value) and "is not a duration" in str(job.value)
    with pytest.raises(SweepSpecError) as sweep:
        sweep_wall_s(text)
    assert "wall_time" in str(sweep.value) and "is not a duration" in str(sweep.value)


def test_a_stacks_timeouts_take_days_and_reach_kueue_as_go_durations(tmp_path):
    raw = yaml.safe_load((REPO / "stacks" / "Pulumi.dev.yaml").read_text())
    changed = copy.deepcopy(raw)
    kubernetes = changed["config"]["trainforge:platform"].setdefault("kubernetes", {})
    kubernetes["kueue"] = {**kubernetes.get("kueue", {}), "recovery_timeout": "1d", "wait_for_pods_ready_timeout": "1h30m"}
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(changed))
    ready = kueue_configuration(load_stack_file(path))["waitForPodsReady"]
    assert (ready["recoveryTimeout"], ready["timeout"]) == ("24h", "1h30m"), "Go has no days"


@pytest.mark.parametrize("seconds, spelled, go", [(5400, "1h30m", "1h30m"), (86400, "1d", "24h"), (90061, "1d1h1m1s", "25h1m1s"), (0, "0s", "0s")])
def test_durations_are_written_back_in_the_grammar(seconds, spelled, go):
    assert durations.spelled(seconds) == spelled and durations.go(seconds) == go
    assert durations.seconds(spelled) == seconds
