"""The learning-rate schedule's arithmetic, without torch: the runtime's default scheduler (build.lr_lambda) and a
sweep's promotion (sweeps/promotion.py, where a promoted job picks up the schedule) compute it the same way."""

from __future__ import annotations

import math


def cosine_factor(step: int, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """The peak learning rate's multiplier at `step`: linear warmup, then cosine decay to `min_lr_ratio` at max_steps."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def rewarmed(factor: float, step: int, from_step: int, from_factor: float, steps: int) -> float:
    """Over `steps` from `from_step`, climb linearly from `from_factor` (where an earlier schedule ended) to `factor`
    (this schedule's own at `step`); outside that window, `factor` itself."""
    if not from_step <= step < from_step + steps:
        return factor
    return from_factor + (factor - from_factor) * (step - from_step + 1) / steps
