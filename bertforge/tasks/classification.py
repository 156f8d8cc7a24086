"""Sentence(-pair) classification and regression data: examples, features, batches.

The GLUE readers and the submission writer live in `bertforge.tasks.glue`; this module holds what
every classification task shares, and the reader for the user's own files:

* `InputExample`: one example, as in Google's `run_classifier.py`.
* `read_classify_file(path)`: CSV, TSV or JSON-lines with `text`, optional `text_pair`, `label`.
* `read_delimited_rows(path)`: the rows of any CSV/TSV with a header line, errors naming `file:line`
  (the SWAG reader of `bertforge.tasks.choice` uses it too).
* `convert_examples_to_features(...)`: token ids, unpadded (BERT's `[CLS] A [SEP] B [SEP]`).
* `collate(features)`: a batch of tensors padded to its longest row (dynamic padding), from
  `pad_batch` (the model inputs) and `batch_labels`, which other tasks' collates use too.
* `length_grouped_order(...)`: an epoch's order with batches of similar lengths.

Labels: a classification task has a label list (strings); a feature's label is the index into it,
which is the id the model predicts and what `config.id2label = dict(enumerate(label_list))`
records. A regression task (STS-B; `regression=True`) has no label list and float labels.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from .._files import read_text, write_text_atomic
from ..training.order import length_grouped_order  # re-exported: its home is training/order.py

__all__ = ["InputExample", "batch_labels", "collate", "convert_examples_to_features", "id2label",
           "length_grouped_order", "pad_batch", "read_classify_file", "read_delimited_rows", "sort_labels"]


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


def names_shown(names: Sequence[str], limit: int = 12, width: int = 40) -> str:
    """Column names (or keys) for a one-line error message: a name holding a line break or another
    control character (a corrupted header) is quoted, a long one cut, a long list shortened."""
    def one(name: str) -> str:
        name = name if len(name) <= width else name[:width - 3] + "..."
        return name if name.isprintable() else repr(name)

    shown = ", ".join(one(str(name)) for name in list(names)[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def read_delimited_rows(path: str | os.PathLike, delimiter: str = ",", *,
                        header_hint: str = "a header line naming the columns") -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) per row of a CSV/TSV file: first its header (line 1, names stripped of
    white space), then each data row.

    Standard CSV quoting (what pandas, Excel and the csv module write): a field holding the
    delimiter, a newline or a leading quote is quoted, `"` inside it doubled; a row's number is that
    of its first line. Blank lines are skipped. Errors name `file:line`: a malformed row, a data row
    whose number of fields differs from the header's, an empty file (`header_hint` says what its
    first line should have been). A generator: the caller checks the header before any data row is
    read, so a bad header is reported first.
    """
    with io.StringIO(read_text(path), newline="") as handle:
        reader = csv.reader(handle, delimiter=delimiter)
        try:
            header = next(reader, None)
        except csv.Error as error:
            raise ValueError(f"{path}:1: {error}") from None
        if header is None:
            raise ValueError(f"{path}: empty file (expected {header_hint})")
        header = [name.strip() for name in header]
        yield 1, header
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
                raise ValueError(f"{path}:{start}: expected {len(header)} fields ({names_shown(header)}), "
                                 f"found {len(row)}")
            yield start, row


def _records_delimited(path: Path, delimiter: str):
    """(line number, {column: value}) per data row of a CSV/TSV with a header line."""
    rows = read_delimited_rows(path, delimiter)
    _, header = next(rows)
    if "text" not in header:
        raise ValueError(f"{path}:1: no 'text' column in the header (found: {names_shown(header)}); "
                         f"expected columns text, optional text_pair, label")
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        raise ValueError(f"{path}:1: duplicate column(s) {names_shown(duplicates)}")
    for start, row in rows:
        yield start, dict(zip(header, row))


def _records_jsonl(path: Path):
    with io.StringIO(read_text(path), newline=None) as handle:
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
                raise ValueError(f"{path}:{number}: no 'text' key (found: {names_shown(record) or 'none'})")
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


