"""Every stack in stacks/, run through the real program under Pulumi's mock engine: the resource
properties that would break a real deployment (or a bill, or an audit) if they were wrong."""

from __future__ import annotations

import json

import pulumi
import pytest

from trainforge import catalog, contract
from trainforge.contract import Flavour
from trainforge.policies.aws import is_taggable

LT = "aws:ec2/launchTemplate:LaunchTemplate"
NG = "aws:eks/nodeGroup:NodeGroup"
SG = "aws:ec2/securityGroup:SecurityGroup"
SUBNET = "aws:ec2/subnet:Subnet"
CLUSTER_SG_PREFIX = "sg-cluster"  # what the mock engine hands back as the EKS-created cluster security group


def _by_id(evaluation, type_token):
    return {r.id: r for r in evaluation.of_type(type_token)}


def _subnet_azs(evaluation, subnet_ids):
    subnets = _by_id(evaluation, SUBNET)
    return {subnets[i].inputs["availabilityZone"] for i in subnet_ids}


def _launch_template_of(evaluation, node_group):
    return _by_id(evaluation, LT)[node_group.inputs["launchTemplate"]["id"]]


def _group_config(cfg, node_group):
    return next(g for g in cfg.node_groups if g.name == node_group.inputs["labels"][contract.LABEL_NODE_GROUP])


def test_every_node_group_from_the_config_is_registered(stack):
    evaluation, cfg = stack
    assert sorted(ng.inputs["labels"][contract.LABEL_NODE_GROUP] for ng in evaluation.of_type(NG)) == sorted(g.name for g in cfg.node_groups)


def test_efa_launch_templates_expose_every_efa_device_of_their_instance_type(stack):
    evaluation, cfg = stack
    efa_sg_ids = {r.id for r in evaluation.of_type(SG) if r.name.endswith("-efa")}
    for ng in evaluation.of_type(NG):
        group = _group_config(cfg, ng)
        interfaces = _launch_template_of(evaluation, ng).inputs.get("networkInterfaces") or []
        if not group.efa:
            assert interfaces == [], f"{group.name}: only EFA groups replace the default interface"
            continue
        instance = catalog.lookup(group.instance_types[0])
        efa = [i for i in interfaces if i["interfaceType"] in ("efa", "efa-only")]
        assert len(efa) == instance.efa_interfaces, f"{group.name}: {len(efa)} EFA interfaces, {instance.name} has {instance.efa_interfaces}"
        primary = [i for i in interfaces if i["networkCardIndex"] == 0 and i["deviceIndex"] == 0]
        assert len(primary) == 1 and primary[0]["interfaceType"] in ("interface", "efa"), "primary interface must carry ENA"
        slots = {(i["networkCardIndex"], i["deviceIndex"]) for i in interfaces}
        assert len(slots) == len(interfaces), "two interfaces on one card/device slot"
        assert {i["networkCardIndex"] for i in interfaces} == set(range(instance.efa_interfaces)), "one EFA device per network card"
        for i in interfaces:
            assert i.get("associatePublicIpAddress") == "false"
            assert i.get("deleteOnTermination") == "true"
            assert "subnetId" not in i, "managed node groups reject subnets inside launch-template interfaces"
            groups = set(i["securityGroups"])
            assert groups & efa_sg_ids, "EFA interface without the EFA security group"
            assert any(g.startswith(CLUSTER_SG_PREFIX) for g in groups), "interface without the cluster security group: node cannot join"


def test_efa_security_group_allows_all_traffic_to_and_from_itself(stack):
    evaluation, cfg = stack
    efa_sgs = [r for r in evaluation.of_type(SG) if r.name.endswith("-efa")]
    assert len(efa_sgs) == (1 if any(g.efa for g in cfg.node_groups) else 0)
    for sg in efa_sgs:
        for direction in ("ingress", "egress"):
            rules = sg.inputs[direction]
            assert any(r["protocol"] == "-1" and r["self"] is True and r["fromPort"] == 0 and r["toPort"] == 0 for r in rules), direction


