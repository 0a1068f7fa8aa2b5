"""The policy pack catches each isolation regression of issue 37 (item 8) injected into the prod stack as the program
evaluates it: the resources as the engine hands them to the pack (platform/plan's policy view), one property changed.
The unchanged stack passes every mandatory rule (tests/test_policies.py), so each finding here is the injection's."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, Callable

import pytest
from support.repo import STACK_FILES

from trainforge import contract
from trainforge.policies.kubernetes import plain

PROD = next(p for p in STACK_FILES if p.name == "Pulumi.prod.yaml")
TEAM = "applied"


@pytest.fixture(scope="module")
def view(evaluations):
    from trainforge.platform.plan.plan import policy_view
    return policy_view(evaluations(PROD))


def findings(per_resource, whole) -> list[str]:
    """The mandatory rules' findings over a policy view, as `trainforge plan` judges it."""
    from trainforge.platform.plan.plan import verdicts_over
    return [f"{v.rule}: {v.message}" for v in verdicts_over(per_resource, whole) if v.level == "mandatory"]


def injected(view, resource_type: str, name: str, change: Callable[[dict[str, Any]], None]):
    """The view with `change` applied to the named resource's inputs (and its state, for stack rules)."""
    per_resource, whole = copy.deepcopy(view)
    hits = 0
    for i, (kind, resource_name, props, provider) in enumerate(per_resource):
        if kind == resource_type and resource_name == name:
            props = plain(props)
            change(props)
            per_resource[i] = (kind, resource_name, props, provider)
            hits += 1
    for i, resource in enumerate(whole):
        if resource.resource_type == resource_type and resource.name == name:
            state = plain(copy.deepcopy(dict(resource.props)))
            change(state)
            whole[i] = dataclasses.replace(resource, props=state)
    assert hits == 1, f"no single {resource_type} {name}"
    return per_resource, whole


RELEASE = "kubernetes:helm.sh/v3:Release"
VAP = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
VAPB = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"


def _drop_validation(needle: str):
    def change(props):
        props["spec"]["validations"] = [v for v in props["spec"]["validations"] if needle not in v["expression"]]
    return change


def _open_volumes(props):
    for v in props["spec"]["validations"]:
        if "object.spec.volumes" in v["expression"]:
            v["expression"] = v["expression"].replace("object.spec.volumes.all(v, ", "object.spec.volumes.all(v, has(v.hostPath) || ")


def _widen_team_policy(props):
    document = json.loads(props["policy"])
    text = json.dumps(document).replace(contract.team_s3_prefix(TEAM), "teams/")
    props["policy"] = text


def _dcgm_open(props):
    props["values"]["serviceMonitor"]["honorLabels"] = True
    props["values"]["kubernetes"].pop("podLabelAllowlistRegex")


