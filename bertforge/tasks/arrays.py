"""Array helpers every task and pipeline shares: padding rows of ids into a batch, and softmax.

One padding helper (`pad_rows`) builds every padded batch in bertforge (the fine-tuning collates of
classification, SQuAD, multiple choice and NER windows, and the serving pipelines), so that a
padding value or a mask is decided in one place. It returns numpy; `padded_inputs` wraps the three
model inputs as torch tensors (shared memory, no copy) for training and prediction.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


def pad_rows(rows: Sequence[Sequence[int]], value: int = 0, width: int | None = None) -> np.ndarray:
    """`rows` of different lengths as one int64 array (N, width), each row left-aligned and filled
    with `value` after its end. width: default the longest row."""
    width = max((len(row) for row in rows), default=0) if width is None else width
    out = np.full((len(rows), width), value, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def attention_mask(lengths: Sequence[int], width: int) -> np.ndarray:
    """(N, width) int64: 1 on each row's first `lengths[i]` positions (the real tokens), 0 on padding."""
    return (np.arange(width)[None, :] < np.asarray(lengths, dtype=np.int64)[:, None]).astype(np.int64)


def pad_inputs(input_ids: Sequence[Sequence[int]], token_type_ids: Sequence[Sequence[int]] | None,
               pad_token_id: int = 0) -> dict[str, np.ndarray]:
    """The three model inputs of unpadded rows, padded to the longest: `input_ids` (padded with
    `pad_token_id`), `token_type_ids` (0 on padding; all 0 when None) and `attention_mask`, each
    (B, S) int64. ValueError for an empty batch."""
    if not input_ids:
        raise ValueError("empty batch")
    ids = pad_rows(input_ids, pad_token_id)
    width = ids.shape[1]
    types = np.zeros_like(ids) if token_type_ids is None else pad_rows(token_type_ids, 0, width)
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": attention_mask([len(r) for r in input_ids], width)}


def padded_inputs(features: Sequence[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """`pad_inputs` of features (dicts with `input_ids` and optionally `token_type_ids`) as int64
    torch tensors (B, S): the part of every sequence-per-row collate that tasks share."""
    types = [f["token_type_ids"] for f in features] if features and "token_type_ids" in features[0] else None
    batch = pad_inputs([f["input_ids"] for f in features], types, pad_token_id)
    return {name: torch.from_numpy(value) for name, value in batch.items()}


def softmax(x: np.ndarray | Sequence[float], axis: int = -1, dtype: np.dtype | type = np.float32) -> np.ndarray:
    """exp(x) / sum(exp(x)) along `axis`, computed in `dtype` (the max subtracted first, so large
    logits do not overflow). float32 for model outputs as they are; float64 where scores are
    compared or written with many digits (SQuAD's n-best probabilities)."""
    x = np.asarray(x, dtype=dtype)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


__all__ = ["MODEL_INPUTS", "attention_mask", "pad_inputs", "pad_rows", "padded_inputs", "softmax"]
