"""The `trainforge-torch` ClusterTrainingRuntimes: valid on the cluster (against the CRD of the Trainer the platform
pins), their restart rules do what the runtime's exit codes promise (preempted resumes, user errors fail fast, lost
workers restart up to a limit), and the pods the Trainer builds get the grace period the runtime plans for."""

from __future__ import annotations

import copy
import re

import pytest
from support.repo import KUBERNETES_VERSIONS, SPECS

from trainforge import contract, exits
from trainforge.platform.training.runtime import cluster_training_runtime, cluster_training_runtimes
from trainforge.k8s_schema import core_problems, pod_templates, problems
from trainforge.trainer.placement import decide
from trainforge.trainer.render import render as render_placed


def render(spec, kind="trainjob", cost_centre=None, platform=None):
    """The manifest as submitted: placed once (against the stack when given), then rendered."""
    return render_placed(spec, decide(spec, platform), kind, cost_centre)
from trainforge.trainer.spec import load_spec

RUNTIME = cluster_training_runtime("ghcr.io/example/trainforge:1.0", max_restarts=5)
RUNTIMES = {r["metadata"]["name"]: r for r in cluster_training_runtimes("ghcr.io/example/trainforge:1.0", max_restarts=5)}
CAPACITIES = ["on-demand", "spot", "spot-fallback"]


def test_the_runtimes_validate_against_the_crd_and_the_kubernetes_job_schema():
    assert set(RUNTIMES) == {contract.CLUSTER_TRAINING_RUNTIME, contract.CLUSTER_TRAINING_RUNTIME_SPOT}
    for runtime in RUNTIMES.values():
        assert problems(runtime) == []
        for version in KUBERNETES_VERSIONS:
            assert core_problems(runtime, version) == []


def test_the_runtimes_differ_only_in_name_and_grace_period():
    spot, on_demand = (copy.deepcopy(RUNTIMES[n]) for n in (contract.CLUSTER_TRAINING_RUNTIME_SPOT, contract.CLUSTER_TRAINING_RUNTIME))
    for runtime in (spot, on_demand):
        del runtime["metadata"]["name"]
        del runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert spot == on_demand


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_the_pods_the_trainer_builds_outlast_the_runtimes_preemption_window(path, capacity):
    """Runtime + patches + trainer section, merged as Trainer 2.2.1 does: the kubelet's grace period covers the
    runtime's emergency checkpoint and upload (preemption_grace_s) plus the margin, and the pod is valid."""
    spec = load_spec(path).model_copy(update={"capacity": capacity})
    job = render(spec, "trainjob")
    runtime = RUNTIMES[job["spec"]["runtimeRef"]["name"]]
    for name, pod in pod_templates(job, runtime).items():
        grace = pod["spec"]["terminationGracePeriodSeconds"]
        if capacity != "on-demand":
            assert grace >= contract.SPOT_TERMINATION_GRACE_S, "a spot notice gives two minutes: use them"
        if not spec.entry.command:
            sets = dict(a.split("=", 1) for a in pod["spec"]["containers"][0]["args"][1::2])
            assert grace >= float(sets["checkpoint.preemption_grace_s"]) + contract.PREEMPTION_MARGIN_S, name
    for version in KUBERNETES_VERSIONS:
        assert core_problems(job, version, runtime) == []


def test_a_bad_failure_policy_is_caught_before_it_reaches_the_cluster():
    broken = copy.deepcopy(RUNTIME)
    job = broken["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    job["podFailurePolicy"]["rules"][1]["onExitCode"] = job["podFailurePolicy"]["rules"][1].pop("onExitCodes")  # a typo
    assert any("onExitCode" in p for p in core_problems(broken, KUBERNETES_VERSIONS[0]))
    broken["spec"]["template"]["spec"]["failurePolicy"]["rules"][0]["action"] = "Retry"
    assert any("Retry" in p for p in problems(broken))


def test_every_trainjob_names_this_runtime_its_job_and_its_container():
    replicated = RUNTIME["spec"]["template"]["spec"]["replicatedJobs"][0]
    container = replicated["template"]["spec"]["template"]["spec"]["containers"][0]["name"]
    for path in SPECS:
        job = render(load_spec(path), "trainjob")
        assert job["spec"]["runtimeRef"]["name"] in RUNTIMES
        patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        assert patch["name"] == replicated["name"]
        assert patch["template"]["spec"]["template"]["spec"]["containers"][0]["name"] == container


# A model of the documented evaluation, to read the rules as behaviour: the Job controller takes the first
# podFailurePolicy rule whose exit codes match (FailJob -> reason PodFailurePolicy with its message; no match ->
# counted, and backoffLimit 0 fails the Job with BackoffLimitExceeded); JobSet takes the first failure-policy
# rule whose reasons and message patterns match (RE2; these patterns mean the same in Python), else RestartJobSet.
def job_failure(exit_code: int) -> tuple[str, str]:
    job = RUNTIME["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    for index, rule in enumerate(job["podFailurePolicy"]["rules"]):
        codes = rule["onExitCodes"]
        matched = (exit_code in codes["values"]) == (codes["operator"] == "In")
        if matched and rule["action"] == "FailJob":
            return "PodFailurePolicy", (f"Container {codes['containerName']} for pod team-a/job-node-0-0 failed with exit code "
                                        f"{exit_code} matching FailJob rule at index {index}")
    assert job["backoffLimit"] == 0
    return "BackoffLimitExceeded", "Job has reached the specified backoff limit"


def jobset_action(exit_code: int) -> str:
    reason, message = job_failure(exit_code)
    for rule in RUNTIME["spec"]["template"]["spec"]["failurePolicy"]["rules"]:
        if rule.get("onJobFailureReasons") and reason not in rule["onJobFailureReasons"]:
            continue
        patterns = rule.get("onJobFailureMessagePatterns", [])
        if patterns and not any(re.search(p, message) for p in patterns):
            continue
        return rule["action"]
    return "RestartJobSet"


def test_preemption_resumes_without_spending_a_restart():
    assert jobset_action(exits.EXIT_PREEMPTED) == "RestartJobSetAndIgnoreMaxRestarts"


@pytest.mark.parametrize("code", [1, exits.EXIT_USER_ERROR, 127])
def test_user_errors_fail_the_job_at_once(code):
    assert jobset_action(code) == "FailJobSet"


@pytest.mark.parametrize("code", [137, 139, 255])
def test_a_lost_worker_restarts_the_group_within_the_limit(code):
    assert jobset_action(code) == "RestartJobSet"
    assert RUNTIME["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 5


def test_the_rules_agree_with_the_contract_for_every_exit_code():
    for code in range(1, 256):
        restarts = jobset_action(code) != "FailJobSet"
        assert restarts == exits.is_retryable(code), code


def test_a_negative_restart_limit_is_refused():
    with pytest.raises(ValueError, match="max_restarts"):
        cluster_training_runtime("img", max_restarts=-1)
