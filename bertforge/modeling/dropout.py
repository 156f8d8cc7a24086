"""Dropout (Srivastava et al. 2014) with a cheaper mask on CPU (`attention.attend` uses it on the probabilities).

Why: torch's CPU dropout draws its mask with one generator call per element (`aten::bernoulli_`,
single-threaded), a large share of a small BERT's training step (docs/results/pretrain_step/README.md,
"Continued pre-training step"); the largest masks are on the (N, A, L, L) attention probabilities. Here each
mask is 16-bit chunks of 64-bit words (four elements per word) from numpy's SFC64 generator, seeded
by one draw from torch's default generator: each element drops when its 16 bits fall below
round(p * 2^16), i.e. with probability p rounded to a multiple of 2^-16 (0.1 -> 0.100006; at most
2^-17 away), and the kept values are scaled by 1 / (1 - that probability), so the expectation is
exactly preserved. SFC64 fills and numpy compares the words faster than torch's Mersenne Twister
and int16 comparison; the seed comes from torch's generator, so `torch.manual_seed`
and a saved RNG state reproduce every mask (exact resume). The mask is applied, forward and backward,
as one multiply by a 0/1 byte tensor and the scale (`addcmul`), not a multiply and a masked fill.

On other devices (whose own dropout kernels are fast) and outside training this is `F.dropout` unchanged.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

_LEVELS = 1 << 16  # a mask element's share of a 64-bit draw: 16 bits


def _fast(x: torch.Tensor, p: float, training: bool) -> bool:
    return training and 0.0 < p < 1.0 and x.device.type == "cpu"


def keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> torch.Tensor:
    """A uint8 CPU tensor of `shape`: 0 where an element is dropped, each with probability
    round(p * 2^16) / 2^16, independently, 1 where it is kept; seeded from torch's default generator."""
    count = math.prod(shape)
    seed = int(torch.randint(0, 1 << 62, ()))
    chunks = np.random.SFC64(seed).random_raw((count + 3) // 4).view(np.uint16)[:count]  # uniform over [0, 2^16)
    return torch.from_numpy((chunks >= round(p * _LEVELS)).view(np.uint8)).view(shape)


def drop_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """A bool tensor of `shape`, True where an element is dropped: `keep_mask`'s complement."""
    return (keep_mask(shape, p) == 0).to(device)


def kept_scale(p: float) -> float:
    """1 / (1 - P(drop)) for `keep_mask`'s rounded probability."""
    return _LEVELS / (_LEVELS - round(p * _LEVELS))


class _KeepAndScale(torch.autograd.Function):
    """x * keep * scale, keep a 0/1 byte tensor: one `addcmul` forward and one backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.addcmul(_ZERO, x, keep, value=scale)  # a 0-dim float32 zero keeps x's dtype

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return torch.addcmul(_ZERO, grad, keep, value=ctx.scale), None, None


_ZERO = torch.zeros(())


def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True) -> torch.Tensor:
    """`F.dropout(x, p, training)`; on CPU in training with `keep_mask`'s cheaper mask."""
    if not _fast(x, p, training):
        return F.dropout(x, p, training)
    if round(p * _LEVELS) >= _LEVELS:  # p rounds to 1: everything drops
        return x * 0.0
    return _KeepAndScale.apply(x, keep_mask(x.shape, p), kept_scale(p))


class Dropout(nn.Dropout):
    """`nn.Dropout` with `dropout`'s mask on CPU (the same module interface and state)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inplace or not _fast(x, self.p, self.training):
            return super().forward(x)
        return dropout(x, self.p, self.training)