def pad_batch(features: Sequence[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """The model inputs of a batch of unpadded features, padded to its longest row: `input_ids`
    (padded with `pad_token_id`), `token_type_ids` and `attention_mask` (padded with 0), each (B, S)
    int64. The part of `collate` that every sequence-per-row task shares (SQuAD's too)."""
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
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


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
    from .windows import windows

    label_map = None if label_list is None else {label: i for i, label in enumerate(label_list)}
    texts_a = _content_ids(tokenizer, [e.text_a for e in examples])
    pairs = [i for i, e in enumerate(examples) if e.text_b is not None]
    texts_b: dict[int, list[int]] = dict(zip(pairs, _content_ids(tokenizer, [examples[i].text_b for i in pairs])))
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    features = []
    for index, example in enumerate(examples):
        label = _feature_label(example, label_map)
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


def _convert(examples: Sequence[InputExample], tokenizer, label_list: Sequence[str] | None, max_seq_length: int,
             long_input: str, stride: int | None) -> list[dict]:
    """The features of `examples` under a `long_input` mode ("truncate" or "windows")."""
    if long_input == "truncate":
        return convert_examples_to_features(examples, tokenizer, label_list, max_seq_length)
    if long_input == "windows":
        return convert_examples_to_window_features(examples, tokenizer, label_list, max_seq_length, stride)
    raise ValueError(f"long_input must be one of {', '.join(LONG_INPUT_MODES)}, got {long_input!r}")


def predict_examples(model, features: Sequence[dict], batch_size: int = 128, pad_token_id: int = 0) -> np.ndarray:
    """Logits (N, K), one row per example: `predict_features`, then, for window features (those with an
    `example` index), the MEAN of each example's window logits (every part of a long document votes
    equally; see `bertforge.tasks.windows.aggregate_window_logits`)."""
    from .windows import aggregate_window_logits

    logits = predict_features(model, features, batch_size, pad_token_id)
    if not features or "example" not in features[0]:
        return logits
    aggregated, order = aggregate_window_logits(logits, [f["example"] for f in features], "mean")
    if order != sorted(order):  # windows are built example by example, so this holds; guard anyway
        aggregated = aggregated[np.argsort(order)]
    return aggregated


# ---------------------------------------------------------------------------- fine-tuning

def classify_metrics(predictions: Sequence, labels: Sequence, regression: bool) -> dict[str, float]:
    """The user's own task: accuracy and macro F1 for classes (macro: no class is "the positive one"),
    Pearson, Spearman and MSE for regression."""
    from ..metrics.glue import accuracy, pearson, spearman

    if regression:
        predictions, labels = np.asarray(predictions, dtype=np.float64), np.asarray(labels, dtype=np.float64)
        return {"pearson": pearson(predictions, labels), "spearman": spearman(predictions, labels),
                "mse": float(np.mean((predictions - labels) ** 2))}
    from sklearn.metrics import f1_score

    return {"accuracy": accuracy(predictions, labels),
            "f1_macro": float(f1_score(labels, predictions, average="macro", zero_division=0))}


@torch.no_grad()
def predict_features(model, features: Sequence[dict], batch_size: int = 128, pad_token_id: int = 0, *,
                     collate_fn=None, length_fn=None) -> np.ndarray:
    """Logits (N, K) of a model for `features`, in their order. Rows are batched by length (sorted, so
    padding is minimal) and put back in order. `collate_fn(rows, pad_token_id)` and `length_fn(feature)`
    default to this module's sequence-classification ones; other tasks (multiple choice) pass theirs."""
    collate_fn = collate_fn or collate
    length_fn = length_fn or (lambda feature: len(feature["input_ids"]))
    order = sorted(range(len(features)), key=lambda i: length_fn(features[i]))
    device = next(model.parameters()).device
    logits = [None] * len(features)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            batch = collate_fn([{k: v for k, v in features[i].items() if k != "label"} for i in rows], pad_token_id)
            out = model(**{k: v.to(device) for k, v in batch.items()})
            for i, row in zip(rows, out.logits.float().cpu().numpy()):
                logits[i] = row
    finally:
        model.train(was_training)
    return np.stack(logits) if logits else np.zeros((0, 0), dtype=np.float32)


def logits_to_predictions(logits: np.ndarray, regression: bool) -> np.ndarray:
    """Label ids (argmax), or the score of a regression head."""
    return logits[:, 0] if regression else logits.argmax(-1)


def sequence_classification_step(model, batch: dict[str, torch.Tensor]):
    """The loss of a batch (cross-entropy, or MSE for regression) and, for classes, the accuracy."""
    out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"], labels=batch["labels"])
    metrics = {}
    if out.logits.shape[-1] > 1:
        with torch.no_grad():
            metrics["accuracy"] = ((out.logits.argmax(-1) == batch["labels"]).sum(), len(batch["labels"]))
    return out.loss, metrics


def classification_task(name: str, model_dir: str | os.PathLike, train_examples: Sequence[InputExample],
                        dev_sets: dict[str, Sequence[InputExample]], label_list: Sequence[str] | None, *,
                        metrics_fn, main_metric: str, max_seq_length: int = 128, eval_batch_size: int = 128,
                        long_input: str = "truncate", window_stride: int | None = None):
    """A `FinetuneTask` for sentence(-pair) classification or regression (`label_list=None`).

    `dev_sets` maps a name ("dev", or MNLI's "dev_matched" and "dev_mismatched") to its examples;
    `metrics_fn(dev_name, predictions, labels)` scores one of them (the dicts of all are merged).
    `long_input="windows"`: an input longer than `max_seq_length` is cut into overlapping windows
    (`convert_examples_to_window_features`), each a training feature with the example's label; an
    example's prediction is the mean of its windows' logits. "truncate" (default): Google's truncation.
    """
    from ..modeling import BertForSequenceClassification
    from ..modeling.pretrained import resolve_model_dir
    from ..tokenization import BertTokenizer
    from ..training.finetune import FinetuneTask

    tokenizer = BertTokenizer.from_pretrained(resolve_model_dir(model_dir))
    regression = label_list is None
    train_features = _convert(train_examples, tokenizer, label_list, max_seq_length, long_input, window_stride)
    dev_features = {split: _convert(examples, tokenizer, label_list, max_seq_length, long_input, window_stride)
                    for split, examples in dev_sets.items()}
    # Metrics are per example (a windowed example has several features, one prediction).
    label_map = None if label_list is None else {label: i for i, label in enumerate(label_list)}
    dev_labels = {split: [_feature_label(e, label_map) for e in examples] for split, examples in dev_sets.items()}
    pad_id = tokenizer.vocab.get("[PAD]", 0)
    labels = None if regression else list(label_list)

    def build_model():
        overrides = dict(num_labels=1, id2label=None, problem_type="regression") if regression else dict(
            num_labels=len(labels), id2label=id2label(labels), problem_type="single_label_classification")
        if long_input != "truncate":  # recorded in config.json: `predict` then windows the same way by default
            overrides.update(long_input=long_input, window_stride=window_stride)
        return BertForSequenceClassification.from_pretrained(model_dir, finetuning_task=name, **overrides)

    def evaluate(model):
        metrics, predictions = {}, {}
        for split, features in dev_features.items():
            logits = predict_examples(model, features, eval_batch_size, pad_id)  # one row per example
            predictions[split] = logits_to_predictions(logits, regression)
            metrics.update(metrics_fn(split, predictions[split], dev_labels[split]))
        return metrics, predictions

    def write_predictions(output_dir: Path, predictions) -> None:
        from .glue import write_dev_predictions

        for split, values in predictions.items():
            write_dev_predictions(output_dir / f"{split}_predictions.jsonl", dev_sets[split], values, labels)

    return FinetuneTask(
        name=name, build_model=build_model, tokenizer=tokenizer, train_features=train_features,
        collate=lambda rows: collate(rows, pad_id), step_fn=sequence_classification_step, evaluate=evaluate,
        main_metric=main_metric, write_predictions=write_predictions,
        lengths=[len(f["input_ids"]) for f in train_features])


def predict_file(model_dir: str | os.PathLike, input_file: str | os.PathLike, output_file: str | os.PathLike, *,
                 task: str | None = None, max_seq_length: int = 128, batch_size: int = 128,
                 long_input: str | None = None, window_stride: int | None = None, dtype: str | None = None) -> Path:
    """Predictions of a fine-tuned sequence classifier for a file; returns the written path.

    The task comes from the model (`finetuning_task` in its config.json, written by `bertforge finetune`)
    unless given. A GLUE task reads the GLUE layout (a test.tsv, or a dev/train-shaped file) and writes the
    GLUE server's submission format, `index<TAB>prediction` with label strings (STS-B: scores). Any
    other task reads CSV/TSV/JSONL with `text` (and `text_pair`) and writes `index<TAB>prediction<TAB>score`
    (the probability of the predicted label; the predicted value for regression).
    `long_input="windows"` classifies a long input by the mean logits of its windows (see `classification_task`);
    `long_input` and `window_stride` default to what the model was fine-tuned with (config.json), else "truncate".
    `dtype` ("fp32", "bf16", "int8"): run the model through `optimize_for_inference` (None: as saved, padded).
    """
    from ..modeling import BertConfig, BertForSequenceClassification, load_for_inference
    from ..modeling.pretrained import resolve_model_dir
    from ..tokenization import BertTokenizer
    from .glue import get_task, read_glue_file, write_predictions

    config = BertConfig.from_pretrained(model_dir)
    task = task or config.extra.get("finetuning_task")
    if task is None:
        raise ValueError(f"{model_dir}: no finetuning_task in config.json; pass the task (a GLUE task or 'classify')")
    long_input = long_input or config.extra.get("long_input") or "truncate"
    if window_stride is None:
        window_stride = config.extra.get("window_stride")
    regression = config.num_labels == 1
    label_list = None if regression or config.id2label is None else [config.id2label[i] for i in range(config.num_labels)]
    spec = None
    if task != "classify":
        spec = get_task(task)
        # A test file (its header starts with GLUE's id column), or a labelled file laid out as dev/train.
        # The header decides, not the field count: SST-2's test and dev files both have two columns.
        if not Path(input_file).is_file():
            raise FileNotFoundError(f"input file not found: {input_file}")
        first = read_text(input_file).split("\n", 1)[0].split("\t")[0].strip().lower()
        splits = ("test", "dev", "train") if first in ("index", "id") else ("dev", "train")
        examples, errors = None, []
        for split in splits:
            try:
                examples = read_glue_file(spec, input_file, split)
                break
            except ValueError as error:
                errors.append(f"as {split}: {error}")
        if examples is None:
            raise ValueError(f"{input_file} is not a {spec.name} file: " + "; ".join(errors))
    else:
        examples, _ = read_classify_file(input_file, regression, label_list=label_list, require_labels=False)
    tokenizer = BertTokenizer.from_pretrained(resolve_model_dir(model_dir))
    model = load_for_inference(BertForSequenceClassification, model_dir, dtype, task=task)
    features = _convert([InputExample(e.guid, e.text_a, e.text_b) for e in examples], tokenizer, label_list,
                        max_seq_length, long_input, window_stride)
    logits = predict_examples(model, features, batch_size, tokenizer.vocab.get("[PAD]", 0))
    predictions = logits_to_predictions(logits, regression)
    output_file = Path(output_file)
    if spec is not None:
        return write_predictions(output_file, spec, [e.id for e in examples], predictions, label_list)
    if regression:
        scores = predictions
        shown = [f"{p:.6f}" for p in predictions]
    else:
        probabilities = torch.softmax(torch.from_numpy(logits), -1).numpy()
        scores = probabilities[np.arange(len(predictions)), predictions]
        shown = [label_list[p] for p in predictions]
    output_file.parent.mkdir(parents=True, exist_ok=True)
    lines = ["index\tprediction\tscore"] + [f"{i}\t{p}\t{s:.6f}" for i, (p, s) in enumerate(zip(shown, scores))]
    write_text_atomic(output_file, "\n".join(lines) + "\n")
    return output_file


def classify_task(model_dir: str | os.PathLike, train_file: str | os.PathLike, dev_file: str | os.PathLike, *,
                  regression: bool = False, max_seq_length: int = 128, eval_batch_size: int = 128,
                  long_input: str = "truncate", window_stride: int | None = None):
    """The `FinetuneTask` of the user's own files (see `read_classify_file`); the label list is the
    training file's, saved with the model as `config.id2label`. `long_input`: see `classification_task`."""
    train, label_list = read_classify_file(train_file, regression)
    dev, _ = read_classify_file(dev_file, regression, label_list=label_list)

    def metrics_fn(split: str, predictions, labels) -> dict[str, float]:
        return classify_metrics(predictions, labels, regression)

    return classification_task("classify", model_dir, train, {"dev": dev}, label_list, metrics_fn=metrics_fn,
                               main_metric="pearson" if regression else "accuracy",
                               max_seq_length=max_seq_length, eval_batch_size=eval_batch_size,
                               long_input=long_input, window_stride=window_stride)
