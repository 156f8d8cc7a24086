"""The order in which training reads its data: an epoch's permutation, the examples of each step and
process, and where in the data a run stands.

Each epoch visits the dataset in a permutation drawn from a generator seeded with (seed, epoch); a step
takes the next `batch_size × grad_accum` indices and each process reads its own slice of every
micro-batch (`StepPlan`). The data position is therefore (phase, epoch, steps done in the epoch)
(`DataPosition`), and a resumed run continues with the exact next batch. `length_grouped_order` is the
alternative epoch order whose batches hold examples of similar lengths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

__all__ = ["DataPosition", "StepPlan", "epoch_permutation", "length_grouped_order"]


@dataclass
class DataPosition:
    phase: int = 0
    epoch: int = 0
    step_in_epoch: int = 0  # steps of this epoch already done


def epoch_permutation(size: int, seed: int, epoch: int, phase: int = 0) -> torch.Tensor:
    """The order of an epoch: a permutation from a generator seeded with (seed, epoch) (and the phase after the first)."""
    entropy = [seed, epoch] if phase == 0 else [seed, epoch, phase]
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence(entropy).generate_state(1)[0]))
    return torch.randperm(size, generator=generator)


class StepPlan:
    """Which examples each process reads at each step of an epoch."""

    def __init__(self, size: int, batch_size: int, grad_accum: int, world_size: int, rank: int, drop_last: bool):
        if batch_size % world_size:
            raise ValueError(f"batch size {batch_size} is not divisible by the {world_size} processes")
        self.size, self.batch_size, self.grad_accum = size, batch_size, grad_accum
        self.world_size, self.rank = world_size, rank
        self.step_size = batch_size * grad_accum
        usable = size - size % world_size  # an incomplete step still splits evenly over the processes
        self.usable = (size // self.step_size) * self.step_size if drop_last else usable
        self.steps_per_epoch = math.ceil(self.usable / self.step_size)
        if self.steps_per_epoch == 0:
            raise ValueError(f"the dataset has {size} examples, fewer than one step of batch size "
                             f"{batch_size} × grad accumulation {grad_accum}")

    def micro_batches(self, order: torch.Tensor, step: int) -> list[list[int]]:
        """This process's micro-batches (lists of dataset indices) of step `step` of the epoch."""
        chunk = order[step * self.step_size: min((step + 1) * self.step_size, self.usable)].tolist()
        micro = []
        for start in range(0, len(chunk), self.batch_size):
            part = chunk[start: start + self.batch_size]
            share = len(part) // self.world_size
            micro.append(part[self.rank * share: (self.rank + 1) * share])
        return micro


def length_grouped_order(lengths: Sequence[int], batch_size: int, seed: int, epoch: int = 0,
                         chunk_batches: int = 50) -> list[int]:
    """An epoch's example order in which each batch holds examples of similar length.

    The trick of Hugging Face's `group_by_length`: shuffle all examples, cut them into chunks of
    `batch_size * chunk_batches`, sort each chunk by length (longest first) and cut it into
    batches, then shuffle the batches, so that batches pad little yet every batch and the batch
    order are random. The batch holding the longest example goes first (an out-of-memory shows at
    step 1, not hours in) and a final partial batch stays last, so `order[k*batch_size:(k+1)*batch_size]`
    is always batch k. Deterministic for a (seed, epoch); a different epoch gives a different order.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    lengths = np.asarray(lengths)
    rng = np.random.default_rng([seed, epoch])
    permutation = rng.permutation(len(lengths))
    chunk = batch_size * chunk_batches
    batches = []
    for start in range(0, len(permutation), chunk):
        part = permutation[start:start + chunk]
        part = part[np.argsort(-lengths[part], kind="stable")]
        batches.extend(part[i:i + batch_size] for i in range(0, len(part), batch_size))
    if not batches:
        return []
    last = batches.pop() if len(batches[-1]) < batch_size else None
    batches = [batches[i] for i in rng.permutation(len(batches))]
    if batches:
        longest = max(range(len(batches)), key=lambda b: lengths[batches[b]].max())
        batches[0], batches[longest] = batches[longest], batches[0]
    if last is not None:
        batches.append(last)
    return [int(i) for batch in batches for i in batch]
