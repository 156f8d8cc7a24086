"""Sentence(-pair) classification features and batches: token ids, long inputs, padded batches.

* `convert_examples_to_features(...)`: token ids, unpadded (BERT's `[CLS] A [SEP] B [SEP]`).
* `convert_examples_to_window_features(...)`: a long input as overlapping windows instead of truncated.
* `collate(features)`: a batch of tensors padded to its longest row (dynamic padding), from
  `pad_batch` (the model inputs, `bertforge.tasks.arrays.padded_inputs`) and `batch_labels`, which
  other tasks' collates use too.
"""

from __future__ import annotations

from typing import Sequence

import torch

from .arrays import padded_inputs
from .classify_reader import InputExample
from .windows import windows

__all__ = ["LONG_INPUT_MODES", "batch_labels", "collate", "convert_examples_to_features",
           "convert_examples_to_window_features", "example_label", "examples_to_features", "pad_batch"]


def convert_examples_to_features(examples: Sequence[InputExample], tokenizer, label_list: Sequence[str] | None,
                                 max_seq_length: int = 128) -> list[dict]:
    """Tokenize into `{"input_ids", "token_type_ids", "label"}` per example, NOT padded.

    `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, truncated to `max_seq_length` tokens (specials
    included) by removing tokens from the longer text first, as Google's `_truncate_seq_pair`.
    `label` is the index into `label_list`, a float when `label_list` is None (regression), and
    None for an unlabelled example.
    """
    features: list[dict | None] = [None] * len(examples)
    label_map = None if label_list is None else {label: i for i, label in enumerate(label_list)}
    # encode_batch takes all-pairs or all-singles: encode each kind, keep the input order.
    for pair in (False, True):
        indices = [i for i, e in enumerate(examples) if (e.text_b is not None) == pair]
        if not indices:
            continue
        encoded = tokenizer.encode_batch([examples[i].text_a for i in indices],
                                         [examples[i].text_b for i in indices] if pair else None,
                                         max_length=max_seq_length, truncation="longest_first", padding=False)
        for i, row in zip(indices, encoded):
            features[i] = {"input_ids": row["input_ids"], "token_type_ids": row["token_type_ids"],
                           "label": example_label(examples[i], label_map)}
    return features


def example_label(example: InputExample, label_map: dict[str, int] | None) -> int | float | None:
    """An example's label as a feature carries it: its index in `label_map`, a float when `label_map` is
    None (regression), None for an unlabelled example; ValueError naming the example for an unknown label."""
    if example.label is None:
        return None
    if label_map is None:
        return float(example.label)
    try:
        return label_map[example.label]
    except KeyError:
        raise ValueError(f"example {example.guid}: label {example.label!r} is not in the label list "
                         f"{list(label_map)}") from None


def pad_batch(features: Sequence[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """The model inputs of a batch of unpadded features, padded to its longest row: `input_ids`
    (padded with `pad_token_id`), `token_type_ids` and `attention_mask` (padded with 0), each (B, S)
    int64. The part of `collate` that every sequence-per-row task shares (SQuAD's too)."""
    return padded_inputs(features, pad_token_id)


def batch_labels(features: Sequence[dict]) -> list | None:
    """The `label` of each feature of a batch, or None when none has one (a batch to predict on).
    A batch in which only some features are labelled is a ValueError: its loss would be wrong."""
    labels = [f.get("label") for f in features]
    missing = sum(label is None for label in labels)
    if missing == len(labels):
        return None
    if missing:
        raise ValueError(f"{missing} of {len(labels)} features in the batch have no label")
    return labels


def collate(features: Sequence[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest row: `input_ids`, `token_type_ids`, `attention_mask` (B, S) int64,
    and `labels` (B,) — float32 for regression (float labels), int64 for classification. No
    `labels` when the batch is unlabelled."""
    batch = pad_batch(features, pad_token_id)
    labels = batch_labels(features)
    if labels is None:
        return batch
    regression = any(isinstance(label, float) for label in labels)
    batch["labels"] = torch.tensor(labels, dtype=torch.float32 if regression else torch.long)
    return batch


# ---------------------------------------------------------------------------- long inputs

LONG_INPUT_MODES = ("truncate", "windows")


def _content_ids(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """WordPiece ids of each text without special tokens and without truncation."""
    rows = tokenizer.encode_batch(list(texts), max_length=1 << 30, truncation=False, padding=False)
    return [row["input_ids"][1:-1] for row in rows]  # strip [CLS] ... [SEP]


def convert_examples_to_window_features(examples: Sequence[InputExample], tokenizer,
                                        label_list: Sequence[str] | None, max_seq_length: int = 128,
                                        stride: int | None = None) -> list[dict]:
    """Like `convert_examples_to_features`, but an example longer than `max_seq_length` becomes several
    overlapping windows instead of being truncated: `{"input_ids", "token_type_ids", "label", "example"}`
    per window, `example` being the index of its example (every window carries the example's label, so
    training sees the whole document and evaluation aggregates the windows' logits, see
    `aggregate_window_logits`).

    A single text is cut into windows of `max_seq_length - 2` tokens (`[CLS] window [SEP]`) whose starts
    are `stride` tokens apart (default: half a window, so each token lies in at most two windows). For a
    pair, the longer text is windowed and the shorter kept whole in every window (truncated to at most
    half of the room if need be), segments in their original order. An example that fits gives one
    window, identical to the `truncate` feature.
    """
    label_map = None if label_list is None else {label: i for i, label in enumerate(label_list)}
    texts_a = _content_ids(tokenizer, [e.text_a for e in examples])
    pairs = [i for i, e in enumerate(examples) if e.text_b is not None]
    texts_b: dict[int, list[int]] = dict(zip(pairs, _content_ids(tokenizer, [examples[i].text_b for i in pairs])))
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    features = []
    for index, example in enumerate(examples):
        label = example_label(example, label_map)
        a, b = texts_a[index], texts_b.get(index)
        room = max_seq_length - (2 if b is None else 3)  # tokens left after the special tokens
        if room < 2:
            raise ValueError(f"max_seq_length={max_seq_length} leaves no room for text")
        if b is None:
            long, short, long_first = a, None, True
        else:
            long_first = len(a) >= len(b)
            long, short = (a, b) if long_first else (b, a)
            short = short[:max(room - len(long), room // 2)]  # whole if it fits beside the long text
        width = room - (0 if short is None else len(short))
        step = max(1, width // 2) if stride is None else stride
        for start, end in windows(len(long), width, step):
            piece = long[start:end]
            if short is None:
                ids, types = [cls, *piece, sep], [0] * (len(piece) + 2)
            else:
                first, second = (piece, short) if long_first else (short, piece)
                ids = [cls, *first, sep, *second, sep]
                types = [0] * (len(first) + 2) + [1] * (len(second) + 1)
            features.append({"input_ids": ids, "token_type_ids": types, "label": label, "example": index})
    return features


def examples_to_features(examples: Sequence[InputExample], tokenizer, label_list: Sequence[str] | None,
                         max_seq_length: int, long_input: str, stride: int | None) -> list[dict]:
    """The features of `examples` under a `long_input` mode: "truncate" (`convert_examples_to_features`)
    or "windows" (`convert_examples_to_window_features`, `stride` tokens between window starts)."""
    if long_input == "truncate":
        return convert_examples_to_features(examples, tokenizer, label_list, max_seq_length)
    if long_input == "windows":
        return convert_examples_to_window_features(examples, tokenizer, label_list, max_seq_length, stride)
    raise ValueError(f"long_input must be one of {', '.join(LONG_INPUT_MODES)}, got {long_input!r}")
