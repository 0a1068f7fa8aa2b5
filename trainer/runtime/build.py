"""How a run's model, optimizer and scheduler are built. A `Task` may bring its own builders (its `build_optimizer`,
`build_scheduler`, `fsdp_units`); these are the defaults.

Under FSDP2 the model is never whole on any rank, as in torchtitan: it is built on the `meta` device (shapes, no
storage), sharded, materialised empty on the run's device (`to_empty`), then initialised. The initialisation goes one
module at a time: the module's own parameters and buffers are made full-size on the host, initialised by the module's
`reset_parameters` (or a task's `init_weights`) under a generator seeded by the run's seed and the module's name, and
each rank keeps only its shard. So a rank's host memory peaks near its shard plus the largest single module, not the
model, and the initial weights are the same whatever the world size (DTensor's own random ops would give every rank the
same shard on the CPU, which has no RNG tracker). DDP builds the model whole, as before.

FSDP2 computes in the run's precision through a `MixedPrecisionPolicy` on every unit (parameters all-gathered in bf16
or fp16, gradients reduced in fp32), not autocast: all-gathers move half the bytes.
"""

from __future__ import annotations

import copy
import hashlib
import resource
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from trainforge.trainer.runtime.config import RunConfig

if TYPE_CHECKING:
    from trainforge.trainer.runtime.distributed import Distributed
    from trainforge.trainer.runtime.tasks import Task


def default_optimizer(model: nn.Module, cfg: RunConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def lr_lambda(cfg: RunConfig) -> Callable[[int], float]:
    """Linear warmup, then cosine decay to `min_lr_ratio` of the peak; a promoted job (cfg.rewarm) climbs back to it
    from where its trial's schedule ended instead of jumping there."""
    from trainforge.trainer.runtime.schedule import cosine_factor, rewarmed

    def factor(step: int) -> float:
        own = cosine_factor(step, cfg.warmup_steps, cfg.max_steps, cfg.min_lr_ratio)
        r = cfg.rewarm
        return own if r is None else rewarmed(own, step, r.from_step, r.from_factor, r.steps)
    return factor


def default_scheduler(optimizer: torch.optim.Optimizer, cfg: RunConfig) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))


def leaf_units(model: nn.Module) -> list[nn.Module]:
    """Every parameterised leaf module: fine-grained, and right for any model, if not the fastest."""
    return [m for m in list(model.modules())[1:] if any(True for _ in m.parameters(recurse=False)) and not list(m.children())]


def optimizer_for(task: Task, model: nn.Module, cfg: RunConfig) -> torch.optim.Optimizer:
    return (task.build_optimizer or default_optimizer)(model, cfg)


def scheduler_for(task: Task, optimizer: torch.optim.Optimizer, cfg: RunConfig) -> torch.optim.lr_scheduler.LRScheduler:
    return (task.build_scheduler or default_scheduler)(optimizer, cfg)


PARAM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


def mixed_precision(precision: str, root: bool = False):
    """FSDP2's policy for a run computing in `precision` (resolved: fp32, bf16 or fp16): parameters all-gathered and
    computed in it, gradients reduced in fp32; the root's outputs (the logits the loss reads) in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    return MixedPrecisionPolicy(param_dtype=PARAM_DTYPES[precision], reduce_dtype=torch.float32,
                                output_dtype=torch.float32 if root else None)


@dataclass
class HostMemory:
    """What building the model cost in host memory on this rank (MiB): resident before, peak after initialisation."""
    materialised: str  # "meta" (FSDP2: sharded before it had storage) or "whole"
    before_mb: float
    peak_mb: float
    model_mb: float  # the full model's parameters and buffers, as built


def _resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def _reset_peak() -> None:
    try:  # Linux >= 4.0: the peak (VmHWM) restarts from what is resident now
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def build_model(task: Task, cfg: RunConfig, env: Distributed, precision: str) -> tuple[nn.Module, HostMemory]:
    """The task's model, placed and wrapped for the strategy, and what that cost in host memory."""
    _reset_peak()
    before = _resident_mb()
    if cfg.strategy == "fsdp":
        with torch.device("meta"):
            model = task.build_model()
        template = copy.deepcopy(model)  # unsharded, no storage: the modules `initialise` fills in turn
        model_mb = _bytes(model) / 2**20
        shard_fsdp(task, model, cfg, precision)
        model.to_empty(device=env.device)
        initialise(model, template, task, cfg.seed, env.device)
        materialised = "meta"
    else:
        model = task.build_model()
        model_mb = _bytes(model) / 2**20
        model = shard(task, model, cfg, env)
        materialised = "whole"
    return model, HostMemory(materialised, round(before, 1), round(_peak_mb(), 1), round(model_mb, 1))


def _bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


