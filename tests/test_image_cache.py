"""Every chart's images through the stack's ECR pull-through cache (trainforge.registries, infra/image_cache.py,
platform/manifests/images.py): each release rendered through its real templates with the program's values, every image
its pods (hooks included) and the operator's Prometheus and Alertmanager run is either `<the stack's registry>/<a cached
upstream>/...` or pulled from its upstream for a reason the product lists; the rules, their repositories' template and
the nodes' right to fill them exist, and the first `up` orders every chart after them."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from support.evaluated import deployable, evaluation_of
from support.helm import rendered_program
from support.repo import STACK_FILES, STACKS

from trainforge.platform.manifests.images import PULLED_DIRECTLY
from trainforge.platform.plan import first_up
from trainforge.registries import ImageSources, NEEDS_CREDENTIAL, NOT_CACHEABLE, upstream_of
from trainforge.stackconfig import CONFIG_KEY, ConfigError, parse, read_stack_file

pytestmark = pytest.mark.slow

DEV = STACKS / "Pulumi.dev.yaml"
SECRET = "arn:aws:secretsmanager:us-east-1:444455556666:secret:ecr-pullthroughcache/{}-AbCdEf"
RULE = first_up.CACHE_RULE


def registry_of(evaluation) -> str:
    """The stack's ECR registry host, as its runtime image's repository names it."""
    (repository,) = evaluation.of_type("aws:ecr/repository:Repository")
    return repository.state["repositoryUrl"].split("/")[0]


def images_by_release(evaluation) -> dict[str, set[str]]:
    rendered, installs = rendered_program(evaluation)
    model = first_up.FirstUp(evaluation, rendered, installs)
    return {name: model.images_run_by(release) for name, release in model.releases.items()}


def with_image_cache(**cache) -> tuple:
    from trainforge.platform.components.offline import evaluate
    config = copy.deepcopy(deployable(DEV))
    config[CONFIG_KEY].setdefault("kubernetes", {})["image_cache"] = cache
    return evaluate(config, read_stack_file(DEV).environment)


def where_from(image: str, registry: str, cached: set[str]) -> str:
    """'cache' for an image served by the stack's cache; else why it is pulled from elsewhere (an assertion names it)."""
    for upstream in cached:
        if image.startswith(f"{registry}/{upstream}/"):
            return "cache"
    upstream = upstream_of(image)
    if upstream == registry or upstream.endswith(".amazonaws.com"):
        return "ecr"  # the stack's own repository (the runtime image), or AWS's EKS registry (the EFA plugin)
    reasons = [why for prefix, why in PULLED_DIRECTLY.items() if image.startswith(prefix)]
    if reasons:
        return reasons[0]
    if upstream in NOT_CACHEABLE:
        return NOT_CACHEABLE[upstream]
    if upstream in NEEDS_CREDENTIAL and upstream not in cached:
        return f"{upstream}: the stack gives no credential"
    raise AssertionError(f"{image} is pulled from {upstream}, which the stack caches or could: it should come through the cache")


@pytest.mark.parametrize("path", STACK_FILES, ids=[p.name for p in STACK_FILES])
def test_every_chart_image_comes_through_the_cache_or_for_a_listed_reason(path):
    evaluation = evaluation_of(path)
    registry = registry_of(evaluation)
    cached = {r.inputs["ecrRepositoryPrefix"] for r in evaluation.of_type(RULE)}
    assert cached == {"public.ecr.aws", "registry.k8s.io", "quay.io"}, "the upstreams that need no credential"
    found = {image: where_from(image, registry, cached) for images in images_by_release(evaluation).values() for image in images}
    through = sorted(i for i, how in found.items() if how == "cache")
    assert len(through) >= 10, through
    assert not [i for i in found if "k8s-staging-images" in i or i.endswith(":main")], "released images, not the charts' staging defaults"
    assert not [i for i in found if upstream_of(i) == "docker.io" and found[i] == "cache"] and \
        any(i.startswith(f"{registry}/public.ecr.aws/docker/library/busybox:") for i in through), \
        "MLflow's and the CRD job's busybox come from ECR Public's copy, not Docker Hub"
    elsewhere = {how for how in found.values() if how != "cache"}
    assert elsewhere <= {"ecr", *PULLED_DIRECTLY.values(), *NOT_CACHEABLE.values(), "docker.io: the stack gives no credential",
                         "ghcr.io: the stack gives no credential"}, found


