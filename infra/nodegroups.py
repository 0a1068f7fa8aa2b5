"""Managed node groups, each with its own launch template; EFA groups add a placement group and interfaces."""

from __future__ import annotations

import base64
from email.encoders import encode_7or8bit
from email.mime.application import MIMEApplication
from email.mime.multipart import MIMEMultipart
from typing import Any

import pulumi
import pulumi_aws as aws
import yaml

from trainforge import catalog, contract, nodes
from trainforge.infra.iam import Role
from trainforge.infra.tags import named
from trainforge.stackconfig import NodeGroupConfig

# What the launch template stamps onto everything a node group creates.
PROPAGATED_TAG_RESOURCES = ("instance", "volume", "network-interface")
ROOT_DEVICE = "/dev/xvda"  # AL2023 EKS AMIs


def ami_type(group: NodeGroupConfig) -> str:
    return "AL2023_x86_64_NVIDIA" if group.has_gpus else "AL2023_x86_64_STANDARD"


def eks_taints(group: NodeGroupConfig) -> list[aws.eks.NodeGroupTaintArgs]:
    return [aws.eks.NodeGroupTaintArgs(key=t.key, value=t.value, effect=contract.EKS_TAINT_EFFECTS[t.effect])
            for t in contract.flavour_traits(group.flavour).taints]


def autoscaler_discovery_tags(cluster_name: str) -> dict[str, str]:
    """The tags cluster-autoscaler's auto-discovery looks for (EKS also puts them on a managed group's ASG)."""
    return {f"{nodes.AUTOSCALER}/{cluster_name}": "owned", f"{nodes.AUTOSCALER}/enabled": "true"}