# What selective activation checkpointing keeps (torchtitan's choice): the outputs of the expensive ops, so backward
# recomputes only the cheap ones (norms, activations, adds).
SAVED_OPS = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")


def _saved_ops() -> set:
    aten = torch.ops.aten
    return {getattr(aten, name).default for name in SAVED_OPS if hasattr(aten, name)}


def checkpoint_activations(unit: nn.Module, mode: str) -> None:
    """Recompute `unit`'s forward in backward instead of keeping its activations (`full`), or keep only matmul and
    attention outputs (`selective`). The forward is wrapped in place, so parameter names (and checkpoints) stay the
    same with or without it; FSDP's hooks on the unit gather its parameters for the recomputation as for backward."""
    if mode == "none":
        return
    import functools

    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
    forward = unit.forward
    context_fn = None
    if mode == "selective":
        saved = _saved_ops()

        def policy(ctx, op, *args, **kwargs):
            return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE
        context_fn = functools.partial(create_selective_checkpoint_contexts, policy)

    @functools.wraps(forward)
    def checkpointed(*args, **kwargs):
        if context_fn is None:
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=context_fn, **kwargs)
    checkpointed.activation_checkpointing = mode  # type: ignore[attr-defined]  # what tests and logs read
    unit.forward = checkpointed  # type: ignore[method-assign]


def shard_fsdp(task: Task, model: nn.Module, cfg: RunConfig, precision: str) -> None:
    """FSDP2 units (the task's, else every parameterised leaf), root last, each with the run's mixed precision and
    activation checkpointing."""
    from torch.distributed.fsdp import fully_shard
    # Each unit's parameters are gathered just in time for its forward and freed after; the root holds the rest.
    for unit in (task.fsdp_units or leaf_units)(model):
        checkpoint_activations(unit, cfg.activation_checkpointing)
        if cfg.compile:
            unit.compile()  # in place: parameter names (and so checkpoints) stay the same
        fully_shard(unit, mp_policy=mixed_precision(precision))
    fully_shard(model, mp_policy=mixed_precision(precision, root=True))


def _module_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def _init_module(task: Task, name: str, module: nn.Module) -> None:
    if task.init_weights is not None:
        task.init_weights(name, module)
        return
    for method in ("reset_parameters", "_reset_parameters"):
        if callable(getattr(module, method, None)):
            getattr(module, method)()
            return
    from trainforge.trainer.runtime.config import UserError
    raise UserError(f"FSDP builds the model on the meta device and then initialises each module, but module {name or '(root)'!r} "
                    f"({type(module).__name__}) has parameters or buffers of its own and no reset_parameters(). Fix: give it a "
                    "reset_parameters() that initialises them, or give the task init_weights(name, module)")


@torch.no_grad()
def initialise(model: nn.Module, template: nn.Module, task: Task, seed: int, device: torch.device) -> None:
    """Fill the sharded, empty model's parameters and buffers, one module at a time (see the module's docstring)."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    targets = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    for name, module in template.named_modules():
        own = [(n, t) for n, t in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]]
        if not own:
            continue
        for tensor_name, tensor in own:  # this module's own tensors, full-size on the host; its children stay on meta
            host = torch.empty(tensor.shape, dtype=tensor.dtype)
            if tensor_name in module._parameters:
                module._parameters[tensor_name] = nn.Parameter(host, requires_grad=tensor.requires_grad)
            else:
                module._buffers[tensor_name] = host
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_module_seed(seed, name))
            _init_module(task, name, module)
        for tensor_name, _ in own:
            full = module._parameters[tensor_name] if tensor_name in module._parameters else module._buffers[tensor_name]
            target = targets[f"{name}.{tensor_name}" if name else tensor_name]
            if isinstance(target, DTensor):
                local = distribute_tensor(full.detach().to(device), target.device_mesh, target.placements, src_data_rank=None).to_local()
                target.to_local().copy_(local)
            else:
                target.copy_(full.detach())
            meta = torch.empty(full.shape, dtype=full.dtype, device="meta")
            if tensor_name in module._parameters:
                module._parameters[tensor_name] = nn.Parameter(meta, requires_grad=full.requires_grad)
            else:
                module._buffers[tensor_name] = meta


def shard(task: Task, model: nn.Module, cfg: RunConfig, env: Distributed) -> nn.Module:
    """Place a whole model and wrap it for DDP across ranks (nothing on a world of one). FSDP2 models are built by
    `build_model`, from the meta device."""
    model.to(env.device)
    for unit in (task.fsdp_units or leaf_units)(model):  # the same units as under FSDP
        checkpoint_activations(unit, cfg.activation_checkpointing)
    if cfg.compile:
        model.compile()
    if env.world_size == 1:
        # DDP over one rank reduces nothing yet still copies and all-reduces every gradient bucket (measured:
        # 10-17 % of a CPU step). The process group and every other collective stay, so the path is the same.
        return model
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)
