"""What an AWS/EKS review found would break after `pulumi up` on a real account, each pinned down on the resources
the real program registers under the mock engine, for every stack (and variants where a stack lacks the case)."""

from __future__ import annotations

import base64
import copy
import email
import json

import pytest
import yaml
from support.repo import REPO

from trainforge import catalog, contract
from trainforge.stackconfig import CONFIG_KEY, ConfigError, parse, read_stack_file

NG = "aws:eks/nodeGroup:NodeGroup"
LT = "aws:ec2/launchTemplate:LaunchTemplate"
ASG_TAG = "aws:autoscaling/tag:Tag"
CA = "k8s.io/cluster-autoscaler"


def raw_stack(name: str) -> dict:
    return copy.deepcopy(read_stack_file(REPO / "stacks" / f"Pulumi.{name}.yaml").config[CONFIG_KEY])


def evaluate_raw(raw: dict, environment: str):
    from trainforge.platform.components.offline import evaluate
    return evaluate({CONFIG_KEY: raw}, environment)


def group_of(cfg, node_group):
    label = node_group.inputs["labels"][contract.LABEL_NODE_GROUP]
    return next(g for g in cfg.node_groups if g.name == label)


# ---- 1. FSx reads and exports an SSE-KMS bucket through its service-linked role ---------------------------------

def test_the_fsx_service_linked_role_may_use_the_data_key(stack):
    evaluation, cfg = stack
    (fs,) = evaluation.of_type("aws:fsx/lustreFileSystem:LustreFileSystem")
    (key,) = [k for k in evaluation.of_type("aws:kms/key:Key") if k.name.endswith("-data")]
    grants = [g for g in evaluation.of_type("aws:kms/grant:Grant") if g.inputs["keyId"] == key.state["keyId"]]
    assert cfg.fsx.data_repository is not None, "both shipped stacks link FSx to the datasets bucket"
    (grant,) = grants
    role = grant.inputs["granteePrincipal"]
    assert role.endswith(f"/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_{fs.id}")
    assert {"Decrypt", "GenerateDataKey", "Encrypt"} <= set(grant.inputs["operations"])
    (dra,) = evaluation.of_type("aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation")
    assert evaluation.depends_on(grant, dra), "the role exists once the association does"


# ---- 2. admin access without a 409 -----------------------------------------------------------------------------

def test_admins_are_exactly_the_listed_principals_with_no_bootstrap_entry(stack):
    evaluation, cfg = stack
    (cluster,) = evaluation.of_type("aws:eks/cluster:Cluster")
    assert cluster.inputs["accessConfig"]["bootstrapClusterCreatorAdminPermissions"] is False
    admins = {a.inputs["principalArn"] for a in evaluation.of_type("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
              if a.inputs["policyArn"].endswith("/AmazonEKSClusterAdminPolicy")}
    assert admins == set(cfg.cluster.admin_principal_arns)
    entries = [e.inputs["principalArn"] for e in evaluation.of_type("aws:eks/accessEntry:AccessEntry")]
    assert len(entries) == len(set(entries)), "one access entry per principal: a second one fails the deploy with a 409"


def test_a_principal_with_two_access_entries_is_rejected():
    raw = raw_stack("dev")
    raw["teams"][0]["members"] = [raw["cluster"]["admin_principal_arns"][0]]
    with pytest.raises(ConfigError, match=r"teams\[0\]\.members: .* already an admin"):
        parse(raw, environment="dev", source="dev")
    raw = raw_stack("dev")
    raw["teams"][1]["members"] = list(raw["teams"][0]["members"])
    with pytest.raises(ConfigError, match=r"teams\[1\]\.members: .* also a member of team 'vision'"):
        parse(raw, environment="dev", source="dev")


def test_a_stack_without_admins_is_rejected():
    raw = raw_stack("dev")
    raw["cluster"]["admin_principal_arns"] = []
    with pytest.raises(ConfigError, match=r"cluster.admin_principal_arns: .*Fix: .*deployer"):
        parse(raw, environment="dev", source="dev")


# ---- 3. scale from zero ----------------------------------------------------------------------------------------

def asg_tags(evaluation, node_group) -> dict[str, str]:
    asg = node_group.state["resources"][0]["autoscalingGroups"][0]["name"]
    return {t.inputs["tag"]["key"]: t.inputs["tag"]["value"] for t in evaluation.of_type(ASG_TAG) if t.inputs["autoscalingGroupName"] == asg}


def test_every_group_asg_tells_the_autoscaler_its_labels_taints_and_extended_resources(stack):
    evaluation, cfg = stack
    for node_group in evaluation.of_type(NG):
        group = group_of(cfg, node_group)
        tags = asg_tags(evaluation, node_group)
        for key, value in node_group.inputs["labels"].items():
            assert tags[f"{CA}/node-template/label/{key}"] == value
        for taint in node_group.inputs.get("taints") or []:
            effect = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}[taint["effect"]]
            assert tags[f"{CA}/node-template/taint/{taint['key']}"] == f"{taint['value']}:{effect}"
        if group.has_gpus:
            assert tags[f"{CA}/node-template/resources/{contract.RESOURCE_GPU}"] == str(group.gpus_per_node)
        if group.efa:
            assert tags[f"{CA}/node-template/resources/{contract.RESOURCE_EFA}"] == str(catalog.efa_device_count(group.instances[0]))
        assert all(t.inputs["tag"]["propagateAtLaunch"] is False for t in evaluation.of_type(ASG_TAG))
        assert f"{CA}/{cfg.cluster_name}" in node_group.inputs["tags"] and f"{CA}/{contract.PROJECT}" not in node_group.inputs["tags"]


