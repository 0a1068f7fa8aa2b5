"""The job's process group: join it (a lone process forms a group of one, so nothing downstream branches), leave it
so the process can train again, and seed every generator alike."""

from __future__ import annotations

import datetime
import os
import random
import re
import socket
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from trainforge import contract
from trainforge.trainer.runtime.config import DeviceFault, NcclConfig, UserError, nccl_environment


@dataclass
class Distributed:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    checkpoint_group: dist.ProcessGroup  # gloo: checkpoint collectives, some from DCP's background thread
    control_group: dist.ProcessGroup  # gloo: the per-step stop agreement, a host-side collective that never waits on the GPU
    owns_group: bool = True  # init_distributed made the default group (a caller's own group is left to the caller)
    lone: bool = False  # no torchrun: init_distributed set RANK, WORLD_SIZE... itself

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LONE_PROCESS_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


OFI_PLUGINS = ("libnccl-net-ofi.so", "libnccl-net.so")  # aws-ofi-nccl's library, by its newer and older names


def ofi_plugin_problem(environ: dict[str, str] | os._Environ) -> str | None:
    """On a pod given EFA devices (the rendered FI_PROVIDER=efa), NCCL must find the aws-ofi-nccl plugin; without it NCCL
    silently falls back to TCP sockets at a small fraction of EFA's bandwidth. None when it is there (or not needed)."""
    if environ.get("FI_PROVIDER") != "efa":
        return None
    folders = [f for f in environ.get("LD_LIBRARY_PATH", "").split(":") if f]
    if any(os.path.exists(os.path.join(folder, name)) for folder in folders for name in OFI_PLUGINS):
        return None
    return (f"this pod has EFA devices (FI_PROVIDER=efa) but NCCL's OFI plugin ({' or '.join(OFI_PLUGINS)}) is in no "
            f"folder of LD_LIBRARY_PATH ({':'.join(folders) or 'empty'}): NCCL would fall back to TCP sockets. Fix: run the "
            "platform's runtime image (its Dockerfile installs aws-ofi-nccl), or install aws-ofi-nccl in yours and add "
            "its lib folder to LD_LIBRARY_PATH")


MEMLOCK_NEEDED = 16 * 2**30  # what AWS's EFA checks ask of `ulimit -l` (awsome-distributed-training 2-efa-enumeration.sh)


def memlock_problem(environ: dict[str, str] | os._Environ, limits: str) -> str | None:
    """On a pod given EFA devices, the locked-memory limit (`limits`: /proc/self/limits) must be unlimited or large:
    libfabric pins its buffers, and a `restricted` pod cannot raise it (no CAP_IPC_LOCK). None when it is (or EFA is
    not in use)."""
    if environ.get("FI_PROVIDER") != "efa":
        return None
    line = next((row for row in limits.splitlines() if row.startswith("Max locked memory")), None)
    if line is None:
        return None
    soft = line.split()[3]
    if soft == "unlimited" or int(soft) >= MEMLOCK_NEEDED:
        return None
    return (f"this pod has EFA devices but may lock only {int(soft) // 1024} KiB of memory (RLIMIT_MEMLOCK): libfabric's "
            "EFA provider would fail with 'Libfabric error: (-12)'. Fix: run on the platform's EFA node groups (their "
            "nodeadm config gives containers unlimited locked memory), or raise containerd's LimitMEMLOCK on your nodes")


# What CUDA says when the image's CUDA needs a newer driver than the node's (torch's "The NVIDIA driver on your system is
# too old", cudaErrorInsufficientDriver 35, cudaErrorSystemDriverMismatch 803, cudaErrorCompatNotSupportedOnDevice 804):
# the image's fault, which a retry on the same kind of node cannot mend.
_IMAGE_CUDA_MISMATCH = re.compile(r"too old|\bError (35|803|804)\b")


def gpu_problem(given: int, cuda_build: str | None, visible: int, cuda_said: str, node: str) -> Exception | None:
    """What to stop with when a pod given `given` GPUs has a torch that sees only `visible`, or None. Without this the
    worker trains on the CPU, silently, about a hundred times slower at the GPUs' price. A torch without CUDA, or a
    CUDA newer than the node's driver, is the image's fault (a user error); a CUDA that sees too few GPUs is the node's
    (a retry): `cuda_said` is what CUDA said, e.g. "Error 802: system not yet initialized" while an HGX node's fabric
    manager is down."""
    if given <= visible:
        return None
    if cuda_build is None:
        return UserError(f"this pod was given {given} GPU(s) but its torch {torch.__version__} is built without CUDA. Fix: "
                         "run the platform's runtime image, or install a CUDA build of torch in yours")
    if _IMAGE_CUDA_MISMATCH.search(cuda_said):
        return UserError(f"this pod's torch is built for CUDA {cuda_build}, which the NVIDIA driver of node {node or '(unknown)'} "
                         f"does not support ({cuda_said}). Fix: a torch built for an older CUDA in your image, or the "
                         "platform's runtime image")
    return DeviceFault(f"this pod was given {given} GPU(s) on node {node or '(unknown)'} but CUDA {cuda_build} sees {visible}"
                       f"{f' ({cuda_said})' if cuda_said else ''}: a driver, fabric manager or GPU failure, not the job's. If "
                       f"it recurs on this node, cordon it (kubectl cordon {node or 'NODE'}) and check its NVIDIA driver, "
                       "fabric manager and `nvidia-smi -q`")


