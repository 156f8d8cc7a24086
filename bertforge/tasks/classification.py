"""Sentence(-pair) classification and regression data: examples, features, batches.

The GLUE readers and the submission writer live in `bertforge.tasks.glue`; this module holds what
every classification task shares, and the reader for the user's own files:

* `InputExample`: one example, as in Google's `run_classifier.py`.
* `read_classify_file(path)`: CSV, TSV or JSON-lines with `text`, optional `text_pair`, `label`.
* `convert_examples_to_features(...)`: token ids, unpadded (BERT's `[CLS] A [SEP] B [SEP]`).
* `collate(features)`: a batch of tensors padded to its longest row (dynamic padding).
* `length_grouped_order(...)`: an epoch's order with batches of similar lengths.

Labels: a classification task has a label list (strings); a feature's label is the index into it,
which is the id the model predicts and what `config.id2label = dict(enumerate(label_list))`
records. A regression task (STS-B; `regression=True`) has no label list and float labels.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["InputExample", "collate", "convert_examples_to_features", "id2label", "length_grouped_order",
           "read_classify_file", "sort_labels"]


@dataclass
class InputExample:
    """One example. `guid` is "<set>-<id>": "train-17", "dev_matched-4", "test-0"; the part after
    the last "-" is the example's id in its file (the `index` of a GLUE test file), see `id`.
    `label` is the label string, the float score of a regression task, or None when unlabelled."""

    guid: str
    text_a: str
    text_b: str | None = None
    label: str | float | None = None

    @property
    def id(self) -> str:
        """The id within its file: what a GLUE submission's `index` column holds for a test example."""
        return self.guid.rpartition("-")[2]


# ---------------------------------------------------------------------------- the user's own files

CLASSIFY_EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}


def sort_labels(labels) -> list[str]:
    """The label list in a deterministic order: numerically when every label is an integer
    ("2" before "10"), else lexicographically. Label id i is the i-th entry."""
    unique = set(labels)
    try:
        return sorted(unique, key=int)
    except ValueError:
        return sorted(unique)


def id2label(label_list: Sequence[str]) -> dict[int, str]:
    """The mapping to store as `BertConfig.id2label` (saved in config.json with the model)."""
    return dict(enumerate(label_list))


def _classify_label(raw: Any, regression: bool, where: str) -> str | float:
    if regression:
        if isinstance(raw, bool):
            raise ValueError(f"{where}: label {raw!r} is not a number (regression=True)")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: label {raw!r} is not a number (regression=True needs a numeric "
                             f"label; drop regression=True for class labels)") from None
        if not math.isfinite(value):
            raise ValueError(f"{where}: label {raw!r} is not a finite number")
        return value
    if isinstance(raw, bool):
        return str(raw).lower()  # JSON true/false
    if isinstance(raw, int):
        return str(raw)
    if isinstance(raw, float):
        if raw.is_integer():
            return str(int(raw))
        raise ValueError(f"{where}: label {raw!r} is a fractional number; for a regression task "
                         f"use regression=True")
    if isinstance(raw, str):
        label = raw.strip()
        if not label:
            raise ValueError(f"{where}: empty label")
        return label
    raise ValueError(f"{where}: label must be a string or a number, got {type(raw).__name__}")


def _classify_text(raw: Any, key: str, where: str) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"{where}: '{key}' must be a string, got {type(raw).__name__}")
    if not raw.strip():
        raise ValueError(f"{where}: empty '{key}'")
    return raw


def _records_delimited(path: Path, delimiter: str):
    """(line number, {column: value}) per data row of a CSV/TSV with a header line.

    Standard CSV quoting (what pandas, Excel and the csv module write): a field holding the
    delimiter, a newline or a leading quote is quoted, `"` inside it doubled.
    """
    with open(path, encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle, delimiter=delimiter)
        try:
            header = next(reader, None)
        except csv.Error as error:
            raise ValueError(f"{path}:1: {error}") from None
        if header is None:
            raise ValueError(f"{path}: empty file (expected a header line naming the columns)")
        header = [name.strip() for name in header]
        if "text" not in header:
            raise ValueError(f"{path}:1: no 'text' column in the header (found: {', '.join(header)}); "
                             f"expected columns text, optional text_pair, label")
        duplicates = sorted({name for name in header if header.count(name) > 1})
        if duplicates:
            raise ValueError(f"{path}:1: duplicate column(s) {', '.join(duplicates)}")
        while True:
            start = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                raise ValueError(f"{path}:{start}: {error}") from None
            if not row:  # a blank line
                continue
            if len(row) != len(header):
                raise ValueError(f"{path}:{start}: expected {len(header)} fields ({', '.join(header)}), "
                                 f"found {len(row)}")
            yield start, dict(zip(header, row))


def _records_jsonl(path: Path):
    with open(path, encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error.msg} at column {error.colno})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object with keys text, optional text_pair, "
                                 f"label; got {type(record).__name__}")
            if "text" not in record:
                raise ValueError(f"{path}:{number}: no 'text' key (found: {', '.join(record) or 'none'})")
            yield number, record