# ---- 4. Lustre clients accept the file servers' connections ----------------------------------------------------

def test_nodes_accept_lustre_traffic_from_the_file_system(stack):
    evaluation, _ = stack
    (fsx_sg,) = [g for g in evaluation.of_type("aws:ec2/securityGroup:SecurityGroup") if g.name.endswith("-lustre")]
    (cluster,) = evaluation.of_type("aws:eks/cluster:Cluster")
    cluster_sg = cluster.state["vpcConfig"]["clusterSecurityGroupId"]
    rules = {(r.inputs["fromPort"], r.inputs["toPort"]) for r in evaluation.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
             if r.inputs["securityGroupId"] == cluster_sg and r.inputs["referencedSecurityGroupId"] == fsx_sg.id and r.inputs["ipProtocol"] == "tcp"}
    assert rules == {(988, 988), (1018, 1023)}


# ---- 5. two AZs ------------------------------------------------------------------------------------------------

def test_a_one_az_stack_is_rejected_before_anything_is_created():
    raw = raw_stack("dev")
    raw["availability_zones"] = ["us-west-2a"]
    with pytest.raises(ConfigError, match=r"availability_zones: .*two.*Fix: "):
        parse(raw, environment="dev", source="dev")


# ---- 6. roles are complete before what uses them ---------------------------------------------------------------

