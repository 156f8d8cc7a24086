"""The learning-rate schedule of BERT: linear warm-up from 0, then linear decay to 0 at the last step.

Indexed by steps (the paper's), or by the share of a wall-clock budget already spent (Cramming's budget
schedule), so that a run of unknown speed still ends with its learning rate at 0.
"""

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


class BudgetWarmupDecay:
    """The LR multiplier of a wall-clock budget: linear warm-up over the first `warmup_steps` steps or the
    first `warmup_ratio` of the budget, then linear decay to 0 as the budget is spent.

    `fraction` (training time so far / the budget, in [0, 1]) is set by the Trainer before each scheduler
    step; the step count only times a warm-up given in steps. A step schedule sized by guess ends where
    the budget cuts it, often with the rate still high; this one reaches 0 as the budget runs out.
    """

    def __init__(self, warmup_steps: int = 0, warmup_ratio: float = 0.0):
        self.warmup_steps, self.warmup_ratio, self.fraction = warmup_steps, warmup_ratio, 0.0

    def __call__(self, step: int) -> float:
        spent = min(max(self.fraction, 0.0), 1.0)
        if step < self.warmup_steps:
            return step / self.warmup_steps
        if spent < self.warmup_ratio:
            return spent / self.warmup_ratio
        return (1.0 - spent) / max(1e-12, 1.0 - self.warmup_ratio)


def budget_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int | None = None,
                    warmup_ratio: float | None = None) -> LambdaLR:
    """LambdaLR over a wall-clock budget (see BudgetWarmupDecay): warm-up in steps or as a share of the budget."""
    if warmup_steps is not None and warmup_ratio is not None:
        raise ValueError("give the warm-up as steps or as a ratio, not both")
    if warmup_ratio is not None and not 0 <= warmup_ratio < 1:
        raise ValueError(f"warmup ratio of a budget schedule must be in [0, 1), got {warmup_ratio}")
    if warmup_steps is not None and warmup_steps < 0:
        raise ValueError(f"warmup steps must be >= 0, got {warmup_steps}")
    return LambdaLR(optimizer, BudgetWarmupDecay(warmup_steps or 0, warmup_ratio or 0.0))