def test_efa_groups_sit_in_a_cluster_placement_group_in_the_fsx_availability_zone(stack):
    evaluation, cfg = stack
    placement_groups = _by_id(evaluation, "aws:ec2/placementGroup:PlacementGroup")
    fsx = evaluation.of_type("aws:fsx/lustreFileSystem:LustreFileSystem")[0]
    fsx_az = _subnet_azs(evaluation, [fsx.inputs["subnetIds"]])
    assert fsx_az == {cfg.fsx_availability_zone}
    efa_groups = [ng for ng in evaluation.of_type(NG) if _group_config(cfg, ng).efa]
    assert len(placement_groups) == len(efa_groups)
    for ng in efa_groups:
        placement = _launch_template_of(evaluation, ng).inputs["placement"]
        pg = next(p for p in placement_groups.values() if p.state["name"] == placement["groupName"])
        assert pg.inputs["strategy"] == "cluster"
        assert _subnet_azs(evaluation, ng.inputs["subnetIds"]) == fsx_az, "EFA nodes must not spread over AZs"


def test_gpu_groups_are_tainted_and_labelled_from_the_contract(stack):
    evaluation, cfg = stack
    for ng in evaluation.of_type(NG):
        group = _group_config(cfg, ng)
        taints = {(t["key"], t["effect"]) for t in ng.inputs.get("taints") or []}
        labels = ng.inputs["labels"]
        assert labels[contract.LABEL_FLAVOUR] == group.flavour.value
        assert labels[contract.LABEL_NODE_GROUP] == group.name
        if group.has_gpus:
            assert (contract.TAINT_GPU, "NO_SCHEDULE") in taints, f"{group.name}: GPU nodes would take any pod"
            assert ng.inputs["amiType"] == "AL2023_x86_64_NVIDIA"
        elif group.flavour is contract.Flavour.CPU:  # teams' CPU nodes: nothing of the platform's without a toleration
            assert taints == {(contract.TAINT_TEAM_CPU, "NO_SCHEDULE")} and ng.inputs["amiType"] == "AL2023_x86_64_STANDARD"
        else:
            assert taints == set() and ng.inputs["amiType"] == "AL2023_x86_64_STANDARD"
        if group.capacity == "spot":
            assert ng.inputs["capacityType"] == "SPOT"
            assert (contract.TAINT_SPOT, "NO_SCHEDULE") in taints and labels[contract.LABEL_CAPACITY] == "spot"
        else:
            assert ng.inputs["capacityType"] == "ON_DEMAND" and labels[contract.LABEL_CAPACITY] == "on-demand"
        scaling = ng.inputs["scalingConfig"]
        assert (scaling["minSize"], scaling["desiredSize"], scaling["maxSize"]) == (group.min_size, group.desired, group.max_size)


def test_launch_templates_require_imdsv2_encrypt_root_volumes_and_tag_what_they_create(stack):
    evaluation, _ = stack
    templates = evaluation.of_type(LT)
    assert templates
    for lt in templates:
        md = lt.inputs["metadataOptions"]
        assert md["httpTokens"] == "required" and md["httpPutResponseHopLimit"] == 1 and md["httpEndpoint"] == "enabled"
        (root,) = lt.inputs["blockDeviceMappings"]
        assert root["ebs"]["encrypted"] == "true" and root["ebs"]["volumeType"] == "gp3"
        specs = {s["resourceType"]: s["tags"] for s in lt.inputs["tagSpecifications"]}
        assert {"instance", "volume", "network-interface"} <= set(specs)
        for resource_type, tags in specs.items():
            missing = set(contract.REQUIRED_COST_TAGS) - set(tags)
            assert not missing, f"{lt.name}: {resource_type}s created by the node group lack {missing}"
        assert "imageId" not in lt.inputs, "a custom AMI in the template would override the node group's GPU AMI type"


def test_every_taggable_resource_carries_the_cost_tags(stack):
    evaluation, cfg = stack
    taggable = [r for r in evaluation.resources if is_taggable(r.type)]
    assert len(taggable) > 30
    for r in taggable:
        missing = set(contract.REQUIRED_COST_TAGS) - set(r.tags)
        assert not missing, f"{r.type} {r.name} lacks {missing}"
        assert r.tags[contract.TAG_ENVIRONMENT] == cfg.environment
        team = next((t for t in cfg.teams if t.name == r.tags.get(contract.TAG_TEAM)), None)
        assert r.tags[contract.TAG_COST_CENTRE] == (team.cost_centre if team else cfg.tags.cost_centre)


