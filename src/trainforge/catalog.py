"""Instance types the platform knows: accelerators per node and EFA interface layout.

One table serves the AWS layer (launch-template network interfaces, quota capacity) and the submitter
(`vpc.amazonaws.com/efa` and `nvidia.com/gpu` requests). Sources: the EC2 accelerated-computing and EFA
pages (maximum EFA interfaces = maximum network cards on these types). Add a row when AWS ships a type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainforge.errors import TrainforgeError

INSTANCE_TYPE_PATTERN = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpus: int
    gpu_model: str
    efa_interfaces: int = 0
    vcpus: int = 0  # 0: a CPU type outside the table (fine for the system group; a team_jobs group needs a sized type)
    memory_gib: int = 0
    # Types on which an interface may be `efa-only` (no ENA device). Older Nitro generations take only
    # `efa` (EFA with ENA) interfaces, one per network card.
    efa_only_supported: bool = True
    # NVMe instance-store disks (every GPU type in the table has them: p4d 8 x 1 TB, p5/p5e/p5en/p6 8 x 3.84 TB, g5/g6/g6e
    # one or more): the node stripes them as RAID0 for images, containers and scratch. CPU types outside the table: none.
    local_nvme: bool = False
    # GPUDirect RDMA over EFA (the GPU reads and writes the network directly): the p4 and later p families. g5/g6 carry
    # EFA without it, so libfabric must not be told to use device RDMA there (FI_EFA_USE_DEVICE_RDMA).
    efa_rdma: bool = False

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def supports_efa(self) -> bool:
        return self.efa_interfaces > 0


def _rows() -> list[InstanceType]:
    rows = [
        InstanceType("p4d.24xlarge", 8, "A100-40GB", efa_rdma=True, efa_interfaces=4, efa_only_supported=False, vcpus=96, memory_gib=1152),
        InstanceType("p4de.24xlarge", 8, "A100-80GB", efa_rdma=True, efa_interfaces=4, efa_only_supported=False, vcpus=96, memory_gib=1152),
        InstanceType("p5.4xlarge", 1, "H100", efa_interfaces=0, vcpus=16, memory_gib=256),
        InstanceType("p5.48xlarge", 8, "H100", efa_rdma=True, efa_interfaces=32, vcpus=192, memory_gib=2048),
        InstanceType("p5e.48xlarge", 8, "H200", efa_rdma=True, efa_interfaces=32, vcpus=192, memory_gib=2048),
        InstanceType("p5en.48xlarge", 8, "H200", efa_rdma=True, efa_interfaces=16, vcpus=192, memory_gib=2048),
        InstanceType("p6-b200.48xlarge", 8, "B200", efa_rdma=True, efa_interfaces=8, vcpus=192, memory_gib=2048),
    ]
    # g5 (A10G), g6 (L4) and g6e (L40S) share a size ladder: (GPUs, vCPUs); g5/g6 have 4 GiB per vCPU, g6e 8.
    # Sizes from 8xlarge up carry one EFA interface on g5/g6.
    ladder = {"xlarge": (1, 4), "2xlarge": (1, 8), "4xlarge": (1, 16), "8xlarge": (1, 32), "12xlarge": (4, 48),
              "16xlarge": (1, 64), "24xlarge": (4, 96), "48xlarge": (8, 192)}
    efa_sizes = {"8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge"}
    for family, model, gib_per_vcpu in (("g5", "A10G", 4), ("g6", "L4", 4), ("g6e", "L40S", 8)):
        for size, (gpus, vcpus) in ladder.items():
            efa = 1 if size in efa_sizes and family != "g6e" else 0
            rows.append(InstanceType(f"{family}.{size}", gpus, model, efa_interfaces=efa, vcpus=vcpus, memory_gib=vcpus * gib_per_vcpu))
    return [InstanceType(**{**r.__dict__, "local_nvme": True}) for r in rows]


def _cpu_rows() -> list[InstanceType]:
    """General-purpose, compute and memory x86 types a team_jobs group may use, sized so that the autoscaler's template
    and `check` can tell whether a CPU-only pod fits: m 4 GiB per vCPU, c 2, r 8; no instance store."""
    ladder = {"large": 2, "xlarge": 4, "2xlarge": 8, "4xlarge": 16, "8xlarge": 32, "12xlarge": 48, "16xlarge": 64, "24xlarge": 96}
    families = {"m6i": 4, "m7i": 4, "m6a": 4, "m7a": 4, "c6i": 2, "c7i": 2, "c6a": 2, "c7a": 2, "r6i": 8, "r7i": 8, "r6a": 8, "r7a": 8}
    return [InstanceType(f"{family}.{size}", 0, "", vcpus=vcpus, memory_gib=vcpus * gib)
            for family, gib in families.items() for size, vcpus in ladder.items()]


# Dense (no sparsity) bf16 tensor-core peak of one GPU, TFLOP/s, from NVIDIA's data sheets for the parts AWS ships: the
# p5/p5e/p5en H100 and H200 are SXM (989.4; the PCIe H100 would be 756), B200 2250, A100 312, L40S 362, L4 121, and AWS's
# A10G 70 (NVIDIA's A10 is 125). MFU (runtime metrics, benchmarks/bench_gpu.py) divides by these.
PEAK_BF16_TFLOPS: dict[str, float] = {"H100": 989.4, "H200": 989.4, "B200": 2250.0, "A100-40GB": 312.0, "A100-80GB": 312.0,
                                      "L40S": 362.0, "L4": 121.0, "A10G": 70.0}


def peak_bf16_flops(device_name: str) -> float | None:
    """The peak of the GPU `torch.cuda.get_device_name()` names ("NVIDIA H100 80GB HBM3"), FLOP/s; None if unknown."""
    if "H100" in device_name and "PCIe" in device_name:
        return 756.0e12  # the PCIe part (lower clocks and power), not one AWS ships
    for model in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):  # L40S before L4, A100-80GB before A100
        if model.split("-")[0] in device_name.split() or model.split("-")[0] in device_name:
            return PEAK_BF16_TFLOPS[model] * 1e12
    return None


CATALOG: dict[str, InstanceType] = {row.name: row for row in _rows()}
CPU_CATALOG: dict[str, InstanceType] = {row.name: row for row in _cpu_rows()}
GPU_FAMILIES: frozenset[str] = frozenset(row.family for row in CATALOG.values())
# Accelerated families the platform does not carry (old generations, non-NVIDIA GPUs): named so that they
# are rejected instead of being mistaken for CPU types.
UNSUPPORTED_GPU_FAMILIES: frozenset[str] = frozenset({"p2", "p3", "p3dn", "g3", "g3s", "g4ad", "g4dn", "g5g"})
EFA_TYPES: tuple[str, ...] = tuple(sorted(name for name, row in CATALOG.items() if row.supports_efa))


class UnknownInstanceType(TrainforgeError, ValueError):
    """Not a type the catalogue can size (a ValueError too, so model validators turn it into a field error)."""

    def __init__(self, message: str):
        super().__init__("", [message])


def lookup(name: str) -> InstanceType:
    """The catalogue row for `name`; a type outside the GPU families is a CPU type with no accelerators.

    A GPU-family size the table lacks is an error: guessing its GPU count would mis-size quotas.
    """
    if not INSTANCE_TYPE_PATTERN.match(name):
        raise UnknownInstanceType(f"{name!r} is not an EC2 instance type name (expected e.g. 'g6.12xlarge')")
    if name in CATALOG:
        return CATALOG[name]
    family = name.split(".", 1)[0]
    if family in GPU_FAMILIES:
        known = sorted(n for n in CATALOG if n.startswith(family + "."))
        raise UnknownInstanceType(f"{name!r} is not in the GPU catalogue; known {family} types: {', '.join(known)}")
    if family in UNSUPPORTED_GPU_FAMILIES:
        raise UnknownInstanceType(f"{name!r} belongs to {family}, a GPU family trainforge does not support; use one of: {', '.join(sorted(GPU_FAMILIES))}")
    return CPU_CATALOG.get(name) or InstanceType(name, gpus=0, gpu_model="")


@dataclass(frozen=True)
class NetworkInterfaceSlot:
    network_card_index: int
    device_index: int
    interface_type: str  # "interface" (ENA), "efa" (EFA with ENA) or "efa-only"


def efa_interface_layout(instance: InstanceType) -> list[NetworkInterfaceSlot]:
    """Network interfaces for a launch template that uses every EFA device of `instance`.

    Follows the EC2 guide for multi-card instances: the primary interface (card 0, device 0) is ENA;
    card 0 also gets an EFA-only interface at device 1; every other card gets an EFA-only interface at
    device 0. Types without EFA-only support get one `efa` interface per card, the first being primary.
    """
    if not instance.supports_efa:
        raise UnknownInstanceType(f"{instance.name} has no EFA interfaces; EFA types: {', '.join(EFA_TYPES)}")
    if not instance.efa_only_supported:
        return [NetworkInterfaceSlot(card, 0, "efa") for card in range(instance.efa_interfaces)]
    slots = [NetworkInterfaceSlot(0, 0, "interface"), NetworkInterfaceSlot(0, 1, "efa-only")]
    slots += [NetworkInterfaceSlot(card, 0, "efa-only") for card in range(1, instance.efa_interfaces)]
    return slots


def efa_device_count(instance: InstanceType) -> int:
    """EFA devices a pod on this instance can request as `vpc.amazonaws.com/efa`."""
    return sum(1 for slot in efa_interface_layout(instance) if slot.interface_type != "interface")
