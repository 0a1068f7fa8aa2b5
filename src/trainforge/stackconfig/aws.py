"""The AWS slices of the stack config: network, cluster, FSx, buckets, tags (node groups: node_groups.py).

Each AWS component takes its own slice (infra/), so a component cannot reach into config it does not own.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trainforge import contract
from trainforge.stackconfig.fields import DNS_LABEL, IAM_PRINCIPAL_ARN, TAG_VALUE, StrictModel as _Model

CLOUDWATCH_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)
MAX_AZS = 3  # the VPC carving below gives each AZ a quarter of the VPC for nodes


class NetworkConfig(_Model):
    vpc_cidr: ipaddress.IPv4Network = ipaddress.IPv4Network("10.0.0.0/16")
    nat_gateways: Literal["single", "per-az"] = Field(
        "single", description="'single' is cheap (one NAT for all AZs); 'per-az' survives an AZ outage."
    )

    @field_validator("vpc_cidr")
    @classmethod
    def _vpc_size(cls, cidr: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
        if not 16 <= cidr.prefixlen <= 20:
            raise ValueError(
                f"{cidr} has prefix /{cidr.prefixlen}; pods take VPC addresses, so use a /16 to /20. "
                "Fix: e.g. vpc_cidr: 10.0.0.0/16"
            )
        return cidr

    def private_subnet_cidrs(self, count: int) -> list[str]:
        """One quarter of the VPC per AZ for nodes, pods and FSx."""
        return [str(s) for s in list(self.vpc_cidr.subnets(new_prefix=self.vpc_cidr.prefixlen + 2))[:count]]

    def public_subnet_cidrs(self, count: int) -> list[str]:
        """Small public subnets (NAT gateways, load balancers) carved from the last quarter."""
        last_quarter = list(self.vpc_cidr.subnets(new_prefix=self.vpc_cidr.prefixlen + 2))[-1]
        return [str(s) for s in list(last_quarter.subnets(new_prefix=last_quarter.prefixlen + 4))[:count]]


DOCUMENTATION_RANGES = ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")


class ClusterConfig(_Model):
    name: str | None = Field(None, pattern=DNS_LABEL, max_length=60, description="defaults to trainforge-<env>")
    version: str = Field(..., pattern=r"^1\.\d{2}$", description="EKS Kubernetes version, e.g. '1.33'")
    endpoint_private_access: bool = True
    endpoint_public_access: bool = True
    public_access_cidrs: list[ipaddress.IPv4Network] = Field(
        [], max_length=40,  # EKS accepts at most 40 public access CIDRs
        description="where `pulumi up` and kubectl reach the API from (the deployer's and the platform team's egress); "
                    "required by `pulumi up`")
    admin_principal_arns: list[str] = Field([], description="every cluster admin, the deployer included: the cluster creator gets no implicit access")
    log_retention_days: int = 30
    support_type: Literal["STANDARD", "EXTENDED"] = Field(
        "STANDARD", description="EXTENDED keeps a version past standard support, at a higher control-plane price")

    @field_validator("admin_principal_arns")
    @classmethod
    def _arns(cls, arns: list[str]) -> list[str]:
        if not arns:
            raise ValueError("no admins: the cluster creator gets no implicit access (a second entry for the same principal "
                             "would fail the deploy with a 409), so nobody could administer the cluster. Fix: list the deployer's "
                             "role ARN (e.g. the CI role that runs `pulumi up`) and the platform team's admin role")
        bad = [a for a in arns if not re.match(IAM_PRINCIPAL_ARN, a)]
        if bad:
            raise ValueError(f"{bad} are not IAM role/user ARNs. Fix: use arn:aws:iam::<12-digit account>:role/<name>")
        return arns

    @field_validator("log_retention_days")
    @classmethod
    def _retention(cls, days: int) -> int:
        if days not in CLOUDWATCH_RETENTION_DAYS:
            raise ValueError(f"{days} is not a CloudWatch retention period. Fix: one of {list(CLOUDWATCH_RETENTION_DAYS)}")
        return days

    @field_validator("public_access_cidrs")
    @classmethod
    def _reachable_cidrs(cls, cidrs: list[ipaddress.IPv4Network]) -> list[ipaddress.IPv4Network]:
        for cidr in cidrs:
            if cidr.prefixlen == 0:
                raise ValueError(f"{cidr} opens the API endpoint to the whole internet. Fix: your office/VPN/CI egress CIDRs (<egress IP>/32 for one machine)")
            if not cidr.is_global:
                kind = "a documentation range (RFC 5737) nobody's traffic comes from" if any(
                    cidr.subnet_of(ipaddress.IPv4Network(d)) for d in DOCUMENTATION_RANGES) else "not a public internet range"
                raise ValueError(f"{cidr} is {kind}: the public endpoint sees the deployer's public egress address. "
                                 "Fix: the CIDR `curl https://checkip.amazonaws.com` prints where pulumi and kubectl run, as <ip>/32")
        return cidrs

    @model_validator(mode="after")
    def _endpoint_access(self) -> ClusterConfig:
        if not self.endpoint_public_access:
            raise ValueError(
                "endpoint_public_access: false makes the API answer only inside the VPC, and this same program creates that VPC: "
                "the first `pulumi up` applies the Kubernetes layer from where it runs and could never reach it. Fix: "
                "endpoint_public_access: true with public_access_cidrs limited to the deployer's and the platform team's egress "
                "(nodes and pods keep using the private endpoint)")
        if not self.endpoint_private_access:
            raise ValueError("endpoint_private_access: false sends the nodes' API traffic out through the NAT gateways to the "
                             "public endpoint, which then has to allow them too. Fix: endpoint_private_access: true")
        return self

    def deploy_blockers(self) -> list[str]:
        """What stops a real `pulumi up` though the config is well-formed (the offline plan shows them)."""
        if not self.public_access_cidrs:
            return ["cluster.public_access_cidrs: not set, so EKS would open the public endpoint to 0.0.0.0/0, which trainforge "
                    "refuses. Fix: pulumi config set --path 'trainforge:platform.cluster.public_access_cidrs[0]' <your egress IP>/32 "
                    "(`curl https://checkip.amazonaws.com`), and one entry per office/VPN/CI range"]
        return []


FSX_FIRST_STEPS = (1200, 2400)
FSX_INCREMENT = {"SCRATCH_1": 3600, "SCRATCH_2": 2400, "PERSISTENT_1": 2400, "PERSISTENT_2": 2400}
FSX_THROUGHPUT_TIERS: dict[str, tuple[int, ...]] = {"PERSISTENT_1": (50, 100, 200), "PERSISTENT_2": (125, 250, 500, 1000)}


class DataRepositoryConfig(_Model):
    bucket: Literal["datasets", "checkpoints", "artifacts"] = "datasets"
    prefix: str = Field("", pattern=r"^[A-Za-z0-9!_.*'()/-]*$", description="key prefix inside the bucket")
    file_system_path: str = Field("/datasets", pattern=r"^/[A-Za-z0-9_./-]*$")
    auto_import: bool = True
    auto_export: bool = Field(False, description="FSx writes changes back to the bucket; never for `datasets`, which teams "
                                                 "may only read")

    @model_validator(mode="after")
    def _datasets_read_only(self) -> DataRepositoryConfig:
        if self.bucket == "datasets" and self.auto_export:
            raise ValueError("auto_export: the datasets bucket is read-only to teams; exporting from FSx would let any job "
                             "that can write the file system change or delete it. Fix: remove auto_export (load datasets "
                             "into the bucket, FSx imports them)")
        parts = [p for p in self.file_system_path.split("/") if p]
        if "//" in self.file_system_path or any(p in (".", "..") for p in parts):
            raise ValueError(f"file_system_path: {self.file_system_path!r} has an empty, '.' or '..' segment, which FSx and the "
                             "teams' fileset mounts read differently from this check. Fix: the plain path, e.g. /datasets")
        if not parts or parts[0] == contract.FSX_TEAMS_DIR:
            raise ValueError(f"file_system_path: {self.file_system_path!r} would put the repository over the teams' directories "
                             f"(/{contract.FSX_TEAMS_DIR}/<team>). Fix: a directory of its own, e.g. /datasets")
        return self


class FsxConfig(_Model):
    deployment_type: Literal["SCRATCH_1", "SCRATCH_2", "PERSISTENT_1", "PERSISTENT_2"]
    storage_capacity_gib: int = Field(..., gt=0)
    per_unit_storage_throughput: int | None = Field(None, description="MB/s per TiB; persistent types only")
    data_repository: DataRepositoryConfig | None = None
    backup_retention_days: int | None = Field(None, ge=0, le=90, description="daily automatic backups kept; PERSISTENT only, default 7")
    team_quota_gib: int | None = Field(None, gt=0, le=10**7, description="GiB each team's files may hold (a Lustre group quota "
                                       "on the team's gid) unless the team sets fsx_quota_gib; unset: no quota, and one team "
                                       "can fill the file system for every team")

    @property
    def datasets_path(self) -> str:
        """The file system's directory teams read datasets from (mounted read-only at /fsx/datasets)."""
        if self.data_repository is not None and self.data_repository.bucket == "datasets":
            return self.data_repository.file_system_path.rstrip("/")
        return f"/{contract.FSX_DATASETS_DIR}"

    @field_validator("storage_capacity_gib")
    @classmethod
    def _capacity_step(cls, gib: int, info: Any) -> int:
        deployment = info.data.get("deployment_type")
        if deployment is None:
            return gib
        step = FSX_INCREMENT[deployment]
        if gib in FSX_FIRST_STEPS or (gib >= step and gib % step == 0):
            return gib
        # The valid capacities next to it, by arithmetic: a list of every multiple up to a mistyped 10**12 GiB would
        # take tens of GB (the config fuzz test's hypothesis once drew it, and the suite's worker was OOM-killed).
        multiples = {step * k for k in (gib // step + 1, gib // step + 2)} | ({step * ((gib - 1) // step)} if gib > step else set())
        valid = sorted({*FSX_FIRST_STEPS, *multiples})
        below = [v for v in valid if v < gib][-1:]
        above = [v for v in valid if v > gib][: 2 - len(below)]
        raise ValueError(
            f"{gib} GiB is not a valid {deployment} capacity: use 1200, 2400 or a multiple of {step} GiB. "
            f"Fix: e.g. {' or '.join(str(v) for v in below + above)}"
        )

    @model_validator(mode="after")
    def _throughput_and_repository(self) -> FsxConfig:
        tiers = FSX_THROUGHPUT_TIERS.get(self.deployment_type)
        t = self.per_unit_storage_throughput
        if tiers is None and t is not None:
            raise ValueError(f"per_unit_storage_throughput: {self.deployment_type} has no throughput tiers, got {t}. Fix: remove it, or use a PERSISTENT deployment type")
        if tiers is not None and t not in tiers:
            raise ValueError(
                f"per_unit_storage_throughput: {t} is not a {self.deployment_type} tier. Fix: one of {list(tiers)} (MB/s per TiB)"
            )
        if not self.persistent and self.backup_retention_days:
            raise ValueError(f"{self.deployment_type} file systems take no backups (backup_retention_days: {self.backup_retention_days}). "
                             "Fix: remove backup_retention_days, or use PERSISTENT_2")
        if self.data_repository is not None and self.deployment_type == "SCRATCH_1":
            raise ValueError("data_repository: SCRATCH_1 file systems take no data repository association. Fix: use SCRATCH_2 or PERSISTENT_2")
        return self


    @property
    def persistent(self) -> bool:
        return self.deployment_type.startswith("PERSISTENT")

    @property
    def backup_days(self) -> int | None:
        """Automatic backup retention: as configured on persistent file systems (7 by default); scratch has none."""
        if not self.persistent:
            return None
        return 7 if self.backup_retention_days is None else self.backup_retention_days


class BucketsConfig(_Model):
    force_destroy: bool = Field(False, description="lets `pulumi destroy` delete non-empty buckets; dev only")
    noncurrent_version_expiration_days: int = Field(30, ge=1, le=3650)
    abort_incomplete_multipart_days: int = Field(7, ge=1, le=365)


class TagsConfig(_Model):
    cost_centre: str = Field(..., min_length=1, max_length=256, pattern=TAG_VALUE)
    owner: str = Field(..., min_length=1, max_length=256, pattern=TAG_VALUE)
    extra: dict[str, str] = {}