# Every container's rlimits on EFA nodes. libfabric's EFA provider pins its buffers: past RLIMIT_MEMLOCK the kernel
# refuses (ib_umem_get: -ENOMEM unless CAP_IPC_LOCK, which a `restricted` pod cannot have), and NCCL fails with
# "Libfabric error: (-12)". The limit reaches containers from containerd's: unlimited only where the AMI's EFA packages
# set systemd's DefaultLimitMEMLOCK=infinity (efa-config 01-efa.conf), so it is set here, for any AMI. The base runtime
# spec's list replaces nodeadm's, so its open-files limit (65536 / 1048576, nodeadm base-runtime-spec.json) comes too.
UNLIMITED = 2**64 - 1
EFA_CONTAINER_RLIMITS = [{"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 1048576},
                         {"type": "RLIMIT_MEMLOCK", "soft": UNLIMITED, "hard": UNLIMITED}]


def nodeadm_user_data(group: NodeGroupConfig) -> str | None:
    """AL2023 node configuration (MIME multipart, which EKS merges with its own): stripe the instance's NVMe disks as
    RAID0 for kubelet and containerd, so multi-GB images and scratch do not fill the root volume; on EFA groups, give
    containers unlimited locked memory (EFA_CONTAINER_RLIMITS)."""
    spec: dict = {}
    if all(i.local_nvme for i in group.instances):
        spec["instance"] = {"localStorage": {"strategy": "RAID0"}}
    if group.efa:
        spec["containerd"] = {"baseRuntimeSpec": {"process": {"rlimits": EFA_CONTAINER_RLIMITS}}}
    if not spec:
        return None
    node_config = {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec}
    # A fixed boundary: a random one (the default) changes the user data, hence the launch template's version, on every
    # `pulumi up`, and the node group would roll all its nodes each time.
    message = MIMEMultipart("mixed", boundary="==trainforge-nodeadm==")
    message.attach(MIMEApplication(yaml.safe_dump(node_config, sort_keys=False), "node.eks.aws", _encoder=encode_7or8bit))
    return base64.b64encode(message.as_bytes()).decode()


def capacity_type(group: NodeGroupConfig) -> str:
    if group.capacity_reservation is not None and group.capacity_reservation.kind == "capacity-block":
        return "CAPACITY_BLOCK"
    return "SPOT" if group.capacity == "spot" else "ON_DEMAND"


def asg_name(node_group: aws.eks.NodeGroup) -> pulumi.Output[str]:
    """The Auto Scaling group EKS made for a managed node group (one per group; its name is known once the group is)."""
    def first(resources: Any) -> str:
        groups = resources[0].autoscaling_groups if resources else None
        if not groups or not groups[0].name:
            raise ValueError(f"node group {node_group!r}: EKS reported no Auto Scaling group")
        return groups[0].name
    return node_group.resources.apply(first)


class EfaSecurityGroup(pulumi.ComponentResource):
    """EFA's OS-bypass traffic is dropped unless the security group allows all traffic to and from itself."""

    security_group: aws.ec2.SecurityGroup

    def __init__(self, name: str, vpc_id: pulumi.Input[str], tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainforge:infra:EfaSecurityGroup", name, None, opts)
        self.security_group = aws.ec2.SecurityGroup(
            name, vpc_id=vpc_id, description="EFA: all traffic between members of this group",
            ingress=[aws.ec2.SecurityGroupIngressArgs(protocol="-1", from_port=0, to_port=0, self=True, description="EFA in from self")],
            egress=[aws.ec2.SecurityGroupEgressArgs(protocol="-1", from_port=0, to_port=0, self=True, description="EFA out to self")],
            tags=named(tags, name), opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"security_group_id": self.security_group.id})


class NodePool(pulumi.ComponentResource):
    node_group: aws.eks.NodeGroup
    launch_template: aws.ec2.LaunchTemplate
    placement_group: aws.ec2.PlacementGroup | None

    def __init__(self, name: str, group: NodeGroupConfig, *, cluster_name: pulumi.Input[str], autoscaler_cluster_name: str,
                 node_role: Role, subnet_ids: list[pulumi.Input[str]], cluster_security_group_id: pulumi.Input[str],
                 efa_security_group_id: pulumi.Input[str] | None, tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainforge:infra:NodePool", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        group_tags = named(tags, name, **{contract.LABEL_FLAVOUR: group.flavour.value})

        self.placement_group = None
        network_interfaces = None
        placement = None
        if group.efa:
            if efa_security_group_id is None:
                raise ValueError(f"node group {group.name} has EFA but no EFA security group was given")
            # A cluster placement group packs the nodes onto one network spine: the point of EFA.
            self.placement_group = aws.ec2.PlacementGroup(name, strategy="cluster", tags=group_tags, opts=child)
            # The AZ comes from the node group's single subnet; the template names only the group.
            placement = aws.ec2.LaunchTemplatePlacementArgs(group_name=self.placement_group.name)
            # Interfaces in a launch template replace the node group's default security groups, so the cluster
            # security group goes on every interface next to the EFA one.
            groups = [cluster_security_group_id, efa_security_group_id]
            network_interfaces = [
                aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                    network_card_index=slot.network_card_index, device_index=slot.device_index,
                    interface_type=slot.interface_type, security_groups=groups,
                    associate_public_ip_address="false", delete_on_termination="true",
                    description=f"{name} card {slot.network_card_index} device {slot.device_index} ({slot.interface_type})",
                )
                for slot in catalog.efa_interface_layout(group.instances[0])
            ]

        iops, throughput = group.root_performance
        reservation = group.capacity_reservation
        user_data = nodeadm_user_data(group)
        self.launch_template = aws.ec2.LaunchTemplate(
            name, description=f"trainforge node group {group.name} ({group.flavour.value})", update_default_version=True,
            # IMDSv2 only, and one hop: pods (one hop further) cannot borrow the node's role; they use IRSA.
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(http_endpoint="enabled", http_tokens="required",
                                                                       http_put_response_hop_limit=1),
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name=ROOT_DEVICE,
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(volume_size=group.disk_gib, volume_type="gp3", encrypted="true",
                                                                    delete_on_termination="true", iops=iops, throughput=throughput),
            )],
            network_interfaces=network_interfaces, placement=placement, user_data=user_data,
            # Reserved capacity: an ODCR or a Capacity Block is targeted by id; a Capacity Block is also its own market.
            capacity_reservation_specification=aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
                capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                    capacity_reservation_id=reservation.id)) if reservation else None,
            instance_market_options=aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type="capacity-block")
            if reservation and reservation.kind == "capacity-block" else None,
            tag_specifications=[aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=r, tags=group_tags)
                                for r in PROPAGATED_TAG_RESOURCES],
            tags=group_tags, opts=child,
        )

        self.node_group = aws.eks.NodeGroup(
            # Autonamed from a prefix: a change that replaces the group creates the new one before deleting the old
            # (an explicit name forces delete-first, an outage of the system group).
            name, cluster_name=cluster_name, node_group_name_prefix=f"{group.name}-", node_role_arn=node_role.arn, subnet_ids=subnet_ids,
            instance_types=group.instance_types, capacity_type=capacity_type(group),
            ami_type=ami_type(group),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(min_size=group.min_size, desired_size=group.desired,
                                                              max_size=group.max_size),
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(id=self.launch_template.id,
                                                                version=self.launch_template.latest_version.apply(str)),
            labels=nodes.node_labels(group), taints=eks_taints(group),
            # Let EKS replace GPU nodes whose accelerators fail health checks instead of leaving them to jobs (it sees
            # GPU faults through the eks-node-monitoring-agent add-on).
            node_repair_config=aws.eks.NodeGroupNodeRepairConfigArgs(enabled=True) if group.has_gpus else None,
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            tags={**group_tags, **autoscaler_discovery_tags(autoscaler_cluster_name)},
            # The autoscaler owns the current size after creation; re-applying config must not fight it. Nodes join
            # only with a complete role (and leave before its policies go, on destroy).
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["scalingConfig.desiredSize"], depends_on=node_role.ready),
        )
        group_asg = asg_name(self.node_group)
        for key, value in nodes.template_tags(group).items():
            suffix = key.removeprefix(f"{nodes.AUTOSCALER}/node-template/").replace("/", "-")
            aws.autoscaling.Tag(f"{name}-{suffix}", autoscaling_group_name=group_asg,
                                tag=aws.autoscaling.TagTagArgs(key=key, value=value, propagate_at_launch=False),
                                opts=pulumi.ResourceOptions(parent=self.node_group))
        self.register_outputs({"node_group_name": self.node_group.node_group_name, "launch_template_id": self.launch_template.id})
