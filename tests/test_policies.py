"""The policy pack's rules pass every resource the shipped stacks register, and catch the broken variants."""

from __future__ import annotations

import copy

import pytest
from pulumi_policy import PolicyCustomTimeouts, PolicyResourceOptions, ResourceValidationArgs

from trainforge.policies.rules import POLICIES


def violations(resource_type: str, props: dict) -> list[str]:
    opts = PolicyResourceOptions(protect=False, ignore_changes=[], delete_before_replace=None, aliases=[],
                                 custom_timeouts=PolicyCustomTimeouts(0, 0, 0), additional_secret_outputs=[])
    args = ResourceValidationArgs(resource_type, props, urn=f"urn:pulumi:test::trainforge::{resource_type}::r", name="r", opts=opts, provider=None)
    found: list[str] = []
    for policy in POLICIES:
        policy.validate(args, lambda message, urn=None, name=policy.name: found.append(f"{name}: {message}"))
    return found


def test_shipped_stacks_comply_with_every_policy(stack):
    evaluation, _ = stack
    for r in evaluation.resources:
        assert violations(r.type, r.inputs) == [], f"{r.type} {r.name}"


def first(evaluation, type_token, predicate=lambda r: True):
    return copy.deepcopy(next(r for r in evaluation.of_type(type_token) if predicate(r)).inputs)


@pytest.fixture(scope="module")
def prod(evaluations):
    from conftest import STACKS
    return evaluations(STACKS / "Pulumi.prod.yaml")


def test_imdsv1_and_a_second_hop_are_caught(prod):
    props = first(prod, "aws:ec2/launchTemplate:LaunchTemplate")
    props["metadataOptions"].update(httpTokens="optional", httpPutResponseHopLimit=2)
    found = violations("aws:ec2/launchTemplate:LaunchTemplate", props)
    assert len(found) == 2 and all(f.startswith("launch-templates-require-imdsv2") for f in found)


def test_an_untainted_gpu_group_is_caught(prod):
    props = first(prod, "aws:eks/nodeGroup:NodeGroup", lambda r: "NVIDIA" in r.inputs["amiType"])
    props["taints"] = [t for t in props["taints"] if t["key"] != "nvidia.com/gpu"]
    assert [f.split(":")[0] for f in violations("aws:eks/nodeGroup:NodeGroup", props)] == ["gpu-node-groups-are-tainted"]


def test_a_half_open_bucket_is_caught(prod):
    props = first(prod, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    props["restrictPublicBuckets"] = False
    assert "restrictPublicBuckets" in violations("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", props)[0]


@pytest.mark.parametrize("cidrs", [None, ["0.0.0.0/0"], ["10.0.0.0/8", "0.0.0.0/0"]])
def test_a_world_open_api_endpoint_is_caught(prod, cidrs):
    props = first(prod, "aws:eks/cluster:Cluster")
    props["vpcConfig"]["endpointPublicAccess"] = True
    props["vpcConfig"]["publicAccessCidrs"] = cidrs
    assert violations("aws:eks/cluster:Cluster", props)[0].startswith("cluster-endpoint-not-open-to-the-world")


def test_a_nat_gateway_without_a_cost_centre_is_caught(prod):
    props = first(prod, "aws:ec2/natGateway:NatGateway")
    del props["tags"]["cost-centre"]
    assert "['cost-centre']" in violations("aws:ec2/natGateway:NatGateway", props)[0]
