"""Embedding-table gradients on CPU as the rows a step touched, added into one buffer kept between steps.

Why: the dense gradient of a (V, H) embedding table has V·H numbers, of which a batch of T tokens
touches at most T rows. Autograd's dense backward zero-fills and scatters into the whole table every
step (for BERT's 30,522 × 384 word embeddings, 47 MB), and global-norm clipping then reads all of it
again. With `nn.Embedding(sparse=True)` the lookup's backward gives only the rows; before clipping and
the optimizer step `SparseEmbeddingGrads.densify` takes the norm of those rows and adds them into a
dense buffer that the optimizer sees as the gradient, the same numbers as the dense backward's. The
buffer is kept between steps; with `zero_rows_only` (the Trainer's own fused AdamW, which writes a
gradient only to divide it by clipping's factor, leaving zeros at zero) only the rows the previous
step wrote are zeroed again, not the whole table.

The Trainer turns this on for large tables (`MIN_NUMEL`) while it trains on CPU in one process (DDP's
and FSDP's reductions expect dense gradients) and turns it off again when training ends, so that the
model it hands back has the tables it was given.
"""

from __future__ import annotations

import torch
from torch import nn

MIN_NUMEL = 1 << 20  # tables of at least this many numbers (a vocabulary, not position or segment tables)


class SparseEmbeddingGrads:
    """The large embedding tables of a model, switched to sparse gradients inside `with`."""

    def __init__(self, model: nn.Module, zero_rows_only: bool = False):
        """zero_rows_only: nothing but this class writes nonzeros into the gradient buffers between steps
        (true of the Trainer's AdamW), so zeroing the rows written last suffices."""
        self.zero_rows_only = zero_rows_only
        self.modules = [module for module in model.modules()
                        if isinstance(module, nn.Embedding) and not module.sparse
                        and module.weight.requires_grad and module.weight.numel() >= MIN_NUMEL]
        # per table (by id of its weight): the dense gradient buffer and the rows of it last written
        self._buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __enter__(self) -> SparseEmbeddingGrads:
        for module in self.modules:
            module.sparse = True
        return self

    def __exit__(self, *exc) -> None:
        for module in self.modules:
            module.sparse = False
        self._buffers.clear()

    def densify(self) -> dict[torch.Tensor, torch.Tensor]:
        """Replace each sparse table gradient by the dense one, in a buffer kept between steps.
        Returns {parameter: the 2-norm of its gradient} for the tables it replaced."""
        norms = {}
        for module in self.modules:
            weight = module.weight
            grad = weight.grad
            if grad is None or not grad.is_sparse:
                continue
            grad = grad.coalesce()  # one row per token id: repeated ids summed
            buffer, written = self._buffers.get(id(weight), (None, None))
            if buffer is None or buffer.shape != weight.shape or buffer.dtype != weight.dtype:
                buffer = torch.zeros_like(weight, memory_format=torch.contiguous_format)
            elif self.zero_rows_only:
                buffer.index_fill_(0, written, 0)
            else:
                buffer.zero_()
            values, rows = grad.values(), grad.indices()[0]
            buffer.index_add_(0, rows, values)
            self._buffers[id(weight)] = (buffer, rows)
            weight.grad = buffer
            norms[weight] = torch.linalg.vector_norm(values)
        return norms