# regression -> (resource type, resource name, the change, the rule that must catch it)
REGRESSIONS = {
    "MLflow auth.enabled: false": (RELEASE, "mlflow", lambda p: p["values"]["auth"].update(enabled=False), "mlflow-enforces-team-boundaries"),
    "MLflow defaultPermission: READ": (RELEASE, "mlflow", lambda p: p["values"]["auth"].update(defaultPermission="READ"),
                                       "mlflow-enforces-team-boundaries"),
    "MLflow on basic-auth alone": (RELEASE, "mlflow", lambda p: p["values"]["auth"].update(appName="basic-auth"), "mlflow-enforces-team-boundaries"),
    "the pods policy's runAsUser rule dropped": (VAP, "validatingadmissionpolicy-trainforge-team-pods", _drop_validation("runAsUser"),
                                                 "team-admission-policies-complete"),
    "the pods policy's volume rule opened to hostPath": (VAP, "validatingadmissionpolicy-trainforge-team-pods", _open_volumes,
                                                         "team-admission-policies-complete"),
    "the pods policy's resource rule dropped": (VAP, "validatingadmissionpolicy-trainforge-team-pods", _drop_validation("c.resources.limits"),
                                                "team-admission-policies-complete"),
    "the pods policy's image rule dropped": (VAP, "validatingadmissionpolicy-trainforge-team-pods", _drop_validation("c.image"),
                                             "team-admission-policies-complete"),
    "the pods policy's sweep-controller label rule dropped": (VAP, "validatingadmissionpolicy-trainforge-team-pods",
                                                              _drop_validation("object.spec.serviceAccountName"), "team-admission-policies-complete"),
    "monitoring's default-deny dropped": ("kubernetes:networking.k8s.io/v1:NetworkPolicy", "monitoring-networkpolicy-default-deny",
                                         lambda p: p["spec"].update(policyTypes=["Ingress"]), "platform-namespaces-deny-by-default"),
    "the jobs policy's priority rule dropped": (VAP, "validatingadmissionpolicy-trainforge-team-jobs", _drop_validation("'priority-'"),
                                                "team-admission-policies-complete"),
    "the pods policy's supplemental-groups rule dropped": (VAP, "validatingadmissionpolicy-trainforge-team-pods",
                                                           _drop_validation("supplementalGroupsPolicy"), "team-admission-policies-complete"),
    "the pods binding set to Warn": (VAPB, "validatingadmissionpolicybinding-trainforge-team-pods",
                                     lambda p: p["spec"].update(validationActions=["Warn"]), "team-admission-policies-complete"),
    "the jobs policy's queue rule dropped": (VAP, "validatingadmissionpolicy-trainforge-team-jobs", _drop_validation("params.data.queue"),
                                             "team-admission-policies-complete"),
    "the team settings' uid set to 0": ("kubernetes:core/v1:ConfigMap", f"team-{TEAM}-configmap-trainforge-team",
                                        lambda p: p["data"].update(uid="0"), "team-settings-name-the-teams-identity"),
    "the FSx directory Job's mode 0777": ("kubernetes:batch/v1:Job", f"trainforge-system-job-fsx-dir-{TEAM}",
                                          lambda p: p["spec"]["template"]["spec"]["containers"][0]["command"].__setitem__(
                                              -1, p["spec"]["template"]["spec"]["containers"][0]["command"][-1].replace("0770", "0777")),
                                          "team-directories-private"),
    "allow-https-out without its VPC except": ("kubernetes:networking.k8s.io/v1:NetworkPolicy", f"team-{TEAM}-networkpolicy-allow-https-out",
                                               lambda p: p["spec"]["egress"][0]["to"][0]["ipBlock"].pop("except"), "team-network-policies-not-open"),
    "the trainer PodMonitor without limits, honouring labels": (
        "kubernetes:monitoring.coreos.com/v1:PodMonitor", "monitoring-podmonitor-trainforge-trainers",
        lambda p: (p["spec"].pop("sampleLimit"), p["spec"]["podMetricsEndpoints"][0].update(honorLabels=True)), "trainer-scrape-unforgeable"),
    "a team's IRSA policy widened from teams/<team>/ to teams/": ("aws:iam/rolePolicy:RolePolicy", f"prod-team-{TEAM}-storage",
                                                                   _widen_team_policy, "team-roles-confined"),
    "FSx auto-export switched on": ("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation", "prod-fsx-datasets",
                                    lambda p: p["s3"]["autoExportPolicy"].update(events=["NEW", "CHANGED"]), "fsx-never-exports"),
    "Prometheus without enforced scrape limits": (RELEASE, "kube-prometheus-stack",
                                                  lambda p: p["values"]["prometheus"]["prometheusSpec"].pop("enforcedSampleLimit"),
                                                  "scrapes-bounded-and-unforgeable"),
    "dcgm-exporter honouring labels and copying every pod label": (RELEASE, "dcgm-exporter", _dcgm_open, "scrapes-bounded-and-unforgeable"),
}


@pytest.fixture(scope="module")
def clean(view) -> list[str]:
    return findings(*view)


@pytest.mark.parametrize("regression", REGRESSIONS)
def test_each_isolation_regression_is_caught(view, clean, regression):
    resource_type, name, change, rule = REGRESSIONS[regression]
    assert not [f for f in clean if f.startswith(f"{rule}: ")], "the unchanged stack passes the rule"
    found = findings(*injected(view, resource_type, name, change))
    assert any(f.startswith(f"{rule}: ") for f in found), found
    assert all("Fix:" in f for f in found if f.startswith(f"{rule}: ")), "each finding says what to change"
