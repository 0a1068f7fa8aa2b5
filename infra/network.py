"""VPC with a private subnet per AZ (nodes, pods, FSx) and small public subnets for NAT and load balancers."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from trainforge.stackconfig import NetworkConfig
from trainforge.infra.tags import named


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    private_subnet_ids: dict[str, pulumi.Output[str]]  # by AZ
    public_subnet_ids: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, network: NetworkConfig, *, availability_zones: list[str], region: str, cluster_name: str,
                 tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("trainforge:infra:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        azs = availability_zones
        cluster_tag = {f"kubernetes.io/cluster/{cluster_name}": "shared"}

        vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block=str(network.vpc_cidr), enable_dns_hostnames=True,
                          enable_dns_support=True, tags=named(tags, f"{name}-vpc"), opts=child)
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags=named(tags, f"{name}-igw"), opts=child)

        public_rt = aws.ec2.RouteTable(
            f"{name}-public", vpc_id=vpc.id, tags=named(tags, f"{name}-public"), opts=child,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)],
        )
        self.public_subnet_ids, self.private_subnet_ids = {}, {}
        public_cidrs = network.public_subnet_cidrs(len(azs))
        private_cidrs = network.private_subnet_cidrs(len(azs))
        for az, cidr in zip(azs, public_cidrs):
            subnet = aws.ec2.Subnet(
                f"{name}-public-{az}", vpc_id=vpc.id, cidr_block=cidr, availability_zone=az, map_public_ip_on_launch=False,
                tags=named(tags, f"{name}-public-{az}", **cluster_tag, **{"kubernetes.io/role/elb": "1"}), opts=child,
            )
            aws.ec2.RouteTableAssociation(f"{name}-public-{az}", subnet_id=subnet.id, route_table_id=public_rt.id, opts=child)
            self.public_subnet_ids[az] = subnet.id

        nat_azs = azs if network.nat_gateways == "per-az" else azs[:1]
        nat_ids = {}
        for az in nat_azs:
            eip = aws.ec2.Eip(f"{name}-nat-{az}", domain="vpc", tags=named(tags, f"{name}-nat-{az}"), opts=child)
            nat = aws.ec2.NatGateway(
                f"{name}-nat-{az}", allocation_id=eip.allocation_id, subnet_id=self.public_subnet_ids[az],
                tags=named(tags, f"{name}-nat-{az}"), opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]),
            )
            nat_ids[az] = nat.id

        private_route_tables = []
        for az, cidr in zip(azs, private_cidrs):
            subnet = aws.ec2.Subnet(
                f"{name}-private-{az}", vpc_id=vpc.id, cidr_block=cidr, availability_zone=az, map_public_ip_on_launch=False,
                tags=named(tags, f"{name}-private-{az}", **cluster_tag, **{"kubernetes.io/role/internal-elb": "1"}), opts=child,
            )
            rt = aws.ec2.RouteTable(
                f"{name}-private-{az}", vpc_id=vpc.id, tags=named(tags, f"{name}-private-{az}"), opts=child,
                routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat_ids.get(az, nat_ids[nat_azs[0]]))],
            )
            aws.ec2.RouteTableAssociation(f"{name}-private-{az}", subnet_id=subnet.id, route_table_id=rt.id, opts=child)
            self.private_subnet_ids[az] = subnet.id
            private_route_tables.append(rt.id)

        # Checkpoints and datasets go to S3 from private subnets: a gateway endpoint keeps that traffic off
        # the NAT gateways (no per-GB NAT charge, no NAT bandwidth ceiling).
        aws.ec2.VpcEndpoint(
            f"{name}-s3", vpc_id=vpc.id, service_name=f"com.amazonaws.{region}.s3", vpc_endpoint_type="Gateway",
            route_table_ids=private_route_tables, tags=named(tags, f"{name}-s3"), opts=child,
        )
        self.vpc_id = vpc.id
        self.register_outputs({"vpc_id": vpc.id, "private_subnet_ids": self.private_subnet_ids, "public_subnet_ids": self.public_subnet_ids})
