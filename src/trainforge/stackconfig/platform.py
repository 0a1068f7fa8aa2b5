"""The whole stack: `trainforge:platform` as one typed object, with the rules that span its slices.

Imports neither pulumi nor torch: the submitter reads a stack file offline (team quotas, node flavours), the
Pulumi program reads the same model from the stack's config.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter

from pydantic import Field, field_validator, model_validator

from trainforge import contract
from trainforge.contract import Flavour
from trainforge.stackconfig.aws import MAX_AZS, BucketsConfig, ClusterConfig, FsxConfig, NetworkConfig, TagsConfig
from trainforge.stackconfig.fields import DNS_LABEL, StrictModel as _Model
from trainforge.stackconfig.kubernetes import KubernetesConfig
from trainforge.stackconfig.node_groups import NodeGroupConfig
from trainforge.stackconfig.teams import TeamConfig

# Instance families EC2 sells Capacity Blocks for ML for (the accelerated training instances).
CAPACITY_BLOCK_FAMILIES = ("p4d.", "p4de.", "p5.", "p5e.", "p5en.", "p6-b200.", "trn1.", "trn2.")


class PlatformConfig(_Model):
    environment: str = Field(..., pattern=DNS_LABEL, max_length=20)
    region: str = Field(..., pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
    account_id: str | None = Field(None, pattern=r"^\d{12}$", description="the AWS account the stack belongs to: "
                                   "`pulumi up` refuses any other, and jobs default to this account's runtime image")
    availability_zones: list[str] = Field(..., min_length=1, max_length=MAX_AZS)
    network: NetworkConfig = NetworkConfig()
    cluster: ClusterConfig
    node_groups: list[NodeGroupConfig] = Field(..., min_length=1)
    fsx: FsxConfig
    buckets: BucketsConfig = BucketsConfig()
    tags: TagsConfig
    kubernetes: KubernetesConfig = KubernetesConfig()
    teams: list[TeamConfig] = []

    @field_validator("availability_zones")
    @classmethod
    def _two_zones(cls, zones: list[str]) -> list[str]:
        if len(zones) < 2:
            raise ValueError(f"{zones}: EKS needs its control plane's subnets in at least two AZs and rejects one, after the "
                             "VPC and NAT gateways already exist. Fix: list two or three AZs of the region")
        return zones

    @model_validator(mode="after")
    def _cross_field_rules(self) -> PlatformConfig:
        problems = [*self._zone_problems(), *self._node_group_problems(), *self._team_problems()]
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _zone_problems(self) -> list[str]:
        out = []
        for az in self.availability_zones:
            if not re.fullmatch(re.escape(self.region) + r"[a-z]", az):
                out.append(f"availability_zones: {az!r} is not an AZ of {self.region}. Fix: e.g. {self.region}a")
        dupes = [az for az, n in Counter(self.availability_zones).items() if n > 1]
        if dupes:
            out.append(f"availability_zones: {dupes} listed twice. Fix: list each AZ once")
        return out

    def _node_group_problems(self) -> list[str]:
        out = []
        blocks_elsewhere = [g.name for g in self.node_groups if g.capacity_reservation is not None
                            and g.capacity_reservation.kind == "capacity-block" and not g.instance_types[0].startswith(CAPACITY_BLOCK_FAMILIES)]
        if blocks_elsewhere:
            out.append(f"node_groups: {blocks_elsewhere} use a capacity-block reservation, which EC2 sells for {list(CAPACITY_BLOCK_FAMILIES)} "
                       "instances only. Fix: an on-demand-reservation, or a capacity-block instance type")
        dupes = [n for n, c in Counter(g.name for g in self.node_groups).items() if c > 1]
        if dupes:
            out.append(f"node_groups: names {dupes} are used twice. Fix: give every node group its own name")
        for i, group in enumerate(self.node_groups):
            if group.availability_zone is not None and group.availability_zone not in self.availability_zones:
                out.append(
                    f"node_groups[{i}].availability_zone: {group.availability_zone!r} is not in this stack's availability_zones "
                    f"{self.availability_zones}. Fix: use one of them or add it to availability_zones"
                )
        efa_zones = {g.availability_zone for g in self.node_groups if g.efa}
        if len(efa_zones) > 1:
            out.append(f"node_groups: EFA groups sit in {sorted(z or 'the first zone' for z in efa_zones)}, but FSx lives in one AZ next to them. Fix: put every EFA group in the same AZ")
        if not any(g.flavour is Flavour.SYSTEM and g.min_size >= 1 for g in self.node_groups):
            out.append(
                "node_groups: no CPU group with min_size >= 1, so cluster add-ons (CoreDNS, CSI controllers) have nowhere to run: "
                "GPU nodes are tainted. Fix: add a system group, e.g. {name: system, instance_types: [m6i.xlarge], capacity: on-demand, min_size: 2, max_size: 4}"
            )
        return out

    def _team_problems(self) -> list[str]:
        return team_problems(self, [(f"teams[{i}]", team) for i, team in enumerate(self.teams)])

    def gpu_capacity(self) -> dict[Flavour, int]:
        """Most GPUs each flavour can offer at once (sum of max_size × GPUs per node)."""
        out: dict[Flavour, int] = {}
        for group in self.node_groups:
            if group.has_gpus:
                out[group.flavour] = out.get(group.flavour, 0) + group.max_gpus
        return out

    def image_prefixes(self, deployed_image: str | None = None) -> list[str]:
        """Where team jobs may pull images from: the account's ECR registry (when the stack names its account), the
        configured runtime image's and the deployed one's repositories, and `kubernetes.image_registries`."""
        out = [f"{self.account_id}.dkr.ecr.{self.region}.amazonaws.com/"] if self.account_id else []
        for image in (self.kubernetes.runtime_image, deployed_image):
            out += contract.image_repository_prefixes(image) if image else []
        out += self.kubernetes.image_registries
        return list(dict.fromkeys(out))

    def fsx_quota_gib(self, team: TeamConfig) -> int | None:
        """The team's FSx group quota: its own, else the platform's default (None: no quota)."""
        return team.fsx_quota_gib if team.fsx_quota_gib is not None else self.fsx.team_quota_gib

    def settings_digest(self) -> str:
        """A digest of the platform's settings without its teams: what a team stack checks the deployed platform against
        (adding a team inline does not change it, nor does the deployer's CIDR, which `pulumi config set` gives at deploy)."""
        canonical = self.model_dump_json(exclude={"teams": True, "cluster": {"public_access_cidrs"}})
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def cluster_name(self) -> str:
        return self.cluster.name or f"trainforge-{self.environment}"

    @property
    def fsx_availability_zone(self) -> str:
        """FSx sits next to the EFA nodes (cross-AZ Lustre traffic is slow and billed); else in the first AZ."""
        for group in self.node_groups:
            if group.efa:
                return group.availability_zone  # type: ignore[return-value]  # validated non-None for EFA
        return self.availability_zones[0]


def team_problems(platform: PlatformConfig, teams: list[tuple[str, TeamConfig]]) -> list[str]:
    """The rules a cohort of teams obeys together, whether the teams are listed in the platform stack or each has its own
    team stack: each is labelled by where it is declared (`teams[1]`, or a team stack file)."""
    out = []
    dupes = [n for n, c in Counter(t.name for _, t in teams).items() if c > 1]
    if dupes:
        declared = {n: [label for label, t in teams if t.name == n] for n in dupes}
        out.append(f"teams: names {dupes} are used twice ({declared}; a team is a namespace). Fix: give every team its own "
                   "name, and declare each team once: in the platform stack or in its own team stack")
    ids: dict[int, str] = {}
    for label, team in teams:
        posix_id = contract.team_posix_id(team.name)
        if ids.setdefault(posix_id, team.name) != team.name:
            out.append(f"{label}.name: {team.name!r} has the same POSIX id ({posix_id}) as team {ids[posix_id]!r}: "
                       "they could read each other's files. Fix: rename one of them")
    # Each principal gets exactly one EKS access entry: a second one for the same principal fails the deploy (409).
    seen: dict[str, str] = {}
    for label, team in teams:
        for member in team.members:
            if member in platform.cluster.admin_principal_arns:
                out.append(f"{label}.members: {member} is already an admin (cluster.admin_principal_arns): a second access "
                           "entry for it fails the deploy. Fix: leave admins out of team members")
            elif member in seen and seen[member] != team.name:
                out.append(f"{label}.members: {member} is also a member of team {seen[member]!r}: one principal, one access "
                           "entry, one team. Fix: give the person one team (or a separate role per team)")
            seen.setdefault(member, team.name)
    capacity = platform.gpu_capacity()
    for label, team in teams:
        for flavour, gpus in team.gpu_quota.items():
            have = capacity.get(flavour, 0)
            if gpus > have:
                groups = [g.name for g in platform.node_groups if g.flavour is flavour]
                where = f"node groups {groups} reach at most {have} GPUs" if groups else f"no node group provides {flavour.value}"
                out.append(
                    f"{label}.gpu_quota.{flavour.value}: team {team.name!r} asks for {gpus} GPUs but {where}. "
                    f"Fix: lower the quota to <= {have} or raise max_size of a {flavour.value} group"
                )
    out += cohort_capacity_problems(platform, [team for _, team in teams])
    out += fsx_quota_problems(platform, teams)
    return out


def fsx_quota_problems(platform: PlatformConfig, teams: list[tuple[str, TeamConfig]]) -> list[str]:
    """The teams' FSx quotas must fit the file system together: then a team within its quota always finds room, whatever
    the others write (over-committed, the first team to fill it stops every team's checkpoints)."""
    capacity = platform.fsx.storage_capacity_gib
    quotas = [(label, team, platform.fsx_quota_gib(team)) for label, team in teams]
    out = [f"{label}.fsx_quota_gib: team {team.name!r} may hold {gib} GiB but the file system has {capacity} GiB. "
           f"Fix: at most {capacity}, or raise fsx.storage_capacity_gib"
           for label, team, gib in quotas if gib is not None and gib > capacity]
    total = sum(gib for _, _, gib in quotas if gib is not None)
    if not out and total > capacity:
        holders = sorted(((t.name, g) for _, t, g in quotas if g), key=lambda h: -h[1])
        shares = ", ".join(f"{name} {gib}" for name, gib in holders[:SHARES_SHOWN])
        if len(holders) > SHARES_SHOWN:
            shares += f", and {len(holders) - SHARES_SHOWN} more teams"
        out.append(f"teams: the teams' FSx quotas add up to {total} GiB ({shares}) but the file system has {capacity} GiB: one "
                   f"team could fill it while another is within its quota. Fix: lower fsx_quota_gib (or fsx.team_quota_gib, "
                   f"the default) by {total - capacity} GiB in all, or raise fsx.storage_capacity_gib")
    return out


SHARES_SHOWN = 12  # teams named in a capacity problem, largest quotas first: with a hundred teams the rest is a count


def cohort_capacity_problems(platform: PlatformConfig, teams: list[TeamConfig]) -> list[str]:
    """Kueue's nominal quotas are guarantees: a job within its team's quota is admitted and its pods must then find nodes.
    If the cohort's quotas of a flavour add up to more GPUs than its node groups reach, an admitted job can wait for nodes
    that never come (the autoscaler stops at max_size, and Kueue preempts nobody for a team within its own quota)."""
    out = []
    capacity = platform.gpu_capacity()
    for flavour in sorted({f for team in teams for f in team.gpu_quota}, key=lambda f: f.value):
        total = sum(team.gpu_quota.get(flavour, 0) for team in teams)
        have = capacity.get(flavour, 0)
        if total > have >= max(team.gpu_quota.get(flavour, 0) for team in teams):
            holders = sorted((t for t in teams if t.gpu_quota.get(flavour)), key=lambda t: -t.gpu_quota[flavour])
            shares = ", ".join(f"{t.name} {t.gpu_quota[flavour]}" for t in holders[:SHARES_SHOWN])
            if len(holders) > SHARES_SHOWN:
                shares += f", and {len(holders) - SHARES_SHOWN} more teams"
            out.append(f"teams: the cohort's {flavour.value} quotas add up to {total} GPUs ({shares}) but its node groups reach at "
                       f"most {have}: a job admitted within its quota could wait for nodes that never come. Fix: lower quotas by "
                       f"{total - have} GPUs in all (a team with a borrowing_limit still runs on the cohort's idle GPUs, without "
                       f"a guarantee), or raise max_size of a {flavour.value} group")
    return out