def cuda_devices() -> tuple[int, str]:
    """The GPUs CUDA itself counts (not NVML's count, which torch reports before CUDA starts and which may still list a
    GPU CUDA lost) and, where CUDA fails to start, what it said. Starting it here costs nothing: the worker would next."""
    try:
        torch.cuda.init()
    except Exception as exc:  # the driver's RuntimeError, or torch's AssertionError when it finds no driver at all
        said = str(exc)
        code = re.search(r"Error \d+: [^\n.(]+", said)
        return 0, (code.group(0) if code else (said.strip().splitlines() or [type(exc).__name__])[0])[:200].strip()
    return torch.cuda.device_count(), ""


def check_gpus(environ: dict[str, str] | os._Environ) -> None:
    """Stop (see gpu_problem) when the pod was given GPUs (contract.GPUS_PER_NODE_ENV) that CUDA does not see."""
    given = int(environ.get(contract.GPUS_PER_NODE_ENV) or 0)
    if not given:
        return
    visible, said = cuda_devices() if torch.version.cuda else (0, "")
    problem = gpu_problem(given, torch.version.cuda, visible, said, environ.get(contract.NODE_NAME_ENV, ""))
    if problem is not None:
        raise problem


def init_distributed(nccl: NcclConfig | None = None, output_dir: str = ".") -> Distributed:
    """Join the job's process group; a lone process (no torchrun) forms a group of one, so nothing branches. A default
    group the caller already made is used as it is. NCCL's error handling and flight recorder are set up from `nccl`
    (variables already in the environment win), with its start-up timeout; `settle_timeout` shortens it later."""
    nccl = nccl or NcclConfig()
    for name, value in nccl_environment(nccl, output_dir).items():
        os.environ.setdefault(name, value)
    lone = "RANK" not in os.environ
    if lone:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    check_gpus(os.environ)
    if torch.cuda.is_available():
        limits = Path("/proc/self/limits").read_text() if Path("/proc/self/limits").exists() else ""
        if (problem := ofi_plugin_problem(os.environ) or memlock_problem(os.environ, limits)) is not None:
            raise UserError(problem)
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=nccl.startup_timeout_s if backend == "nccl" else 600))
    checkpoint_group = dist.new_group(backend="gloo")
    control_group = dist.new_group(backend="gloo")
    return Distributed(rank, world, local, device, checkpoint_group, control_group, owns_group, lone)


def settle_timeout(env: Distributed, nccl: NcclConfig) -> None:
    """After the first step: collectives of the default (NCCL) group fail after `nccl.timeout_s` from now on, so a dead
    rank's peers abort in minutes, not after the long start-up allowance."""
    if env.owns_group and dist.get_backend() == "nccl":
        from torch.distributed.distributed_c10d import _set_pg_timeout
        _set_pg_timeout(datetime.timedelta(seconds=nccl.timeout_s))


def leave_distributed(env: Distributed, *, clean: bool) -> None:
    """Undo init_distributed, so the process can train again (a notebook, in-process trials). The group is destroyed
    when the run ended cleanly or the process is alone; after a failure across ranks a peer may be gone, and
    destroying would wait on it, so the process's exit does it."""
    if env.owns_group and dist.is_initialized() and (clean or env.world_size == 1):
        dist.destroy_process_group()
    elif not env.owns_group:
        for group in (env.checkpoint_group, env.control_group):
            dist.destroy_process_group(group)
    if env.lone and not dist.is_initialized():
        for name in LONE_PROCESS_ENV:
            os.environ.pop(name, None)


def resolve_deterministic(asked: bool | None, device: torch.device) -> tuple[bool, str]:
    """Whether kernels run deterministically, and why: as asked, else on where it costs nothing and resume must be
    bit-identical (the CPU), off on CUDA, where torch raises for ops without a deterministic kernel and picks slower
    attention kernels (turn it on there to compare runs bit for bit)."""
    if asked is not None:
        return asked, "as configured"
    if device.type == "cuda":
        return False, "auto: off on CUDA (some ops have no deterministic kernel; set deterministic: true to compare runs bit for bit)"
    return True, f"auto: on on {device.type} (free there; resume is bit-identical)"


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=False)
        torch.backends.cudnn.benchmark = False
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
