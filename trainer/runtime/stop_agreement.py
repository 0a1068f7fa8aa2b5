"""The per-step stop agreement: every rank learns, from one host-side collective, whether any rank was told to stop
(a preemption notice) and rank 0's decision after an evaluation, so every rank stops at the same step. It is the only
per-step read the loop makes, of a two-integer host tensor: it never waits on the GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trainforge.trainer.runtime import hooks
from trainforge.trainer.runtime.distributed import Distributed
from trainforge.trainer.runtime.preemption import PreemptionGuard


@dataclass
class InFlight:
    values: torch.Tensor  # int64 [told to stop, rank 0's stop code], on the host
    work: Any  # the async collective's handle


class _Done:
    """The handle of a collective that had nothing to wait for."""

    def wait(self) -> bool:
        return True


_DONE = _Done()


@dataclass(frozen=True)
class Agreement:
    """What every rank learns from a step's collective: whether any rank was told to stop, and rank 0's decision."""

    preempted: bool = False
    stop_reason: str | None = None


def agree(guard: PreemptionGuard, stop_code: int, env: Distributed) -> InFlight:
    """Start the step's agreement on the host: "has any rank been told to stop?" and rank 0's stop decision.
    A gloo all_reduce of two integers on its own group: it never waits for the GPU, and it runs while the next
    step computes (read in `land` one step later, or at once after an evaluation)."""
    decision = stop_code if env.is_main else 0  # summed over ranks: only rank 0's counts
    values = torch.tensor([int(guard.requested.is_set()), decision], dtype=torch.int64)
    if env.world_size == 1:
        return InFlight(values, _DONE)  # a world of one agrees with itself (the collective cost ~66 us a step)
    return InFlight(values, dist.all_reduce(values, group=env.control_group, async_op=True))


def land(agreement: InFlight | None) -> Agreement:
    """Wait for a step's agreement and read it (nothing in flight: nobody asked to stop)."""
    if agreement is None:
        return Agreement()
    agreement.work.wait()
    stop, decision = agreement.values.tolist()  # a host tensor: no device synchronisation
    return Agreement(preempted=stop > 0, stop_reason=hooks.reason_of(int(decision)))