def attachments_of(evaluation, role):
    """A role's managed-policy attachments and inline policies."""
    managed = [a for a in evaluation.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment") if a.inputs["role"] == role.state["name"]]
    return managed + [p for p in evaluation.of_type("aws:iam/rolePolicy:RolePolicy") if p.inputs["role"] == role.id]


def test_the_cluster_node_groups_and_addons_wait_for_their_roles_policies(stack):
    evaluation, _ = stack
    roles = {r.state["arn"]: r for r in evaluation.of_type("aws:iam/role:Role")}
    (cluster,) = evaluation.of_type("aws:eks/cluster:Cluster")
    users = [(cluster, roles[cluster.inputs["roleArn"]])]
    users += [(ng, roles[ng.inputs["nodeRoleArn"]]) for ng in evaluation.of_type(NG)]
    users += [(a, roles[a.inputs["serviceAccountRoleArn"]]) for a in evaluation.of_type("aws:eks/addon:Addon") if a.inputs.get("serviceAccountRoleArn")]
    for user, role in users:
        attachments = attachments_of(evaluation, role)
        assert attachments, role.name
        for attachment in attachments:
            assert evaluation.depends_on(user, attachment), f"{user.name} does not wait for {attachment.name}"


# ---- 7. GPU health reaches auto repair -------------------------------------------------------------------------

def test_the_node_monitoring_agent_runs_on_every_node(stack):
    evaluation, _ = stack
    (agent,) = [a for a in evaluation.of_type("aws:eks/addon:Addon") if a.inputs["addonName"] == "eks-node-monitoring-agent"]
    tolerations = json.loads(agent.inputs["configurationValues"])["nodeAgent"]["tolerations"]
    assert {"operator": "Exists"} in tolerations, "GPU and spot nodes are tainted: the agent must tolerate every taint"


# ---- 8. reserved GPU capacity ----------------------------------------------------------------------------------

def with_reservation(kind: str, **group_changes) -> dict:
    raw = raw_stack("prod")
    group = next(g for g in raw["node_groups"] if g["name"] == "p5-efa")
    group["capacity_reservation"] = {"id": "cr-0123456789abcdef0", "kind": kind}
    group.update(group_changes)
    return raw


@pytest.mark.parametrize("kind, capacity_type", [("capacity-block", "CAPACITY_BLOCK"), ("on-demand-reservation", "ON_DEMAND")])
def test_a_reserved_group_launches_into_its_reservation(kind, capacity_type):
    evaluation = evaluate_raw(with_reservation(kind), "prod")
    (node_group,) = [n for n in evaluation.of_type(NG) if n.inputs["labels"][contract.LABEL_NODE_GROUP] == "p5-efa"]
    assert node_group.inputs["capacityType"] == capacity_type
    template = next(t for t in evaluation.of_type(LT) if t.id == node_group.inputs["launchTemplate"]["id"])
    target = template.inputs["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target["capacityReservationId"] == "cr-0123456789abcdef0"
    assert (template.inputs.get("instanceMarketOptions") or {}).get("marketType") == ("capacity-block" if kind == "capacity-block" else None)


@pytest.mark.parametrize("change, message", [
    ({"capacity": "spot", "efa": False}, "capacity_reservation: a reservation is on-demand capacity"),
    ({"instance_types": ["g6e.12xlarge", "g6e.24xlarge"], "efa": False}, "capacity_reservation: a reservation holds one instance type"),
    ({"availability_zone": None, "efa": False}, "capacity_reservation: a reservation lives in one AZ"),
])
def test_impossible_reservations_are_rejected_with_the_fix(change, message):
    with pytest.raises(ConfigError, match=message):
        parse(with_reservation("capacity-block", **change), environment="prod", source="prod")


def test_a_malformed_reservation_id_is_rejected():
    raw = with_reservation("capacity-block")
    next(g for g in raw["node_groups"] if g["name"] == "p5-efa")["capacity_reservation"]["id"] = "reservation-1"
    with pytest.raises(ConfigError, match=r"capacity_reservation.id"):
        parse(raw, environment="prod", source="prod")


# ---- 9. the smaller ones ---------------------------------------------------------------------------------------

def test_node_groups_are_autonamed_so_a_replacement_creates_before_it_deletes(stack):
    evaluation, cfg = stack
    for node_group in evaluation.of_type(NG):
        assert "nodeGroupName" not in node_group.inputs
        assert node_group.inputs["nodeGroupNamePrefix"] == f"{group_of(cfg, node_group).name}-"


def test_the_cluster_names_its_support_type(stack):
    evaluation, cfg = stack
    (cluster,) = evaluation.of_type("aws:eks/cluster:Cluster")
    assert cluster.inputs["upgradePolicy"]["supportType"] == cfg.cluster.support_type == "STANDARD"


def test_persistent_file_systems_keep_automatic_backups():
    evaluation = evaluate_raw(raw_stack("prod"), "prod")
    (fs,) = evaluation.of_type("aws:fsx/lustreFileSystem:LustreFileSystem")
    assert fs.inputs["automaticBackupRetentionDays"] == 7
    raw = raw_stack("prod")
    raw["fsx"]["backup_retention_days"] = 30
    assert evaluate_raw(raw, "prod").of_type("aws:fsx/lustreFileSystem:LustreFileSystem")[0].inputs["automaticBackupRetentionDays"] == 30
    scratch = raw_stack("dev")
    scratch["fsx"]["backup_retention_days"] = 7
    with pytest.raises(ConfigError, match="fsx: SCRATCH_2 file systems take no backups"):
        parse(scratch, environment="dev", source="dev")


def test_large_roots_get_gp3_throughput_and_iops(stack):
    evaluation, cfg = stack
    for node_group in evaluation.of_type(NG):
        group = group_of(cfg, node_group)
        template = next(t for t in evaluation.of_type(LT) if t.id == node_group.inputs["launchTemplate"]["id"])
        ebs = template.inputs["blockDeviceMappings"][0]["ebs"]
        if group.disk_gib >= 500:
            assert ebs["iops"] >= 6000 and ebs["throughput"] >= 500
            assert ebs["throughput"] <= ebs["iops"] / 4 and ebs["iops"] <= 500 * group.disk_gib
        else:
            assert "iops" not in ebs and "throughput" not in ebs


def test_bad_gp3_settings_are_rejected():
    raw = raw_stack("dev")
    raw["node_groups"][1]["root_iops"] = 3200
    raw["node_groups"][1]["root_throughput_mibps"] = 1000
    with pytest.raises(ConfigError, match=r"root_throughput_mibps: .* at most 0.25 MiB/s per IOPS"):
        parse(raw, environment="dev", source="dev")


def nodeadm_config(template) -> dict | None:
    if not template.inputs.get("userData"):
        return None
    message = email.message_from_bytes(base64.b64decode(template.inputs["userData"]))
    (part,) = [p for p in message.walk() if p.get_content_type() == "application/node.eks.aws"]
    return yaml.safe_load(part.get_payload(decode=True))


def test_gpu_nodes_stripe_their_local_nvme_as_raid0(stack):
    evaluation, cfg = stack
    for node_group in evaluation.of_type(NG):
        group = group_of(cfg, node_group)
        template = next(t for t in evaluation.of_type(LT) if t.id == node_group.inputs["launchTemplate"]["id"])
        config = nodeadm_config(template)
        if all(i.local_nvme for i in group.instances):
            assert config["kind"] == "NodeConfig" and config["spec"]["instance"]["localStorage"]["strategy"] == "RAID0"
        else:
            assert config is None


def test_the_fsx_csi_driver_gets_only_what_static_provisioning_needs(stack):
    evaluation, _ = stack
    (addon,) = [a for a in evaluation.of_type("aws:eks/addon:Addon") if a.inputs["addonName"] == "aws-fsx-csi-driver"]
    role = next(r for r in evaluation.of_type("aws:iam/role:Role") if r.state["arn"] == addon.inputs["serviceAccountRoleArn"])
    assert not any("FSxFullAccess" in a.inputs["policyArn"] for a in evaluation.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                   if a.inputs["role"] == role.state["name"])
    policies = [json.loads(p.inputs["policy"]) for p in evaluation.of_type("aws:iam/rolePolicy:RolePolicy") if p.inputs["role"] == role.id]
    actions = {a for p in policies for s in p["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert actions == {"fsx:DescribeFileSystems"}


# ---- the runtime image -----------------------------------------------------------------------------------------

def test_each_stack_has_a_private_immutable_scanned_image_repository(stack):
    evaluation, cfg = stack
    (repo,) = evaluation.of_type("aws:ecr/repository:Repository")
    assert repo.inputs["name"] == contract.runtime_image_repository(cfg.environment)
    assert repo.inputs["imageTagMutability"] == "IMMUTABLE"
    assert repo.inputs["imageScanningConfiguration"]["scanOnPush"] is True
    (key,) = [k for k in evaluation.of_type("aws:kms/key:Key") if k.name.endswith("-data")]
    assert repo.inputs["encryptionConfigurations"][0] == {"encryptionType": "KMS", "kmsKey": key.state["arn"]}
    (lifecycle,) = evaluation.of_type("aws:ecr/lifecyclePolicy:LifecyclePolicy")
    assert lifecycle.inputs["repository"] == repo.inputs["name"] and json.loads(lifecycle.inputs["policy"])["rules"]
    assert evaluation.outputs["runtime_image_repository"] == repo.state["repositoryUrl"]


def test_the_provider_refuses_an_account_other_than_the_stacks(stack):
    evaluation, cfg = stack
    (provider,) = evaluation.of_type("pulumi:providers:aws")
    assert cfg.account_id is not None
    assert json.loads(provider.inputs["allowedAccountIds"]) == [cfg.account_id]  # provider config arrives JSON-encoded


def test_the_user_data_is_the_same_on_every_run():
    """A launch template whose user data changes per run gets a new version on every `pulumi up`: a rolling replacement."""
    from trainforge.infra.nodegroups import nodeadm_user_data
    from trainforge.stackconfig import load_stack_file
    group = next(g for g in load_stack_file(REPO / "stacks" / "Pulumi.prod.yaml").node_groups if g.name == "p5-efa")
    assert nodeadm_user_data(group) == nodeadm_user_data(group) is not None
