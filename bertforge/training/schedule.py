"""The learning-rate schedule of BERT: linear warm-up from 0, then linear decay to 0 at the last step."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def warmup_steps_for(total_steps: int, warmup_steps: int | None = None, warmup_ratio: float | None = None) -> int:
    """Warm-up length in steps, from a count or a fraction of `total_steps` (not both)."""
    if warmup_steps is not None and warmup_ratio is not None:
        raise ValueError("give the warm-up as steps or as a ratio, not both")
    if warmup_ratio is not None:
        if not 0 <= warmup_ratio <= 1:
            raise ValueError(f"warmup ratio must be in [0, 1], got {warmup_ratio}")
        return math.ceil(total_steps * warmup_ratio)
    if warmup_steps is not None and warmup_steps < 0:
        raise ValueError(f"warmup steps must be >= 0, got {warmup_steps}")
    return warmup_steps or 0


class LinearWarmupDecay:
    """The LR multiplier at a step: step / warmup while warming up, then (total - step) / (total - warmup).

    A plain class, not a closure, so LambdaLR's state_dict records it and a resumed run checks it.
    """

    def __init__(self, total_steps: int, warmup_steps: int = 0):
        if total_steps <= 0:
            raise ValueError(f"total steps must be > 0, got {total_steps}")
        self.total_steps, self.warmup_steps = total_steps, min(warmup_steps, total_steps)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / self.warmup_steps
        return max(0.0, (self.total_steps - step) / max(1, self.total_steps - self.warmup_steps))


def linear_schedule(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int | None = None,
                    warmup_ratio: float | None = None) -> LambdaLR:
    """LambdaLR with linear warm-up (given in steps or as a ratio of `total_steps`) and linear decay to 0."""
    return LambdaLR(optimizer, LinearWarmupDecay(total_steps, warmup_steps_for(total_steps, warmup_steps, warmup_ratio)))
