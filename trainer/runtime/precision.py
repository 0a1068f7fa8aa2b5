"""Which precision a run computes in, decided by what the device does, not by its name.

`precision: auto` (the default) takes bf16 autocast where the device computes bf16 natively: a CUDA GPU that supports
it, or a CPU whose bf16 matrix multiply is about as fast as fp32 (AMX, AVX512_BF16). Elsewhere it takes fp16 with loss
scaling on a CUDA GPU without bf16, and fp32 on a CPU, where PyTorch would emulate bf16 (measured here: the quickstart's
language model 10x slower, a 256x256 matmul 16-20x). The CPU case is measured with a short bf16-vs-fp32 matmul, so it
follows the ISA PyTorch and oneDNN really use (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA), which the CPU flags do not tell.

An explicit `bf16` is kept, with one warning that names the measured cost. The choice does not change what a
checkpoint holds (fp32 master weights and optimizer state either way), so a run may resume under another precision.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from functools import lru_cache

import torch

log = logging.getLogger("trainforge.runtime")

# bf16 counts as native when its matmul takes at most this many times fp32's (native: 0.3-1.5x; emulated: 16-500x).
NATIVE_BF16_MAX_SLOWDOWN = 3.0
PROBE_SIZE, PROBE_REPEATS = 256, 5


@dataclass(frozen=True)
class Precision:
    requested: str  # as configured: auto, fp32, bf16 or fp16
    chosen: str  # what the run computes in: fp32, bf16 or fp16
    reason: str  # one line for the log, the summary and MLflow


def _operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe's two matrices in `dtype`, multiplied once (the first call pays for kernel selection)."""
    a = torch.randn(PROBE_SIZE, PROBE_SIZE).to(dtype)
    b = torch.randn(PROBE_SIZE, PROBE_SIZE).to(dtype)
    a @ b
    return a, b


def _matmul_seconds(operands: tuple[torch.Tensor, torch.Tensor]) -> float:
    a, b = operands
    started = time.perf_counter()
    a @ b
    return time.perf_counter() - started


@lru_cache(maxsize=1)
def cpu_bf16_slowdown() -> float:
    """How many times slower a bf16 matmul is than fp32 on this CPU, as PyTorch runs it now (about 1 when native).
    On one thread, bf16 and fp32 alternating, the fastest of PROBE_REPEATS each: a busy machine only ever makes a call
    slower, so the minimum is what the CPU does, and a sibling thread descheduled mid-matmul cannot make fp32 look as
    slow as emulated bf16 (seen under a parallel test run: 1.9x where emulation costs 16x). Kernel selection is paid
    once per dtype, not per repeat: emulated, a bf16 matmul of this size costs ~40 ms, and every training process
    probes (py-spy: the probe was 4 % of the training tests' CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        operands = {dtype: _operands(dtype) for dtype in (torch.bfloat16, torch.float32)}
        bf16, fp32 = [], []
        for _ in range(PROBE_REPEATS):
            bf16.append(_matmul_seconds(operands[torch.bfloat16]))
            fp32.append(_matmul_seconds(operands[torch.float32]))
    finally:
        torch.set_num_threads(threads)
    return min(bf16) / max(min(fp32), 1e-9)


def bf16_is_native(device: torch.device) -> tuple[bool, str]:
    if device.type == "cuda":
        supported = torch.cuda.is_bf16_supported(including_emulation=False)
        return supported, f"{torch.cuda.get_device_name(device)} {'computes' if supported else 'does not compute'} bf16"
    slowdown = cpu_bf16_slowdown()
    native = slowdown <= NATIVE_BF16_MAX_SLOWDOWN
    return native, (f"bf16 is {'native' if native else 'emulated'} on this CPU (a bf16 matmul takes {slowdown:.1f}x fp32's, "
                    f"ISA {torch.backends.cpu.get_cpu_capability()})")


def agreed_probe(device: torch.device, group) -> tuple[bool, str]:
    """Every rank's answer to "is bf16 native here?", combined so all ranks choose alike (native only if native on all)."""
    import torch.distributed as dist
    native, why = bf16_is_native(device)
    flag = torch.tensor([int(native)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)  # a gloo group: the tensor stays on the host
    if bool(flag.item()) != native:
        return False, "bf16 is emulated on another rank of this job"
    return native, why


def resolve(requested: str, device: torch.device, probe: tuple[bool, str] | None = None) -> Precision:
    """The precision to run in. `probe`: (bf16 native?, why) as the ranks agreed; measured here when not given."""
    if requested in ("fp32", "fp16"):
        return Precision(requested, requested, "as configured")
    native, why = probe if probe is not None else bf16_is_native(device)
    if requested == "bf16":
        if not native:
            log.warning("precision: bf16 is emulated here (%s): the run will be several times slower than fp32 "
                        "(the quickstart's LM: about 10x). Fix: precision: auto picks the fastest this device computes", why)
        return Precision(requested, "bf16", "as configured" + ("" if native else f"; {why}"))
    if native:
        return Precision(requested, "bf16", f"auto: {why}")
    if device.type == "cuda":
        return Precision(requested, "fp16", f"auto: {why}; fp16 with loss scaling")
    return Precision(requested, "fp32", f"auto: {why}")


def autocast(chosen: str, device: torch.device):
    """The forward pass's context for a run computing in `chosen` (fp32: none)."""
    if chosen == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if chosen == "bf16" else torch.float16)


def agreed(requested: str, device: torch.device, group, *, announce: bool) -> Precision:
    """The precision every rank of the job runs in (the bf16 probe agreed over `group`), logged once by `announce`."""
    from trainforge.trainer.runtime.config import UserError
    chosen = resolve(requested, device, agreed_probe(device, group) if requested in ("auto", "bf16") else None)
    if announce:
        log.info("precision: %s (%s)", chosen.chosen, chosen.reason)
    if chosen.chosen == "fp16" and device.type != "cuda":
        raise UserError("precision: fp16 needs a CUDA device (its grad scaler exists for GPU underflow). Fix: use bf16 or fp32 on CPU")
    return chosen
