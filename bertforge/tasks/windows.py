"""Inputs longer than the model's window: overlapping windows and maximal-context scoring.

One piece shared by every task whose input can outgrow `max_seq_length` (SQuAD passages, NER
documents, long classification inputs, and the `tag`/`answer` serving pipelines):

* `windows(length, max_tokens, stride)`: the [start, end) spans of Google's `run_squad.py`
  ("doc spans"): windows of at most `max_tokens` tokens whose starts are `stride` (`doc_stride`)
  apart, the last one ending at the end of the sequence.
* `max_context_window(position, spans)`: a token lying in several windows is scored (predicted,
  labelled) only in the window where it has the most context on both sides: Google's
  `_check_is_max_context`, score = min(left context, right context) + 0.01 * window length,
  the first window winning a tie.
* `max_context_flags(spans, index)`: Google's `token_is_max_context` of one window, one flag per
  token of that window.
* `aggregate_window_logits(logits, groups, how)`: one prediction per input from its windows'
  logits, for classifying a document longer than one window rather than silently truncating it.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["aggregate_window_logits", "max_context_flags", "max_context_window", "windows"]

Span = tuple[int, int]


def windows(length: int, max_tokens: int, stride: int) -> list[Span]:
    """[start, end) token windows covering `length` tokens, each at most `max_tokens` long, starts
    `stride` apart (Google's run_squad `doc_stride`); the last window ends at `length`.

    A sequence of 0 tokens still gets one (empty) window, so every input yields a feature.
    """
    if max_tokens < 1:
        raise ValueError(f"no room for any token in a window of {max_tokens}")
    spans, start = [], 0
    while True:
        end = min(length, start + max_tokens)
        spans.append((start, end))
        if end >= length:
            return spans
        # Never step past the window's end (a stride larger than the window would skip tokens).
        start += min(end - start, max(1, stride))


def _context_score(position: int, span: Span) -> float:
    start, end = span
    return min(position - start, end - 1 - position) + 0.01 * (end - start)


def max_context_window(position: int, spans: Sequence[Span]) -> int:
    """The index of the window in which token `position` has the most context on both sides
    (Google's `_check_is_max_context`: min(left, right) + 0.01 * window length; the first wins a
    tie); -1 when no window holds the token."""
    best, best_score = -1, -math.inf
    for index, span in enumerate(spans):
        if span[0] <= position < span[1]:
            score = _context_score(position, span)
            if score > best_score:
                best, best_score = index, score
    return best


def max_context_flags(spans: Sequence[Span], index: int) -> list[bool]:
    """For each token of window `index` (in order), whether this is the window where it has maximal
    context (Google's `token_is_max_context`). Only the neighbouring windows can hold its tokens, so
    this costs O(window length x overlapping windows)."""
    start, end = spans[index]
    neighbours = [i for i, (s, e) in enumerate(spans) if s < end and start < e]
    flags = []
    for position in range(start, end):
        best, best_score = -1, -math.inf
        for i in neighbours:
            s, e = spans[i]
            if s <= position < e:
                score = _context_score(position, spans[i])
                if score > best_score:
                    best, best_score = i, score
        flags.append(best == index)
    return flags


def aggregate_window_logits(logits: np.ndarray, groups: Sequence[int], how: str = "mean") -> tuple[np.ndarray, list[int]]:
    """One row of logits per input from the rows of its windows.

    Args:
        logits: (W, K) logits of W windows.
        groups: (W,) the input each window came from (any hashable ids; windows of one input need
            not be adjacent).
        how: "mean" (average the windows' logits: every part of the document votes) or "max"
            (element-wise maximum: one window's strong evidence is enough).

    Returns:
        (N, K) logits, one row per distinct group, and the group ids in that row order (first
        appearance order).
    """
    logits = np.asarray(logits)
    if len(logits) != len(groups):
        raise ValueError(f"{len(logits)} rows of logits but {len(groups)} group ids")
    if how not in ("mean", "max"):
        raise ValueError(f"how must be 'mean' or 'max', got {how!r}")
    order: dict = {}
    for group in groups:
        order.setdefault(group, len(order))
    rows = np.array([order[g] for g in groups], dtype=np.int64)
    width = logits.shape[1:] if logits.ndim > 1 else ()
    out = np.full((len(order), *width), -np.inf if how == "max" else 0.0, dtype=np.float64)
    if how == "max":
        np.maximum.at(out, rows, logits)
    else:
        np.add.at(out, rows, logits)
        out /= np.bincount(rows, minlength=len(order)).reshape(-1, *([1] * len(width)))
    return out.astype(logits.dtype if np.issubdtype(logits.dtype, np.floating) else np.float64), list(order)