def test_every_aws_resource_goes_through_the_provider_with_default_tags(stack):
    evaluation, cfg = stack
    (provider,) = evaluation.of_type("pulumi:providers:aws")
    assert provider.inputs["region"] == cfg.region
    default_tags = json.loads(provider.inputs["defaultTags"])["tags"] if isinstance(provider.inputs["defaultTags"], str) else provider.inputs["defaultTags"]["tags"]
    assert set(contract.REQUIRED_COST_TAGS) <= set(default_tags)
    for r in evaluation.resources:
        if r.type.startswith("aws:"):
            assert r.provider and f"::{provider.name}::" in r.provider, f"{r.type} {r.name} uses the default provider (no default tags, wrong region)"


def test_every_bucket_is_kms_encrypted_private_and_ownership_enforced(stack):
    evaluation, _ = stack
    buckets = {b.id for b in evaluation.of_type("aws:s3/bucket:Bucket")}
    assert len(buckets) == 3
    kms_keys = {k.state["arn"]: k for k in evaluation.of_type("aws:kms/key:Key")}

    def per_bucket(type_token):
        found = {r.inputs["bucket"]: r for r in evaluation.of_type(type_token)}
        assert set(found) == buckets, f"{type_token} missing for {buckets - set(found)}"
        return found

    for sse in per_bucket("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration").values():
        default = sse.inputs["rules"][0]["applyServerSideEncryptionByDefault"]
        assert default["sseAlgorithm"] == "aws:kms"
        assert kms_keys[default["kmsMasterKeyId"]].inputs["enableKeyRotation"] is True
    for pab in per_bucket("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").values():
        assert all(pab.inputs[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"))
    for own in per_bucket("aws:s3/bucketOwnershipControls:BucketOwnershipControls").values():
        assert own.inputs["rule"]["objectOwnership"] == "BucketOwnerEnforced"
    for policy in per_bucket("aws:s3/bucketPolicy:BucketPolicy").values():
        statement = json.loads(policy.inputs["policy"])["Statement"][0]
        assert statement["Effect"] == "Deny" and statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    for lifecycle in per_bucket("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").values():
        assert any("abortIncompleteMultipartUpload" in r for r in lifecycle.inputs["rules"])


@pytest.mark.parametrize("purpose", ["checkpoints", "artifacts"])
def test_checkpoint_and_artifact_buckets_are_versioned_and_expire_old_versions(stack, purpose):
    evaluation, cfg = stack
    checkpoints = next(b for b in evaluation.of_type("aws:s3/bucket:Bucket") if b.tags.get("purpose") == purpose)
    versioning = [v for v in evaluation.of_type("aws:s3/bucketVersioning:BucketVersioning") if v.inputs["bucket"] == checkpoints.id]
    assert versioning and versioning[0].inputs["versioningConfiguration"]["status"] == "Enabled"
    lifecycle = next(lc for lc in evaluation.of_type("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
                     if lc.inputs["bucket"] == checkpoints.id)
    expiry = [r["noncurrentVersionExpiration"]["noncurrentDays"] for r in lifecycle.inputs["rules"] if "noncurrentVersionExpiration" in r]
    assert expiry == [cfg.buckets.noncurrent_version_expiration_days]


def test_fsx_is_encrypted_reachable_from_nodes_and_linked_to_the_datasets_bucket(stack):
    evaluation, cfg = stack
    (fsx,) = evaluation.of_type("aws:fsx/lustreFileSystem:LustreFileSystem")
    assert fsx.inputs["deploymentType"] == cfg.fsx.deployment_type and fsx.inputs["storageCapacity"] == cfg.fsx.storage_capacity_gib
    assert fsx.inputs["fileSystemTypeVersion"] == "2.15"
    if cfg.fsx.deployment_type.startswith("PERSISTENT"):
        assert fsx.inputs["kmsKeyId"] in {k.state["arn"] for k in evaluation.of_type("aws:kms/key:Key")}
    else:
        assert "kmsKeyId" not in fsx.inputs, "AWS rejects a customer KMS key on scratch file systems"
    (sg_id,) = fsx.inputs["securityGroupIds"]
    sg = _by_id(evaluation, SG)[sg_id]
    for lo, hi in ((988, 988), (1018, 1023)):
        rule = next(r for r in sg.inputs["ingress"] if (r["fromPort"], r["toPort"]) == (lo, hi))
        assert rule["protocol"] == "tcp" and rule["self"] is True
        assert any(g.startswith(CLUSTER_SG_PREFIX) for g in rule["securityGroups"]), "nodes cannot mount Lustre"
    associations = evaluation.of_type("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
    if cfg.fsx.data_repository:
        (dra,) = associations
        bucket_names = evaluation.outputs["buckets"]
        assert dra.inputs["dataRepositoryPath"].startswith(f"s3://{bucket_names[cfg.fsx.data_repository.bucket]}/")
        assert dra.inputs["fileSystemPath"] == cfg.fsx.data_repository.file_system_path
        assert dra.inputs["s3"]["autoImportPolicy"]["events"] == ["NEW", "CHANGED", "DELETED"]
        # The datasets are read-only to teams on every path: FSx never writes the bucket back.
        assert dra.inputs["s3"]["autoExportPolicy"]["events"] == []
    else:
        assert associations == []


def test_cluster_encrypts_secrets_logs_everything_and_uses_access_entries(stack):
    evaluation, cfg = stack
    (cluster,) = evaluation.of_type("aws:eks/cluster:Cluster")
    assert cluster.inputs["name"] == cfg.cluster_name and cluster.inputs["version"] == cfg.cluster.version
    encryption = cluster.inputs["encryptionConfig"]
    assert encryption["resources"] == ["secrets"]
    key = next(k for k in evaluation.of_type("aws:kms/key:Key") if k.state["arn"] == encryption["provider"]["keyArn"])
    assert key.inputs["enableKeyRotation"] is True
    assert set(cluster.inputs["enabledClusterLogTypes"]) == {"api", "audit", "authenticator", "controllerManager", "scheduler"}
    assert cluster.inputs["accessConfig"]["authenticationMode"] == "API"
    vpc = cluster.inputs["vpcConfig"]
    assert vpc["endpointPrivateAccess"] == cfg.cluster.endpoint_private_access
    assert vpc["endpointPublicAccess"] == cfg.cluster.endpoint_public_access
    assert sorted(vpc.get("publicAccessCidrs") or []) == sorted(str(c) for c in cfg.cluster.public_access_cidrs)
    assert _subnet_azs(evaluation, vpc["subnetIds"]) == set(cfg.availability_zones)
    (logs,) = evaluation.of_type("aws:cloudwatch/logGroup:LogGroup")
    assert logs.inputs["name"] == f"/aws/eks/{cfg.cluster_name}/cluster" and logs.inputs["retentionInDays"] == cfg.cluster.log_retention_days
    entries = {e.inputs["principalArn"] for e in evaluation.of_type("aws:eks/accessEntry:AccessEntry")}
    admins = {a.inputs["principalArn"] for a in evaluation.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
              if a.inputs["policyArn"].endswith("/AmazonEKSClusterAdminPolicy")}
    members = {m for team in cfg.teams for m in team.members}  # their entries map them to team groups, without a policy
    assert admins == set(cfg.cluster.admin_principal_arns) and entries == admins | members


def test_addons_get_aws_permissions_through_irsa_and_the_cni_enforces_network_policy(stack):
    evaluation, _ = stack
    addons = {a.inputs["addonName"]: a for a in evaluation.of_type("aws:eks/addon:Addon")}
    assert set(addons) == {"vpc-cni", "coredns", "kube-proxy", "aws-ebs-csi-driver", "aws-fsx-csi-driver", "eks-node-monitoring-agent"}
    assert json.loads(addons["vpc-cni"].inputs["configurationValues"])["enableNetworkPolicy"] == "true"
    roles = {r.state["arn"]: r for r in evaluation.of_type("aws:iam/role:Role")}
    (oidc,) = evaluation.of_type("aws:iam/openIdConnectProvider:OpenIdConnectProvider")
    assert oidc.inputs["clientIdLists"] == ["sts.amazonaws.com"]
    issuer_host = oidc.inputs["url"].removeprefix("https://")
    for name, service_account in (("vpc-cni", "aws-node"), ("aws-ebs-csi-driver", "ebs-csi-controller-sa"), ("aws-fsx-csi-driver", "fsx-csi-controller-sa")):
        trust = json.loads(roles[addons[name].inputs["serviceAccountRoleArn"]].inputs["assumeRolePolicy"])["Statement"][0]
        assert trust["Action"] == "sts:AssumeRoleWithWebIdentity"
        assert trust["Principal"]["Federated"] == oidc.state["arn"]
        assert trust["Condition"]["StringEquals"][f"{issuer_host}:sub"] == f"system:serviceaccount:kube-system:{service_account}"
    node_role = next(r for r in evaluation.of_type("aws:iam/role:Role") if r.name.endswith("-nodes"))
    attached = {a.inputs["policyArn"] for a in evaluation.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment") if a.inputs["role"] == node_role.state["name"]}
    assert not any("CNI" in p for p in attached), "the CNI's permissions belong to its IRSA role, not to every pod's node"


def test_network_has_private_subnets_per_az_nat_per_config_and_an_s3_endpoint(stack):
    evaluation, cfg = stack
    subnets = evaluation.of_type(SUBNET)
    private = [s for s in subnets if s.tags.get("kubernetes.io/role/internal-elb") == "1"]
    public = [s for s in subnets if s.tags.get("kubernetes.io/role/elb") == "1"]
    assert {s.inputs["availabilityZone"] for s in private} == set(cfg.availability_zones) == {s.inputs["availabilityZone"] for s in public}
    assert all(s.inputs.get("mapPublicIpOnLaunch") is False for s in subnets)
    nats = evaluation.of_type("aws:ec2/natGateway:NatGateway")
    assert len(nats) == (len(cfg.availability_zones) if cfg.network.nat_gateways == "per-az" else 1)
    (endpoint,) = evaluation.of_type("aws:ec2/vpcEndpoint:VpcEndpoint")
    assert endpoint.inputs["serviceName"] == f"com.amazonaws.{cfg.region}.s3" and endpoint.inputs["vpcEndpointType"] == "Gateway"
    assert len(endpoint.inputs["routeTableIds"]) == len(cfg.availability_zones)


def test_outputs_are_the_platform_contract(stack):
    evaluation, cfg = stack
    out = evaluation.outputs
    assert out["cluster_name"] == cfg.cluster_name and out["oidc_issuer_url"].startswith("https://")
    assert "kubeconfig" in evaluation.secret_outputs
    kubeconfig = json.loads(out["kubeconfig"])
    assert kubeconfig["users"][0]["user"]["exec"]["args"][:4] == ["eks", "get-token", "--cluster-name", cfg.cluster_name]
    assert out["fsx"]["claim_name"] == contract.FSX_CLAIM_NAME and out["fsx"]["mount_name"] and out["fsx"]["dns_name"]
    assert set(out["buckets"]) == {"datasets", "checkpoints", "artifacts"}
    for group in cfg.node_groups:
        flavour = out["node_flavours"][group.flavour.value]
        assert group.name in flavour["node_groups"]
        assert flavour["labels"] == contract.flavour_traits(group.flavour).labels
    assert out["gpu_capacity"] == {f.value: n for f, n in cfg.gpu_capacity().items()}


def test_prod_has_the_shape_the_platform_promises():
    """The shipped prod stack: 3 AZs, NAT per AZ, p5 EFA on demand, diversified spot, on-demand GPU, PERSISTENT_2 + DRA."""
    from support.repo import STACKS

    from trainforge.stackconfig import load_stack_file

    cfg = load_stack_file(STACKS / "Pulumi.prod.yaml")
    assert len(cfg.availability_zones) == 3 and cfg.network.nat_gateways == "per-az"
    flavours = {g.flavour: g for g in cfg.node_groups}
    efa = flavours[Flavour.GPU_EFA]
    assert efa.instance_types == ["p5.48xlarge"] and efa.capacity == "on-demand"
    spot = [g for g in cfg.node_groups if g.flavour is Flavour.GPU_SPOT]
    assert len({t for g in spot for t in g.instance_types}) >= 3 and len({g.instances[0].gpu_model for g in spot}) >= 2, \
        "spot diversified across types and GPU models (one group per model)"
    assert Flavour.GPU_ONDEMAND in flavours
    assert cfg.fsx.deployment_type == "PERSISTENT_2" and cfg.fsx.data_repository is not None
    assert cfg.fsx_availability_zone == efa.availability_zone
    assert len(cfg.teams) == 3


def test_each_team_gets_an_irsa_role_confined_to_its_own_prefix(stack):
    evaluation, cfg = stack
    roles = {r.tags.get(contract.TAG_TEAM): r for r in evaluation.of_type("aws:iam/role:Role") if contract.TAG_TEAM in r.tags}
    assert set(roles) == {t.name for t in cfg.teams}
    policies = {p.inputs["role"]: json.loads(p.inputs["policy"]) for p in evaluation.of_type("aws:iam/rolePolicy:RolePolicy")}
    buckets = {b.tags["purpose"]: b.state["arn"] for b in evaluation.of_type("aws:s3/bucket:Bucket")}
    for team in cfg.teams:
        role = roles[team.name]
        assert role.tags[contract.TAG_COST_CENTRE] == team.cost_centre
        trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
        (sub,) = [v for k, v in trust["Condition"]["StringEquals"].items() if k.endswith(":sub")]
        assert sub == f"system:serviceaccount:{contract.namespace_name(team.name)}:{contract.TRAINING_SERVICE_ACCOUNT}"
        statements = {s["Sid"]: s for s in policies[role.id]["Statement"]}
        prefix = contract.team_s3_prefix(team.name)
        assert sorted(statements["ReadWriteOwnPrefix"]["Resource"]) == sorted(
            f"{buckets[k]}/{prefix}*" for k in ("checkpoints", "artifacts"))
        writes = [s for s in statements.values() if "s3:PutObject" in s["Action"]]
        assert all(res.endswith(f"/{prefix}*") for s in writes for res in s["Resource"]), "a team can write outside its prefix"
    assert evaluation.outputs["team_role_arns"] == {t.name: roles[t.name].state["arn"] for t in cfg.teams}


def test_the_cluster_handle_carries_a_kubernetes_provider_for_the_platform_layer(stack):
    """The platform layer creates its objects through one provider built from the cluster's own kubeconfig."""
    evaluation, cfg = stack
    (provider,) = evaluation.of_type("pulumi:providers:kubernetes")
    secret = provider.inputs["kubeconfig"]
    assert secret.get(pulumi.runtime.rpc._special_sig_key) == pulumi.runtime.rpc._special_secret_sig, "the kubeconfig reaches the provider as a secret"
    kubeconfig = json.loads(secret["value"])
    assert kubeconfig == json.loads(evaluation.outputs["kubeconfig"])
    assert provider.inputs["enableServerSideApply"] in (True, "true")
    cluster = evaluation.named("aws:eks/cluster:Cluster", cfg.cluster_name)
    assert kubeconfig["clusters"][0]["cluster"]["server"] == cluster.state["endpoint"]


def test_network_and_workload_addons_are_two_complete_components(stack):
    """Network add-ons go in before any node joins, workload add-ons after the system nodes: two components, each
    complete when it registers its outputs (no child added afterwards)."""
    evaluation, cfg = stack
    components = sorted(r.name for r in evaluation.of_type("trainforge:infra:Addons"))
    assert components == sorted([f"{cfg.cluster_name}-network-addons", f"{cfg.cluster_name}-workload-addons"])
    children = {c: sorted(a.inputs["addonName"] for a in evaluation.of_type("aws:eks/addon:Addon") if a.parent.endswith(f"::{c}"))
                for c in components}
    assert children[f"{cfg.cluster_name}-network-addons"] == ["kube-proxy", "vpc-cni"]