def test_a_credential_adds_docker_hub_and_githubs_registry():
    evaluation = with_image_cache(credentials={"docker.io": SECRET.format("docker-hub"), "ghcr.io": SECRET.format("ghcr")})
    registry = registry_of(evaluation)
    rules = {r.inputs["ecrRepositoryPrefix"]: r.inputs for r in evaluation.of_type(RULE)}
    assert rules["docker.io"]["upstreamRegistryUrl"] == "registry-1.docker.io", "ECR's name for Docker Hub"
    assert rules["docker.io"]["credentialArn"] == SECRET.format("docker-hub") and "credentialArn" not in rules["quay.io"]
    images = images_by_release(evaluation)
    assert f"{registry}/docker.io/grafana/grafana" in {i.rsplit(":", 1)[0] for i in images["kube-prometheus-stack"]}
    assert any(i.startswith(f"{registry}/ghcr.io/kubeflow/trainer/") for i in images["kubeflow-trainer"])
    assert all(i.startswith("ghcr.io/opencost/") for i in images["opencost"]), PULLED_DIRECTLY["ghcr.io/opencost/"]


def test_the_rules_their_repositories_and_the_nodes_right_to_fill_them():
    evaluation = evaluation_of(DEV)
    registry = registry_of(evaluation)
    account, region = registry.split(".")[0], registry.split(".")[3]
    templates = {t.inputs["prefix"]: t.inputs for t in evaluation.of_type("aws:ecr/repositoryCreationTemplate:RepositoryCreationTemplate")}
    assert set(templates) == {r.inputs["ecrRepositoryPrefix"] for r in evaluation.of_type(RULE)}
    for template in templates.values():
        assert template["appliedFors"] == ["PULL_THROUGH_CACHE"] and template["imageTagMutability"] == "MUTABLE"
        assert "imageCountMoreThan" in template["lifecyclePolicy"]
    import json
    (policy,) = [p for p in evaluation.of_type(first_up.ROLE_POLICY) if "ecr:CreateRepository" in p.inputs["policy"]]
    (node_role,) = [r for r in evaluation.of_type("aws:iam/role:Role") if r.name.endswith("-nodes")]
    assert policy.inputs["role"] == node_role.id
    (statement,) = json.loads(policy.inputs["policy"])["Statement"]
    assert statement["Action"] == ["ecr:BatchImportUpstreamImage", "ecr:CreateRepository"]
    assert sorted(statement["Resource"]) == sorted(f"arn:aws:ecr:{region}:{account}:repository/{u}/*" for u in templates)


def test_the_first_up_refuses_a_chart_that_pulls_before_its_rule_exists():
    evaluation = evaluation_of(DEV)
    rendered, installs = rendered_program(evaluation)
    assert [p for p in first_up.problems(evaluation, rendered, installs) if p.fact == "image"] == []
    rules = {r.urn for r in evaluation.of_type(RULE)}
    cut = dataclasses.replace(evaluation, resources=[dataclasses.replace(r, dependencies=r.dependencies - rules)
                                                     for r in evaluation.resources])
    found = [p for p in first_up.problems(cut, rendered, installs) if p.fact == "image"]
    assert {p.resource for p in found} >= {"kueue", "kube-prometheus-stack", "cluster-autoscaler", "kubeflow-trainer", "mlflow"}, found
    assert all("through the cache before its rule" in p.detail for p in found), found


def test_a_stack_can_pull_from_the_upstreams_instead():
    evaluation = with_image_cache(enabled=False)
    assert not evaluation.of_type(RULE)
    images = {i for found in images_by_release(evaluation).values() for i in found}
    assert not [i for i in images if i.startswith(registry_of(evaluation)) and "/runtime" not in i], images
    assert "registry.k8s.io/kueue/kueue:v0.19.2" in images


def test_a_credential_that_ecr_cannot_use_is_refused_with_the_fix():
    raw = copy.deepcopy(read_stack_file(DEV).config[CONFIG_KEY])
    raw.setdefault("kubernetes", {})["image_cache"] = {"credentials": {"docker.io": "arn:aws:secretsmanager:us-east-1:444455556666:secret:dockerhub-x"}}
    with pytest.raises(ConfigError) as info:
        parse(raw, environment="dev", source="stacks/Pulumi.dev.yaml")
    assert "kubernetes.image_cache.credentials" in str(info.value) and "ecr-pullthroughcache/" in str(info.value)
    raw["kubernetes"]["image_cache"] = {"credentials": {"nvcr.io": SECRET.format("ngc")}}
    with pytest.raises(ConfigError) as info:
        parse(raw, environment="dev", source="stacks/Pulumi.dev.yaml")
    assert "nvcr.io" in str(info.value)


@pytest.mark.parametrize("reference, cached", [
    ("quay.io/prometheus/prometheus:v3.5.0", "R/quay.io/prometheus/prometheus:v3.5.0"),
    ("busybox:1.37.0", "R/docker.io/library/busybox:1.37.0"),  # Docker Hub's official images keep library/
    ("docker.io/grafana/grafana:13.2.0", "R/docker.io/grafana/grafana:13.2.0"),
    ("nvcr.io/nvidia/k8s-device-plugin:v0.20.0", "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"),
])
def test_a_reference_through_the_cache(reference, cached):
    sources = ImageSources(registry="R", cached=frozenset({"quay.io", "docker.io"}))
    assert sources.image(reference) == cached
    assert ImageSources().image(reference) == reference
