"""A stack's monthly cost from what its program registers: each line priced from the dated tables (EC2 instances from
prices.yaml and `trainforge prices refresh`, services from service_prices.yaml), each with the assumption behind it.
An unknown price is named, never counted as zero."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from trainforge.pricing import PriceUnknown, price_table, service_prices
from trainforge.stackconfig import PlatformConfig, TeamConfig


@dataclass(frozen=True)
class Assumptions:
    gpu_utilisation: float = 0.25  # share of a GPU group's range above min_size in use over a month
    nat_gb_per_month: float = 1000.0  # data each NAT gateway processes (S3 traffic goes through the gateway endpoint)
    s3_gb_per_bucket: float = 1000.0
    ecr_gb: float = 50.0


@dataclass
class Line:
    item: str
    quantity: str
    monthly_usd: float | None  # None: a price the tables do not have (named in `unknown`)
    assumption: str
    at_min_usd: float | None = None
    at_max_usd: float | None = None


@dataclass
class Cost:
    lines: list[Line] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    as_of: dict[str, str] = field(default_factory=dict)

    @property
    def monthly_usd(self) -> float:
        return round(sum(line.monthly_usd for line in self.lines if line.monthly_usd is not None), 2)

    def by_item(self) -> dict[str, Line]:
        return {line.item: line for line in self.lines}

    def to_json(self) -> dict[str, Any]:
        return {"monthly_cost_usd": self.monthly_usd, "breakdown": [asdict(line) for line in self.lines], "unknown_prices": self.unknown,
                "prices_as_of": self.as_of}


def _of(resources: Iterable[Any], type_token: str) -> list[Any]:
    return [r for r in resources if r.type == type_token]


def monthly_cost(cfg: PlatformConfig, resources: list[Any], assume: Assumptions = Assumptions()) -> Cost:
    """`resources`: what the program registered (type, name, inputs); `cfg`: the stack it ran for."""
    services, instances = service_prices(), price_table()
    hours = services["hours_per_month"]
    cost = Cost(as_of={"services": str(services["as_of"]), "instances": instances.as_of})

    def add(item: str, quantity: str, monthly: float | None, assumption: str, **extra: float | None) -> None:
        cost.lines.append(Line(item, quantity, None if monthly is None else round(monthly, 2), assumption,
                               **{k: None if v is None else round(v, 2) for k, v in extra.items()}))
        if monthly is None:
            cost.unknown.append(item)

    for cluster in _of(resources, "aws:eks/cluster:Cluster"):
        support = (cluster.inputs.get("upgradePolicy") or {}).get("supportType", "STANDARD")
        add("EKS control plane", f"1 cluster ({support})", services["eks_cluster_hour"][support] * hours, f"{hours} h/month")

    nats = _of(resources, "aws:ec2/natGateway:NatGateway")
    add("NAT gateways", f"{len(nats)} gateways",
        len(nats) * (services["nat_gateway_hour"] * hours + services["nat_gateway_gb"] * assume.nat_gb_per_month),
        f"{hours} h/month each, {assume.nat_gb_per_month:.0f} GB processed per gateway per month")

    for group in cfg.node_groups:
        _node_group(cost, group, cfg.region, instances, services, hours, assume, add)

    fs = cfg.fsx
    table = services["fsx_lustre_gb_month"][fs.deployment_type]
    per_gb = table.get(fs.per_unit_storage_throughput) if isinstance(table, dict) else table
    tier = f", {fs.per_unit_storage_throughput} MB/s/TiB" if fs.per_unit_storage_throughput else ""
    add("FSx for Lustre", f"{fs.storage_capacity_gib} GiB {fs.deployment_type}{tier}",
        None if per_gb is None else fs.storage_capacity_gib * per_gb, "SSD storage; automatic backups (incremental) not included")

    buckets = _of(resources, "aws:s3/bucket:Bucket")
    add("S3 buckets", f"{len(buckets)} buckets", len(buckets) * assume.s3_gb_per_bucket * services["s3_standard_gb_month"],
        f"{assume.s3_gb_per_bucket:.0f} GB stored per bucket, S3 Standard; requests not included")

    for db in _of(resources, "aws:rds/instance:Instance"):
        hourly = services["rds_postgres_instance_hour"].get(db.inputs.get("instanceClass"))
        multi = 2 if db.inputs.get("multiAz") else 1
        storage = float(db.inputs.get("allocatedStorage") or 0)
        add(f"RDS {db.inputs.get('instanceClass')}", f"1 instance{' (Multi-AZ)' if multi == 2 else ''}, {storage:.0f} GB gp3",
            None if hourly is None else multi * (hourly * hours + storage * services["rds_gp3_gb_month"]), f"{hours} h/month, PostgreSQL")

    keys = _of(resources, "aws:kms/key:Key")
    add("KMS keys", f"{len(keys)} keys", len(keys) * services["kms_key_month"], "key storage; requests not included")
    repositories = _of(resources, "aws:ecr/repository:Repository")
    add("ECR", f"{len(repositories)} repositories", len(repositories) * assume.ecr_gb * services["ecr_gb_month"],
        f"{assume.ecr_gb:.0f} GB of images per repository")
    balancers = _of(resources, "aws:lb/loadBalancer:LoadBalancer")
    add("Load balancers", f"{len(balancers)} load balancers", len(balancers) * services["load_balancer_hour"] * hours,
        "registered by the program; Services of type LoadBalancer created by charts are not visible offline")
    return cost


def _node_group(cost: Cost, group, region, instances, services, hours, assume: Assumptions, add) -> None:
    """A group priced at its first instance type (a diversified group's preferred one), spot at the spot price."""
    instance = group.instance_types[0]
    try:
        quote = instances.quote(instance, region)
        hourly = quote.hourly(group.capacity)
    except PriceUnknown:
        hourly = None
    if group.has_gpus:
        expected = group.min_size + assume.gpu_utilisation * (group.max_size - group.min_size)
        basis = f"GPU group: min {group.min_size} + {assume.gpu_utilisation:.0%} of the range up to max {group.max_size}"
    else:
        expected = group.desired
        basis = f"CPU group at its desired size {group.desired}"
    price = "spot price" if group.capacity == "spot" else "on-demand"
    per_node = None if hourly is None else hourly * hours
    add(f"node group {group.name}", f"{expected:g} x {instance} (min {group.min_size}, max {group.max_size})",
        None if per_node is None else per_node * expected, f"{basis}; {hours} h/month at the {price} of {instance}",
        at_min_usd=None if per_node is None else per_node * group.min_size, at_max_usd=None if per_node is None else per_node * group.max_size)
    iops, throughput = group.root_performance
    per_volume = group.disk_gib * services["ebs_gp3_gb_month"] + max(0, (iops or 3000) - 3000) * services["ebs_gp3_iops_month"] \
        + max(0, (throughput or 125) - 125) * services["ebs_gp3_mibps_month"]
    add(f"root volumes {group.name}", f"{expected:g} x {group.disk_gib} GiB gp3", per_volume * expected,
        "one root volume per running node" + (f", {iops} IOPS / {throughput} MiB/s" if iops else ""),
        at_min_usd=per_volume * group.min_size, at_max_usd=per_volume * group.max_size)


def team_monthly_cost(cfg: PlatformConfig, team: TeamConfig, assume: Assumptions = Assumptions()) -> Cost:
    """A team stack's cost: its own resources (an IAM role, access entries, Kubernetes objects) cost nothing; what it
    spends is GPU time. Expected: `gpu_utilisation` of its quota in use, per GPU at the flavour's cheapest group (its first
    instance type, spot price for spot groups). At most: its quota and all it may borrow (`borrowing_limit`: Kueue admits
    that much more of the cohort's idle GPUs) running all month at the flavour's dearest group, and capped by its monthly
    budget (the budget controller holds its queue there)."""
    services, instances = service_prices(), price_table()
    hours = services["hours_per_month"]
    cost = Cost(as_of={"services": str(services["as_of"]), "instances": instances.as_of})
    for flavour in sorted({*team.gpu_quota, *team.borrowing_limit}, key=lambda f: f.value):
        gpus, borrowable = team.gpu_quota.get(flavour, 0), team.borrowing_limit.get(flavour, 0)
        quantity = f"{gpus} GPUs" + (f" + up to {borrowable} borrowed" if borrowable else "")
        per_gpu_hour = []
        for group in (g for g in cfg.node_groups if g.flavour is flavour and g.has_gpus):
            try:
                per_gpu_hour.append((instances.quote(group.instance_types[0], cfg.region).hourly(group.capacity) / group.gpus_per_node,
                                     group.instance_types[0]))
            except PriceUnknown:
                continue
        if not per_gpu_hour:
            cost.lines.append(Line(f"{flavour.value} quota", quantity, None, "no price for its node groups' instance types"))
            cost.unknown.append(f"{flavour.value} quota")
            continue
        (cheapest, instance), (dearest, dear_instance) = min(per_gpu_hour), max(per_gpu_hour)
        assumption = f"{assume.gpu_utilisation:.0%} of the quota in use, {hours} h/month at ${cheapest:.2f}/GPU-h ({instance})"
        if borrowable or dearest != cheapest:
            assumption += f"; at max: {gpus + borrowable} GPUs at ${dearest:.2f}/GPU-h ({dear_instance})"
        cost.lines.append(Line(f"{flavour.value} quota", quantity, round(assume.gpu_utilisation * gpus * cheapest * hours, 2), assumption,
                               at_min_usd=0.0, at_max_usd=round((gpus + borrowable) * dearest * hours, 2)))
    cost.lines.append(Line("monthly budget (cap)", f"team {team.name}", 0.0,
                           f"the budget controller holds the team's queue at ${team.monthly_budget_usd:,.0f} a month",
                           at_max_usd=round(team.monthly_budget_usd, 2)))
    return cost
