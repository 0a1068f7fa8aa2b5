"""The first `pulumi up` on a new account, over the program's real resource graph: the dependency edges the mock
engine records, and what each Helm release really renders with the program's values (tests/support/helm.py). The rules are
platform/plan/first_up.py's, each a fact about EKS, Kubernetes, Helm or pulumi-kubernetes with its source."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import yaml
from support.evaluated import evaluation_of
from support.repo import STACK_FILES
from support.helm import program_releases, render, rendered_program

from trainforge.infra.engine import Evaluation
from trainforge.platform.plan import first_up

@pytest.fixture(scope="module", params=STACK_FILES, ids=[p.name for p in STACK_FILES])
def first(request):
    evaluation = evaluation_of(request.param)
    rendered, installs = rendered_program(evaluation)
    return evaluation, rendered, installs


def without_edges(evaluation: Evaluation, resource_type: str, on_type: str) -> Evaluation:
    """The same program with every direct edge from resources of one type to resources of another removed."""
    targets = {r.urn for r in evaluation.of_type(on_type)}
    resources = [dataclasses.replace(r, dependencies=r.dependencies - targets) if r.type == resource_type else r
                 for r in evaluation.resources]
    return dataclasses.replace(evaluation, resources=resources)


def facts(problems) -> set[str]:
    return {p.fact for p in problems}


def test_the_first_up_of_every_stack_goes_through(first):
    evaluation, rendered, installs = first
    problems = first_up.problems(evaluation, rendered, installs)
    assert problems == [], "\n".join(map(str, problems))


def test_the_model_sees_what_it_must(first):
    """It is not vacuous: the releases render webhooks, CRDs, claims and our image is run by a Deployment."""
    evaluation, rendered, installs = first
    kinds = {o["kind"] for objects in rendered.values() for o in objects}
    assert {"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "Prometheus", "ServiceMonitor"} <= kinds
    assert {"monitoring.coreos.com/ServiceMonitor", "kueue.x-k8s.io/ClusterQueue"} <= set().union(*installs.values())
    # The Trainer's CRDs are the program's own resources (platform/manifests/crds.py), which the model counts too.
    assert {"trainer.kubeflow.org/TrainJob", "trainer.kubeflow.org/ClusterTrainingRuntime"} <= set(first_up.FirstUp(evaluation, rendered, installs).program_crds)
    assert evaluation.of_type(first_up.IMAGE) and evaluation.of_type(first_up.ACCESS_POLICY)


def test_a_provider_that_does_not_wait_for_the_deployers_access_is_refused(first):
    evaluation, rendered, installs = first
    broken = without_edges(evaluation, first_up.KUBERNETES_PROVIDER, first_up.ACCESS_POLICY)
    assert facts(first_up.problems(broken, rendered, installs)) == {"api-access"}


def test_a_controller_started_before_its_image_is_pushed_is_refused(first):
    evaluation, rendered, installs = first
    broken = without_edges(evaluation, "kubernetes:apps/v1:Deployment", first_up.IMAGE)
    problems = first_up.problems(broken, rendered, installs)
    assert facts(problems) == {"image"} and "trainforge-budget" in problems[0].resource


def test_a_monitor_created_before_the_prometheus_operators_crds_is_refused(first):
    evaluation, rendered, installs = first
    broken = without_edges(evaluation, "kubernetes:monitoring.coreos.com/v1:ServiceMonitor", first_up.RELEASE)
    problems = first_up.problems(broken, rendered, installs)
    assert facts(problems) == {"crd"} and "monitoring.coreos.com/ServiceMonitor" in problems[0].detail


def test_prometheus_before_its_storage_class_is_refused(first):
    evaluation, rendered, installs = first
    broken = without_edges(evaluation, first_up.RELEASE, first_up.STORAGE_CLASS)
    problems = first_up.problems(broken, rendered, installs)
    assert facts(problems) == {"storage-class"} and "Prometheus" in problems[0].detail


def test_kueues_chart_defaults_would_put_its_job_webhook_in_front_of_other_charts_hooks(first):
    """Kueue's chart registers its Job webhooks for every namespace but its own and kube-system unless the
    Configuration's managedJobsNamespaceSelector narrows them: kube-prometheus-stack's install hooks would then be
    rejected while Kueue has no ready pod."""
    evaluation, rendered, installs = first
    kueue = copy.deepcopy(program_releases(evaluation)["kueue"])
    config = yaml.safe_load(kueue["values"]["managerConfig"]["controllerManagerConfigYaml"])
    del config["managedJobsNamespaceSelector"]
    kueue["values"]["managerConfig"]["controllerManagerConfigYaml"] = yaml.safe_dump(config)
    problems = first_up.problems(evaluation, {**rendered, "kueue": render(kueue)}, installs)
    assert facts(problems) == {"webhook"}
    assert any("kube-prometheus-stack" in p.resource and "mjob.kb.io" in p.detail for p in problems)


def test_a_shipped_stack_as_it_is_cannot_reach_its_api(first):
    """Without the deployer's CIDRs the public endpoint would be open to all; `pulumi up` refuses (stackconfig)."""
    evaluation, rendered, installs = first
    (cluster,) = evaluation.of_type("aws:eks/cluster:Cluster")
    vpc = dict(cluster.inputs["vpcConfig"], publicAccessCidrs=None)
    broken = dataclasses.replace(evaluation, resources=[dataclasses.replace(r, inputs={**r.inputs, "vpcConfig": vpc}) if r is cluster else r
                                                        for r in evaluation.resources])
    assert facts(first_up.problems(broken, rendered, installs)) == {"endpoint"}
