"""Managed node groups, each with its own launch template; EFA groups add a placement group and interfaces."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from trainforge import catalog, contract
from trainforge.stackconfig import NodeGroupConfig
from trainforge.infra.tags import named

# Kubernetes spells taint effects NoSchedule; the EKS API spells them NO_SCHEDULE.
EKS_TAINT_EFFECT = {"NoSchedule": "NO_SCHEDULE", "NoExecute": "NO_EXECUTE", "PreferNoSchedule": "PREFER_NO_SCHEDULE"}
# What the launch template stamps onto everything a node group creates.
PROPAGATED_TAG_RESOURCES = ("instance", "volume", "network-interface")
ROOT_DEVICE = "/dev/xvda"  # AL2023 EKS AMIs


def ami_type(group: NodeGroupConfig) -> str:
    return "AL2023_x86_64_NVIDIA" if group.has_gpus else "AL2023_x86_64_STANDARD"


def node_labels(group: NodeGroupConfig) -> dict[str, str]:
    return {**contract.flavour_traits(group.flavour).labels, contract.LABEL_NODE_GROUP: group.name}


def eks_taints(group: NodeGroupConfig) -> list[aws.eks.NodeGroupTaintArgs]:
    return [aws.eks.NodeGroupTaintArgs(key=t.key, value=t.value, effect=EKS_TAINT_EFFECT[t.effect])
            for t in contract.flavour_traits(group.flavour).taints]


class EfaSecurityGroup(pulumi.ComponentResource):
    """EFA's OS-bypass traffic is dropped unless the security group allows all traffic to and from itself."""

    security_group: aws.ec2.SecurityGroup

    def __init__(self, name: str, vpc_id: pulumi.Input[str], tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainforge:infra:EfaSecurityGroup", name, None, opts)
        everything_to_self = dict(protocol="-1", from_port=0, to_port=0, self=True)
        self.security_group = aws.ec2.SecurityGroup(
            name, vpc_id=vpc_id, description="EFA: all traffic between members of this group",
            ingress=[aws.ec2.SecurityGroupIngressArgs(**everything_to_self, description="EFA in from self")],
            egress=[aws.ec2.SecurityGroupEgressArgs(**everything_to_self, description="EFA out to self")],
            tags=named(tags, name), opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"security_group_id": self.security_group.id})


class NodePool(pulumi.ComponentResource):
    node_group: aws.eks.NodeGroup
    launch_template: aws.ec2.LaunchTemplate
    placement_group: aws.ec2.PlacementGroup | None

    def __init__(self, name: str, group: NodeGroupConfig, *, cluster_name: pulumi.Input[str], node_role_arn: pulumi.Input[str],
                 subnet_ids: list[pulumi.Input[str]], cluster_security_group_id: pulumi.Input[str],
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

        self.launch_template = aws.ec2.LaunchTemplate(
            name, description=f"trainforge node group {group.name} ({group.flavour.value})", update_default_version=True,
            # IMDSv2 only, and one hop: pods (one hop further) cannot borrow the node's role; they use IRSA.
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(http_endpoint="enabled", http_tokens="required",
                                                                       http_put_response_hop_limit=1),
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name=ROOT_DEVICE,
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(volume_size=group.disk_gib, volume_type="gp3", encrypted="true",
                                                                    delete_on_termination="true"),
            )],
            network_interfaces=network_interfaces, placement=placement,
            tag_specifications=[aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=r, tags=group_tags)
                                for r in PROPAGATED_TAG_RESOURCES],
            tags=group_tags, opts=child,
        )

        self.node_group = aws.eks.NodeGroup(
            name, cluster_name=cluster_name, node_group_name=group.name, node_role_arn=node_role_arn, subnet_ids=subnet_ids,
            instance_types=group.instance_types, capacity_type="SPOT" if group.capacity == "spot" else "ON_DEMAND",
            ami_type=ami_type(group),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(min_size=group.min_size, desired_size=group.desired,
                                                              max_size=group.max_size),
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(id=self.launch_template.id,
                                                                version=self.launch_template.latest_version.apply(str)),
            labels=node_labels(group), taints=eks_taints(group),
            # Let EKS replace GPU nodes whose accelerators fail health checks instead of leaving them to jobs.
            node_repair_config=aws.eks.NodeGroupNodeRepairConfigArgs(enabled=True) if group.has_gpus else None,
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            tags={**group_tags, f"k8s.io/cluster-autoscaler/{contract.PROJECT}": "owned", "k8s.io/cluster-autoscaler/enabled": "true"},
            # The autoscaler owns the current size after creation; re-applying config must not fight it.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["scalingConfig.desiredSize"]),
        )
        self.register_outputs({"node_group_name": self.node_group.node_group_name, "launch_template_id": self.launch_template.id})
