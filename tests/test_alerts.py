"""The training alerts, run by Prometheus' own rule engine (`promtool test rules`): each fires on the series that
should fire it and stays quiet on a healthy neighbour. Skips where promtool is not installed (Debian `prometheus`)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from trainforge.platform.manifests import monitoring
from trainforge.stackconfig import MonitoringConfig

CFG = MonitoringConfig()
ALL = monitoring.alerts(CFG) + monitoring.budget_alerts(CFG)
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`; .ci/run installs it)")


def series(metric: str, values: str, **labels: str) -> dict:
    return {"series": metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


def job(name: str) -> dict:
    return {"job": name, "team": "vision", "rank": "0"}


def firing(alert: str, at: str, labels: dict, summary: str) -> dict:
    return {"eval_time": at, "alertname": alert,
            "exp_alerts": [{"exp_labels": {"severity": next(a.severity for a in ALL if a.name == alert), **labels},
                            "exp_annotations": {"summary": summary}}]}


def quiet(alert: str, at: str) -> dict:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


CASES = {
    "TrainingJobStalled": (1, [series("trainforge_step", "100x30", **job("stuck")), series("trainforge_step", "0+10x30", **job("moving"))],
                           [firing("TrainingJobStalled", "20m", {"job": "stuck", "team": "vision"},
                                   f"stuck (vision) made no step progress for {CFG.stalled_after_minutes} minutes")]),
    "GPUUnderutilised": (1, [series("trainforge_gpu_utilization_ratio", "0.1x40", **job("idle")),
                             series("trainforge_gpu_utilization_ratio", "0.1x20 0.9 0.1x19", **job("busy-once"))],
                         [firing("GPUUnderutilised", "35m", {"job": "idle", "team": "vision"},
                                 f"idle kept its GPUs under {CFG.gpu_idle_below:.0%} busy for 30 minutes")]),
    "CheckpointStale": (1, [series("trainforge_step", "1000+10x30", **job("stale")), series("trainforge_last_checkpoint_step", "500x30", **job("stale")),
                            series("trainforge_checkpoint_interval_steps", "100x30", **job("stale")),
                            series("trainforge_step", "1000+10x30", **job("fresh")), series("trainforge_last_checkpoint_step", "1000+10x30", **job("fresh")),
                            series("trainforge_checkpoint_interval_steps", "100x30", **job("fresh"))],
                        [firing("CheckpointStale", "10m", {"job": "stale", "team": "vision"},
                                "stale: the newest checkpoint is more than twice its interval behind")]),
    "CheckpointUploadLagging": (1, [series("trainforge_s3_upload_lag_seconds", "2000x20", **job("lagging")),
                                    series("trainforge_s3_upload_lag_seconds", "10x20", **job("uploaded"))],
                                [firing("CheckpointUploadLagging", "10m", {"job": "lagging", "team": "vision"},
                                        f"lagging: a checkpoint has waited over {CFG.s3_lag_minutes} minutes for S3")]),
    "TrainingJobPreempted": (1, [series("trainforge_restarts", "0x60 1x30", **job("resumed")), series("trainforge_restarts", "0x90", **job("steady"))],
                             [firing("TrainingJobPreempted", "80m", {"job": "resumed", "team": "vision"},
                                     "resumed resumed from a checkpoint in the last hour (spot reclaim, eviction or lost worker)"),
                              quiet("TrainingJobPreempted", "30m")]),
    "TrainingJobRestartsOften": (10, [series("trainforge_restarts", "0x36 1 2 3", **job("flaky")), series("trainforge_restarts", "0x36 1 1 1", **job("once"))],
                                 [firing("TrainingJobRestartsOften", "390m", {"job": "flaky", "team": "vision"},
                                         "flaky restarted 3 or more times in 6 hours: check the spot market or the job"),
                                  quiet("TrainingJobRestartsOften", "360m")]),
    "TeamGPUQuotaNearlyExhausted": (1, [
        series("kueue_cluster_queue_resource_usage", "30x30", cluster_queue="team-full", flavor="gpu-spot", resource="nvidia.com/gpu"),
        series("kueue_cluster_queue_nominal_quota", "32x30", cluster_queue="team-full", flavor="gpu-spot", resource="nvidia.com/gpu"),
        series("kueue_cluster_queue_resource_usage", "10x30", cluster_queue="team-roomy", flavor="gpu-spot", resource="nvidia.com/gpu"),
        series("kueue_cluster_queue_nominal_quota", "32x30", cluster_queue="team-roomy", flavor="gpu-spot", resource="nvidia.com/gpu")],
        [firing("TeamGPUQuotaNearlyExhausted", "20m", {"cluster_queue": "team-full", "flavor": "gpu-spot"},
                f"team-full uses {CFG.quota_nearly_used:.0%} or more of its gpu-spot GPUs"),
         quiet("TeamGPUQuotaNearlyExhausted", "10m")]),
    # The budget controller's metrics: one team at 85 %, one at 102 %, one at 7 %.
    "TeamBudgetNearlySpent": (1, [series("trainforge_team_spent_usd", "1275x10", team="vision"), series("trainforge_team_budget_usd", "1500x10", team="vision"),
                                  series("trainforge_team_spent_usd", "1530x10", team="language"), series("trainforge_team_budget_usd", "1500x10", team="language"),
                                  series("trainforge_team_spent_usd", "100x10", team="speech"), series("trainforge_team_budget_usd", "1500x10", team="speech")],
                              [firing("TeamBudgetNearlySpent", "5m", {"team": "vision"}, "team vision has spent 85% of its monthly budget")]),
    "TeamBudgetReached": (1, [series("trainforge_team_spent_usd", "1275x10", team="vision"), series("trainforge_team_budget_usd", "1500x10", team="vision"),
                              series("trainforge_team_spent_usd", "1530x10", team="language"), series("trainforge_team_budget_usd", "1500x10", team="language")],
                          [firing("TeamBudgetReached", "5m", {"team": "language"}, "team language reached its monthly budget: its queue is held "
                                  "until the month rolls over or the budget is raised")]),
    "BudgetControllerNotRunning": (5, [series("trainforge_budget_last_pass_timestamp_seconds", "0+300x4 1200x12")],
                                   [firing("BudgetControllerNotRunning", "60m", {}, "budgets are not enforced: the budget controller has completed "
                                           f"no pass for over {3 * CFG.budget_every_minutes} minutes (is OpenCost up?)"),
                                    quiet("BudgetControllerNotRunning", "30m")]),
}


def test_every_alert_has_a_case():
    assert {a.name for a in ALL} == set(CASES)


@pytest.mark.parametrize("alert", sorted(CASES))
def test_the_alert_fires_on_its_series_and_not_on_a_healthy_one(alert, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(monitoring.prometheus_rule(CFG)["spec"], sort_keys=False))
    interval, input_series, checks = CASES[alert]
    test = tmp_path / "test.yaml"
    test.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m",
                                    "tests": [{"interval": f"{interval}m", "input_series": input_series, "alert_rule_test": checks}]}))
    result = subprocess.run([PROMTOOL, "test", "rules", str(test)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_file_passes_promtool_check(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(monitoring.prometheus_rule(CFG)["spec"], sort_keys=False))
    result = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
