"""Metrics summed over a logging window: what the Trainer logs every `log_every` steps.

A metric is a value (averaged over micro-batches) or a pair (numerator, denominator), summed over the
window and the processes before dividing: e.g. ("correct", "count") for an accuracy. The sums stay on
the device and are reduced only at logging steps, so the loop does not wait on the device every step.
"""

from __future__ import annotations

from typing import Any

import torch

from .distributed import DistributedContext

Batch = dict[str, torch.Tensor]

__all__ = ["MetricWindow", "default_count", "default_tokens", "is_pair"]


def default_count(batch: Batch) -> float:
    """The units a micro-batch's mean loss is taken over, by default: its examples."""
    return float(len(next(iter(batch.values()))))


def default_tokens(batch: Batch) -> int:
    """The tokens a micro-batch reads (for tokens per second): its real tokens, else all its positions."""
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    if "input_ids" in batch:
        return batch["input_ids"].numel()
    return len(next(iter(batch.values())))


def is_pair(value: Any) -> bool:
    """Whether a metric is given as (numerator, denominator)."""
    return isinstance(value, (tuple, list)) and len(value) == 2


class MetricWindow:
    """Sums over the steps since the last log: (numerator, denominator) per name, kept on the device."""

    def __init__(self):
        self.sums: dict[str, list] = {}

    def add(self, name: str, numerator, denominator=1.0) -> None:
        if isinstance(numerator, torch.Tensor):
            numerator = numerator.detach().double()
        if isinstance(denominator, torch.Tensor):
            denominator = denominator.detach().double()
        entry = self.sums.get(name)
        if entry is None:
            self.sums[name] = [numerator, denominator]
        else:
            entry[0] = entry[0] + numerator
            entry[1] = entry[1] + denominator

    def add_metric(self, name: str, value: Any) -> None:
        """Add a metric given as a value or as a (numerator, denominator) pair."""
        self.add(name, *(value if is_pair(value) else (value, 1.0)))

    def reduce(self, context: DistributedContext) -> dict[str, float]:
        """Sum over processes, then divide: one transfer from the device for all names."""
        if not self.sums:
            return {}
        names = sorted(self.sums)
        values = torch.stack([torch.as_tensor(self.sums[n][i], dtype=torch.float64, device=context.device)
                              for n in names for i in (0, 1)])
        values = context.all_reduce_sum(values).tolist()
        return {n: (values[2 * i] / values[2 * i + 1] if values[2 * i + 1] else float("nan"))
                for i, n in enumerate(names)}

    def state(self) -> dict[str, list[float]]:
        return {n: [float(a), float(b)] for n, (a, b) in self.sums.items()}

    def load(self, state: dict[str, list[float]]) -> None:
        self.sums = {n: [float(a), float(b)] for n, (a, b) in state.items()}
