"""Masked-LM corruption of one instance, as Google's `create_masked_lm_predictions`.

One function serves both masking modes: `prepare-pretraining --masking static` calls it once per
instance while writing the shards, and `PretrainingDataset` calls it in `__getitem__` for
`--masking dynamic` (with a generator seeded by (seed, epoch, index)).

Semantics (Google's, with the two differences noted):

- candidates are all real tokens except [CLS] and the two [SEP]s;
- `num_to_predict = min(max_predictions_per_seq, max(1, int(round(n * masked_lm_prob))))` where
  n is the number of candidates. (Google multiplies the length *including* [CLS]/[SEP]; that puts
  three specials' worth of extra masks on every sequence, +2.4 % relative at 128 tokens and far more
  on short ones. Counting only maskable tokens makes the rate exactly the paper's "15 % of the
  WordPiece tokens".)
- candidates are visited in random order; with whole-word masking a candidate is a whole word (a
  piece plus the `##` pieces that follow it *in the same segment* - Google would glue a `##` piece
  that starts segment B after front truncation to the last word of A) and a word that would
  overshoot `num_to_predict` is skipped, as Google's `continue`;
- each chosen position independently becomes [MASK] with probability 0.8, a token drawn uniformly
  from the whole vocabulary with probability 0.1 (Google's `rng.randint(0, len(vocab) - 1)`), and
  stays itself with probability 0.1;
- positions are returned sorted; labels are the original tokens.
"""

from __future__ import annotations

import numpy as np


def num_to_predict(num_candidates: int, masked_lm_prob: float, max_predictions_per_seq: int) -> int:
    return min(max_predictions_per_seq, max(1, int(round(num_candidates * masked_lm_prob))))


def candidate_positions(length: int, segment_b_start: int) -> np.ndarray:
    """Positions of `[CLS] A [SEP] B [SEP]` that may be masked: all but 0, b_start-1 and length-1."""
    return np.concatenate([np.arange(1, segment_b_start - 1), np.arange(segment_b_start, length - 1)])


def choose_positions(ids: np.ndarray, length: int, segment_b_start: int, rng: np.random.Generator,
                     masked_lm_prob: float, max_predictions_per_seq: int,
                     continuation: np.ndarray | None = None) -> np.ndarray:
    """Sorted positions to predict. `continuation[id]` is True for `##` pieces (whole-word masking)."""
    cand = candidate_positions(length, segment_b_start)
    target = num_to_predict(len(cand), masked_lm_prob, max_predictions_per_seq)
    if continuation is None:
        chosen = cand[rng.permutation(len(cand))[:target]]
        chosen.sort()
        return chosen
    # A word starts at a non-## piece, or at the first token of a segment.
    cont = continuation[ids[cand]]
    cont[0] = False
    cont[1:] &= np.diff(cand) == 1
    starts = np.flatnonzero(~cont)
    ends = np.append(starts[1:], len(cand))
    picked: list[np.ndarray] = []
    count = 0
    for g in rng.permutation(len(starts)):
        if count >= target:
            break
        size = int(ends[g] - starts[g])
        if count + size > target:
            continue
        picked.append(cand[starts[g]:ends[g]])
        count += size
    chosen = np.concatenate(picked) if picked else np.empty(0, dtype=cand.dtype)
    chosen.sort()
    return chosen


def mask_instance(ids: np.ndarray, length: int, segment_b_start: int, rng: np.random.Generator, *,
                  vocab_size: int, mask_id: int, masked_lm_prob: float, max_predictions_per_seq: int,
                  continuation: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Corrupt `ids` in place; return (positions, original ids at them), both sorted by position."""
    positions = choose_positions(ids, length, segment_b_start, rng, masked_lm_prob, max_predictions_per_seq,
                                 continuation)
    labels = ids[positions].copy()
    draw = rng.random(len(positions))
    random_tokens = rng.integers(0, vocab_size, size=len(positions))
    replaced = np.where(draw < 0.8, mask_id, np.where(draw < 0.9, labels, random_tokens))
    ids[positions] = replaced
    return positions, labels
