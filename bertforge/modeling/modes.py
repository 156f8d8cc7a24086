"""Switching a module to evaluation mode for a block and back, the one way every stage does it."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from torch import nn


@contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """`with evaluating(model):` runs the block with dropout off (`module.eval()`), then restores the
    mode each submodule had before (a model under training goes back to training). Gradients are the
    caller's choice (`torch.no_grad()` / `torch.inference_mode()`)."""
    modes = {name: sub.training for name, sub in module.named_modules()}
    module.eval()
    try:
        yield module
    finally:
        for name, sub in module.named_modules():
            sub.training = modes.get(name, sub.training)