def read_classify_file(path: str | os.PathLike, regression: bool = False, *,
                       label_list: Sequence[str] | None = None,
                       require_labels: bool = True) -> tuple[list[InputExample], list[str] | None]:
    """Read the user's own classification (or regression) data.

    By extension: `.csv`, `.tsv` (a header line naming the columns) or `.jsonl` / `.json` (one JSON
    object per line). Columns/keys: `text`, optional `text_pair`, and `label`; others are ignored.

    Returns `(examples, label_list)`. For classification the label list is the sorted set of the
    labels found (see `sort_labels`) unless `label_list` is given, the training set's, in which
    case a dev/test label outside it is an error: read the training file first and pass its list
    on, and save it with the model as `config.id2label = id2label(label_list)`. With
    `regression=True`, labels are floats and the label list is None.

    `require_labels=False` reads unlabelled files (for prediction): a file without a label
    column, or rows whose label is missing (JSON: absent or null), give `label=None`.
    Errors name `file:line`.
    """
    path = Path(path)
    kind = CLASSIFY_EXTENSIONS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"{path}: unknown extension {path.suffix!r}; use .csv, .tsv, .jsonl or .json (JSON lines)")
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    if regression and label_list is not None:
        raise ValueError("a regression task has no label list")
    records = _records_jsonl(path) if kind == "jsonl" else _records_delimited(path, "," if kind == "csv" else "\t")
    known = None if label_list is None else {label: i for i, label in enumerate(label_list)}
    examples = []
    for number, record in records:
        where = f"{path}:{number}"
        text = _classify_text(record["text"], "text", where)
        pair = record.get("text_pair")
        if pair is not None:
            pair = _classify_text(pair, "text_pair", where)
        raw = record.get("label")
        if isinstance(raw, str) and not raw.strip() and not require_labels:
            raw = None  # an empty cell in an unlabelled file
        if raw is None:
            if require_labels:
                what = ("no 'label' column in the header" if kind != "jsonl" else
                        "no 'label' key" if "label" not in record else "label is null")
                raise ValueError(f"{where}: {what}; pass require_labels=False to read unlabelled data")
            label = None
        else:
            label = _classify_label(raw, regression, where)
            if known is not None and label not in known:
                raise ValueError(f"{where}: label {label!r} is not one of the training labels {list(label_list)}")
        examples.append(InputExample(f"{path.stem}-{len(examples)}", text, pair, label))
    if not examples:
        raise ValueError(f"{path}: no examples")
    if regression:
        return examples, None
    if label_list is not None:
        return examples, list(label_list)
    found = [e.label for e in examples if e.label is not None]
    return examples, (sort_labels(found) if found else None)


# ---------------------------------------------------------------------------- features and batches

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
                           "label": _feature_label(examples[i], label_map)}
    return features


def _feature_label(example: InputExample, label_map: dict[str, int] | None):
    if example.label is None:
        return None
    if label_map is None:
        return float(example.label)
    try:
        return label_map[example.label]
    except KeyError:
        raise ValueError(f"example {example.guid}: label {example.label!r} is not in the label list "
                         f"{list(label_map)}") from None


def collate(features: Sequence[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest row: `input_ids`, `token_type_ids`, `attention_mask` (B, S) int64,
    and `labels` (B,) — float32 for regression (float labels), int64 for classification. No
    `labels` when the batch is unlabelled."""
    if not features:
        raise ValueError("empty batch")
    lengths = [len(f["input_ids"]) for f in features]
    size = (len(features), max(lengths))
    input_ids = torch.full(size, pad_token_id, dtype=torch.long)
    token_type_ids = torch.zeros(size, dtype=torch.long)
    attention_mask = torch.zeros(size, dtype=torch.long)
    for row, (feature, length) in enumerate(zip(features, lengths)):
        input_ids[row, :length] = torch.tensor(feature["input_ids"], dtype=torch.long)
        token_type_ids[row, :length] = torch.tensor(feature["token_type_ids"], dtype=torch.long)
        attention_mask[row, :length] = 1
    batch = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
    labels = [f.get("label") for f in features]
    missing = sum(label is None for label in labels)
    if missing == len(labels):
        return batch
    if missing:
        raise ValueError(f"{missing} of {len(labels)} features in the batch have no label")
    regression = any(isinstance(label, float) for label in labels)
    batch["labels"] = torch.tensor(labels, dtype=torch.float32 if regression else torch.long)
    return batch


def length_grouped_order(lengths: Sequence[int], batch_size: int, seed: int, epoch: int = 0,
                         chunk_batches: int = 50) -> list[int]:
    """An epoch's example order in which each batch holds examples of similar length.

    The trick of Hugging Face's `group_by_length`: shuffle all examples, cut them into chunks of
    `batch_size * chunk_batches`, sort each chunk by length (longest first) and cut it into
    batches, then shuffle the batches, so that batches pad little yet every batch and the batch
    order are random. The batch holding the longest example goes first (an out-of-memory shows at
    step 1, not hours in) and a final partial batch stays last, so `order[k*batch_size:(k+1)*batch_size]`
    is always batch k. Deterministic for a (seed, epoch); a different epoch gives a different order.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    lengths = np.asarray(lengths)
    rng = np.random.default_rng([seed, epoch])
    permutation = rng.permutation(len(lengths))
    chunk = batch_size * chunk_batches
    batches = []
    for start in range(0, len(permutation), chunk):
        part = permutation[start:start + chunk]
        part = part[np.argsort(-lengths[part], kind="stable")]
        batches.extend(part[i:i + batch_size] for i in range(0, len(part), batch_size))
    if not batches:
        return []
    last = batches.pop() if len(batches[-1]) < batch_size else None
    batches = [batches[i] for i in rng.permutation(len(batches))]
    if batches:
        longest = max(range(len(batches)), key=lambda b: lengths[batches[b]].max())
        batches[0], batches[longest] = batches[longest], batches[0]
    if last is not None:
        batches.append(last)
    return [int(i) for batch in batches for i in batch]
