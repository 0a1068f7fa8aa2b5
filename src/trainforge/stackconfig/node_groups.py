"""The node groups slice of the stack config: what each EKS managed node group launches (instance types, capacity,
sizes, root volume, EFA, capacity reservations) and the rules the cluster-autoscaler and EC2 impose on it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from trainforge import catalog
from trainforge.contract import Flavour
from trainforge.stackconfig.fields import DNS_LABEL, StrictModel as _Model


class CapacityReservationConfig(_Model):
    id: str = Field(..., pattern=r"^cr-[0-9a-f]{8,17}$", description="the reservation's id, e.g. cr-0123456789abcdef0")
    kind: Literal["capacity-block", "on-demand-reservation"] = Field(
        ..., description="an EC2 Capacity Block for ML (a reserved window) or an On-Demand Capacity Reservation")


GP3_BASELINE_IOPS, GP3_MAX_IOPS, GP3_IOPS_PER_GIB = 3000, 16000, 500
GP3_BASELINE_MIBPS, GP3_MAX_MIBPS, GP3_MIBPS_PER_IOPS = 125, 1000, 0.25
LARGE_ROOT_GIB = 500  # from here on a root gets more than gp3's baseline: image pulls and checkpoint staging
LARGE_ROOT_IOPS, LARGE_ROOT_MIBPS = 6000, 500


def _one_gpu_shape(rows: list[catalog.InstanceType]) -> None:
    """The cluster-autoscaler builds a group's node from its first type alone (cluster-autoscaler AWS provider): a job
    for another GPU model or count never makes the group scale up, and a job fitted to the first type may be given a
    smaller one. So a GPU group has one GPU model and count, and its first type is its smallest."""
    shapes = sorted({(r.gpu_model, r.gpus) for r in rows})
    if len(shapes) > 1:
        split = "; ".join(f"[{', '.join(r.name for r in rows if (r.gpu_model, r.gpus) == shape)}]" for shape in shapes)
        raise ValueError(f"{[r.name for r in rows]} mixes GPU shapes {[f'{n} x {m}' for m, n in shapes]}; the cluster-autoscaler "
                         f"sizes a group by its first type, so jobs for the others would never scale it up. Fix: one node group per "
                         f"GPU model and count: {split}")
    first = rows[0]
    smaller = [r.name for r in rows[1:] if r.vcpus < first.vcpus or r.memory_gib < first.memory_gib]
    if smaller:
        raise ValueError(f"{[r.name for r in rows]}: {smaller} are smaller than the first type {first.name}; the "
                         "cluster-autoscaler sizes the group by its first type, so a pod fitted to it may not fit the node EC2 "
                         f"launches. Fix: list the smallest type first: {sorted((r.name for r in rows), key=lambda n: (catalog.lookup(n).vcpus, catalog.lookup(n).memory_gib))}")


class NodeGroupConfig(_Model):
    name: str = Field(..., pattern=DNS_LABEL, max_length=38)
    instance_types: list[str] = Field(..., min_length=1)
    capacity: Literal["on-demand", "spot"]
    min_size: int = Field(..., ge=0)
    desired_size: int | None = Field(None, ge=0, description="defaults to min_size")
    max_size: int = Field(..., ge=1)
    disk_gib: int = Field(200, ge=20, le=16384)
    efa: bool = False
    availability_zone: str | None = Field(None, description="required for EFA groups: the placement group's AZ")
    capacity_reservation: CapacityReservationConfig | None = Field(
        None, description="launch into reserved capacity: unreserved p5 capacity in one placement group is rarely there")
    team_jobs: bool = Field(False, description="a CPU group for teams' CPU-only jobs (the cpu flavour); CPU groups without it "
                                                "run only the platform's services, never a team's pod")
    root_iops: int | None = Field(None, ge=GP3_BASELINE_IOPS, le=GP3_MAX_IOPS, description=f"gp3 IOPS; default {LARGE_ROOT_IOPS} from {LARGE_ROOT_GIB} GiB")
    root_throughput_mibps: int | None = Field(None, ge=GP3_BASELINE_MIBPS, le=GP3_MAX_MIBPS,
                                              description=f"gp3 throughput; default {LARGE_ROOT_MIBPS} from {LARGE_ROOT_GIB} GiB")

    @field_validator("instance_types")
    @classmethod
    def _known_types(cls, names: list[str]) -> list[str]:
        problems = []
        for name in names:
            try:
                catalog.lookup(name)
            except catalog.UnknownInstanceType as exc:
                problems.append(str(exc))
        if problems:
            raise ValueError("; ".join(problems))
        if len(set(names)) != len(names):
            raise ValueError(f"{names} lists a type twice. Fix: list each instance type once")
        rows = [catalog.lookup(n) for n in names]
        if len({r.gpus > 0 for r in rows}) > 1:
            raise ValueError(f"{names} mixes GPU and CPU instance types. Fix: put GPU and CPU types in separate node groups")
        if rows[0].gpus:
            _one_gpu_shape(rows)
        return names

    @model_validator(mode="after")
    def _sizes_and_efa(self) -> NodeGroupConfig:
        if self.min_size > self.max_size:
            raise ValueError(f"min_size ({self.min_size}) > max_size ({self.max_size}). Fix: raise max_size or lower min_size")
        desired = self.desired
        if not self.min_size <= desired <= self.max_size:
            raise ValueError(f"desired_size ({desired}) is outside [min_size {self.min_size}, max_size {self.max_size}]. Fix: pick a size in that range")
        if self.efa:
            self._check_efa()
        if self.team_jobs:
            self._check_team_jobs()
        if self.capacity_reservation is not None:
            self._check_reservation()
        self._check_root_performance()
        return self

    def _check_team_jobs(self) -> None:
        if self.has_gpus:
            raise ValueError("team_jobs: GPU groups always run teams' jobs; team_jobs marks a CPU group for CPU-only jobs. "
                             "Fix: drop team_jobs from this group")
        if self.capacity != "on-demand":
            raise ValueError("team_jobs: teams' CPU jobs run on on-demand nodes (no spot grace period for them). "
                             "Fix: capacity: on-demand")
        unsized = [i.name for i in self.instances if not i.vcpus]
        if unsized:
            raise ValueError(f"team_jobs: {unsized} are not in the CPU catalogue, so whether a job's pod fits a node cannot be "
                             f"told. Fix: one of the m/c/r 6i/7i/6a/7a types, e.g. m7i.2xlarge")

    def _check_reservation(self) -> None:
        if self.capacity_reservation is None:
            return
        kind = self.capacity_reservation.kind
        if self.capacity != "on-demand":
            raise ValueError(f"capacity_reservation: a reservation is on-demand capacity, but capacity is {self.capacity}. "
                             "Fix: capacity: on-demand, or drop the reservation")
        if len(self.instance_types) != 1:
            raise ValueError(f"capacity_reservation: a reservation holds one instance type, got {self.instance_types}. "
                             "Fix: the reserved type alone")
        if self.availability_zone is None:
            raise ValueError(f"capacity_reservation: a reservation lives in one AZ; the {kind} needs the group there. "
                             "Fix: set availability_zone to the reservation's AZ")

    def _check_root_performance(self) -> None:
        iops, mibps = self.root_performance
        if iops is not None and iops > GP3_IOPS_PER_GIB * self.disk_gib:
            raise ValueError(f"root_iops: {iops} IOPS on {self.disk_gib} GiB; gp3 allows at most {GP3_IOPS_PER_GIB} per GiB. "
                             f"Fix: at most {GP3_IOPS_PER_GIB * self.disk_gib}, or a larger disk_gib")
        if mibps is not None and mibps > GP3_MIBPS_PER_IOPS * (iops or GP3_BASELINE_IOPS):
            raise ValueError(f"root_throughput_mibps: {mibps} MiB/s with {iops or GP3_BASELINE_IOPS} IOPS; gp3 allows at most "
                             f"{GP3_MIBPS_PER_IOPS} MiB/s per IOPS. Fix: root_iops >= {int(mibps / GP3_MIBPS_PER_IOPS)} or less throughput")

    @property
    def root_performance(self) -> tuple[int | None, int | None]:
        """gp3 (IOPS, MiB/s) of the root volume: as configured, else more than the baseline for large roots."""
        large = self.disk_gib >= LARGE_ROOT_GIB
        return (self.root_iops or (LARGE_ROOT_IOPS if large else None),
                self.root_throughput_mibps or (LARGE_ROOT_MIBPS if large else None))

    def _check_efa(self) -> None:
        if len(self.instance_types) != 1:
            raise ValueError(
                f"instance_types: an EFA group has one instance type (one interface layout, one placement group), got {self.instance_types}. "
                "Fix: split it into one EFA group per type"
            )
        instance = catalog.lookup(self.instance_types[0])
        if not instance.supports_efa:
            raise ValueError(
                f"instance_types: {instance.name} has no EFA interfaces in the catalogue. Fix: use one of {', '.join(catalog.EFA_TYPES)} or set efa: false"
            )
        if self.availability_zone is None:
            raise ValueError("availability_zone: an EFA group lives in one cluster placement group, so it needs one AZ. Fix: set availability_zone to one of the stack's availability_zones")
        if self.capacity != "on-demand":
            raise ValueError(
                "capacity: an EFA group runs tightly coupled jobs in one placement group, where one spot reclaim stops the whole job. "
                "Fix: capacity: on-demand (use a non-EFA spot group for spot work)"
            )

    @property
    def desired(self) -> int:
        return self.min_size if self.desired_size is None else self.desired_size

    @property
    def instances(self) -> list[catalog.InstanceType]:
        return [catalog.lookup(n) for n in self.instance_types]

    @property
    def gpus_per_node(self) -> int:
        """A diversified group is only as big as its smallest type."""
        return min(i.gpus for i in self.instances)

    @property
    def has_gpus(self) -> bool:
        return self.gpus_per_node > 0

    @property
    def flavour(self) -> Flavour:
        if not self.has_gpus:
            return Flavour.CPU if self.team_jobs else Flavour.SYSTEM
        if self.efa:
            return Flavour.GPU_EFA
        return Flavour.GPU_SPOT if self.capacity == "spot" else Flavour.GPU_ONDEMAND

    @property
    def max_gpus(self) -> int:
        return self.max_size * self.gpus_per_node


# FSx for Lustre sizing rules (SSD storage): valid capacities and per-unit throughput tiers (MB/s/TiB).
