"""A distributed sampler whose position is part of the checkpoint: a resumed run continues at the next sample."""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import Sampler


class ResumableDistributedSampler(Sampler[int]):
    """Each epoch, one seeded permutation shared by all ranks; rank r takes every world-th index of it.

    The tail that does not divide by the world size is dropped so every rank sees as many samples (DDP and
    FSDP need equal step counts). `position` counts samples this rank has consumed in the epoch; the state
    stores it as a global count, so a checkpoint written by N ranks resumes correctly on M ranks.
    """

    def __init__(self, length: int, rank: int, world_size: int, seed: int):
        if length < world_size:
            raise ValueError(f"dataset of {length} samples cannot feed {world_size} ranks")
        self.length, self.rank, self.world_size, self.seed = length, rank, world_size, seed
        self.epoch = 0
        self.position = 0

    def per_rank(self) -> int:
        return self.length // self.world_size

    def __len__(self) -> int:
        return self.per_rank() - self.position

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.length, generator=g)[: self.per_rank() * self.world_size]
        mine = order[self.rank:: self.world_size]
        return iter(mine[self.position:].tolist())

    def advance(self, samples: int) -> None:
        self.position += samples
        if self.position >= self.per_rank():
            self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "global_position": self.position * self.world_size, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = state["epoch"]
        self.position = state["global_position"] // self.world_size
        if self.position >= self.per_rank():
            self.epoch, self.position = self.epoch + 1, 0


def micro_batches(dataset, sampler: ResumableDistributedSampler, batch_size: int) -> Iterator[tuple]:
    """Endless micro-batches in sampler order; the caller advances the sampler as it consumes them."""
    from torch.utils.data import DataLoader

    while True:
        epoch = sampler.epoch
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True, num_workers=0)
        for batch in loader:
            yield batch
        if sampler.epoch == epoch:  # a short tail (< batch_size) was dropped: start the next epoch
            sampler.epoch, sampler.position = epoch + 1, 0
