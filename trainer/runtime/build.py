"""How a run's model, optimizer and scheduler are built. A `Task` may bring its own builders (its `build_optimizer`,
`build_scheduler`, `fsdp_units`); these are the defaults.
"""

from __future__ import annotations

import math
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
    """Linear warmup, then cosine decay to `min_lr_ratio` of the peak."""
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
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


def shard(task: Task, model: nn.Module, cfg: RunConfig, env: Distributed) -> nn.Module:
    """Place the model and wrap it for the strategy: FSDP2 units (the task's, else every parameterised leaf),
    root last; DDP across ranks; nothing on a world of one."""
    model.to(env.device)
    if cfg.strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard
        # Each unit's parameters are gathered just in time for its forward and freed after; the root holds the rest.
        for unit in (task.fsdp_units or leaf_units)(model):
            if cfg.compile:
                unit.compile()  # in place: parameter names (and so checkpoints) stay the same
            fully_shard(unit)
        fully_shard(model)
        return model
    if cfg.compile:
        model.compile()
    if env.world_size == 1:
        # DDP over one rank reduces nothing yet still copies and all-reduces every gradient bucket (measured:
        # 10-17 % of a CPU step). The process group and every other collective stay, so the path is the same.
        return model
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)
