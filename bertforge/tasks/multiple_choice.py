"""Multiple choice (SWAG, §4.4): read SWAG's CSV, build the four sequences per example, fine-tune, predict.

The paper's recipe: for each of the K endings (SWAG: 4) build one input sequence
`[CLS] sent1 [SEP] sent2 + " " + ending_i [SEP]` (segment A = the context sentence, segment B = the
start of the next sentence followed by one candidate ending), run them all through BERT, score each
final [CLS] vector C_i with one vector V (`BertForMultipleChoice`), and take a softmax over the K
scores. The loss is the cross-entropy of that softmax against the gold ending.

* `read_swag_file(path)`: SWAG's CSV layout (`train.csv`, `val.csv`, `test.csv` of rowanz/swagaf), with
  or without the leading unnamed index column, with or without `label` (the test file has none).
* `convert_examples_to_features(...)`: token ids per choice, unpadded: `{"input_ids": [K lists], ...}`.
* `collate(features)`: a batch of (B, K, S) tensors padded to the longest of its B*K rows.
* `multiple_choice_task(...)`: the `FinetuneTask` (metric: accuracy); `predict_choice_file(...)`.

The sequence layout and truncation follow Google's and Hugging Face's SWAG scripts
(`run_swag.py`): A = sent1, B = sent2 + " " + ending, truncated longest-first to `max_seq_length`.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .._checks import model_positions
from .._files import write_text_atomic
from ..modeling import BertForMultipleChoice, load_for_inference
from ..modeling.pretrained import check_pretrained, resolve_model_dir
from ..tokenization import BertTokenizer
from ..training.finetune import FinetuneTask
from .arrays import pad_inputs, softmax
from .classify import predict_features
from .classify_features import batch_labels
from .classify_reader import names_shown, read_delimited_rows

__all__ = ["TASK_NAME", "ChoiceExample", "add_multiple_choice_flags", "choice_step", "collate",
           "convert_examples_to_features", "multiple_choice_after", "multiple_choice_from_args",
           "multiple_choice_task", "predict_from_args", "predict_choice_file", "predict_choice_logits",
           "read_swag_file",
           "write_choice_predictions", "write_swag_file"]

TASK_NAME = "multiple-choice"  # `finetuning_task` in the fine-tuned model's config.json
SWAG_COLUMNS = ["video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source"]
_ENDING = re.compile(r"ending(\d+)$")


@dataclass
class ChoiceExample:
    """One multiple-choice example. `guid` is "<file stem>-<row>"; `index` is the file's own row id
    (SWAG's leading unnamed column) or, without that column, the row's position. `label` is the
    index of the right ending, None when unlabelled (SWAG's test file)."""

    guid: str
    context: str  # sent1: segment A
    start: str  # sent2: the beginning of the sentence the endings complete
    endings: list[str]
    label: int | None = None
    index: str = ""
    video_id: str = ""
    fold_ind: str = ""
    startphrase: str = ""
    gold_source: str = ""

    def second_segments(self) -> list[str]:
        """Segment B for each choice: `sent2 + " " + ending` (as HF's run_swag; no space when sent2 is empty)."""
        return [f"{self.start} {ending}" if self.start else ending for ending in self.endings]


# ---------------------------------------------------------------------------- reading and writing

def read_swag_file(path: str | os.PathLike, *, require_labels: bool = True,
                   max_examples: int | None = None) -> list[ChoiceExample]:
    """Read a SWAG CSV: a header line, then one example per row.

    Columns by name: `video-id, fold-ind, startphrase, sent1, sent2, gold-source, ending0 .. ending{K-1},
    label`, in any order, optionally preceded by SWAG's unnamed index column (an empty header name).
    Standard CSV quoting (an ending holding a comma is quoted). The number of choices K is the number of
    `endingN` columns (SWAG: 4), numbered from 0 without gaps. `label` must be an integer in [0, K).
    `require_labels=False` accepts a file without a `label` column (SWAG's test.csv) or empty labels:
    those examples get `label=None`. Errors name `file:line`.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    rows = read_delimited_rows(path, ",", header_hint="SWAG's header line")
    _, header = next(rows)
    columns = {name: i for i, name in enumerate(header) if name}
    missing = [name for name in ["sent1", "sent2"] if name not in columns]
    endings = sorted((int(m.group(1)), i) for name, i in columns.items() if (m := _ENDING.match(name)))
    if missing or len(endings) < 2:
        raise ValueError(f"{path}:1: not a SWAG header (need sent1, sent2, ending0, ending1, ...; "
                         f"found: {names_shown(header)})")
    if [n for n, _ in endings] != list(range(len(endings))):
        raise ValueError(f"{path}:1: ending columns must be ending0 .. ending{len(endings) - 1} without gaps, "
                         f"found {', '.join(f'ending{n}' for n, _ in endings)}")
    if "label" not in columns and require_labels:
        raise ValueError(f"{path}:1: no 'label' column (an unlabelled file, like SWAG's test.csv, "
                         f"needs require_labels=False)")
    unnamed = [i for i, name in enumerate(header) if not name]
    index_column = unnamed[0] if unnamed else None
    num_choices = len(endings)
    examples: list[ChoiceExample] = []
    # One row, one example: islice stops before parsing past the limit. It refuses a negative stop,
    # which reads nothing and so ends in the "no examples" error below.
    limit = None if max_examples is None else max(max_examples, 0)
    for line, row in itertools.islice(rows, limit):
        where = f"{path}:{line}"

        def cell(name: str) -> str:
            return row[columns[name]] if name in columns else ""

        context = row[columns["sent1"]].strip()
        if not context:
            raise ValueError(f"{where}: empty sent1")
        texts = [row[i].strip() for _, i in endings]
        empty = [n for n, text in enumerate(texts) if not text]
        if empty:
            raise ValueError(f"{where}: empty ending{empty[0]}")
        label = _swag_label(cell("label"), num_choices, require_labels, where)
        examples.append(ChoiceExample(
            guid=f"{path.stem}-{len(examples)}", context=context, start=row[columns["sent2"]].strip(),
            endings=texts, label=label,
            index=row[index_column].strip() if index_column is not None else str(len(examples)),
            video_id=cell("video-id"), fold_ind=cell("fold-ind"), startphrase=cell("startphrase"),
            gold_source=cell("gold-source")))
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def _swag_label(raw: str, num_choices: int, require_labels: bool, where: str) -> int | None:
    raw = raw.strip()
    if not raw:
        if require_labels:
            raise ValueError(f"{where}: empty label")
        return None
    try:
        label = int(raw)
    except ValueError:
        raise ValueError(f"{where}: label {raw!r} is not an integer (the index of the right ending)") from None
    if not 0 <= label < num_choices:
        raise ValueError(f"{where}: label {label} is not in 0..{num_choices - 1}")
    return label


def write_swag_file(path: str | os.PathLike, examples: Sequence[ChoiceExample]) -> Path:
    """Write examples in SWAG's CSV layout (leading unnamed index column, `label` last) so that
    `read_swag_file` (and SWAG tooling) reads them; used by scripts/make_book_choice.py."""
    path = Path(path)
    num_choices = len(examples[0].endings) if examples else 4
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = io.StringIO()  # written whole, then renamed into place (write_text_atomic)
    writer = csv.writer(handle)
    writer.writerow([""] + SWAG_COLUMNS + [f"ending{i}" for i in range(num_choices)] + ["label"])
    for i, e in enumerate(examples):
        if len(e.endings) != num_choices:
            raise ValueError(f"example {e.guid}: {len(e.endings)} endings, expected {num_choices}")
        startphrase = e.startphrase or (f"{e.context} {e.start}".strip())
        writer.writerow([e.index or str(i), e.video_id, e.fold_ind, startphrase, e.context, e.start,
                         e.gold_source, *e.endings, "" if e.label is None else e.label])
    write_text_atomic(path, handle.getvalue())
    return path


# ---------------------------------------------------------------------------- features and batches

def convert_examples_to_features(examples: Sequence[ChoiceExample], tokenizer,
                                 max_seq_length: int = 128) -> list[dict]:
    """Tokenize each example into K sequences `[CLS] sent1 [SEP] sent2 ending_i [SEP]`, NOT padded.

    Returns per example `{"input_ids": [K lists], "token_type_ids": [K lists], "label": int | None}`;
    each sequence is truncated longest-first to `max_seq_length` tokens (specials included), as
    Google's `_truncate_seq_pair` in run_swag.py.
    """
    if not examples:
        return []
    counts = {len(e.endings) for e in examples}
    if len(counts) != 1:
        raise ValueError(f"examples have different numbers of choices: {sorted(counts)}")
    # One encode_batch call over all B*K pairs (fast), then regrouped by example.
    firsts = [e.context for e in examples for _ in e.endings]
    seconds = [b for e in examples for b in e.second_segments()]
    rows = tokenizer.encode_batch(firsts, seconds, max_length=max_seq_length, truncation="longest_first",
                                  padding=False)
    k = counts.pop()
    features = []
    for n, example in enumerate(examples):
        group = rows[n * k:(n + 1) * k]
        features.append({"input_ids": [r["input_ids"] for r in group],
                         "token_type_ids": [r["token_type_ids"] for r in group], "label": example.label})
    return features


def feature_length(feature: dict) -> int:
    """The longest of a feature's K sequences: what its batch is padded to."""
    return max(len(ids) for ids in feature["input_ids"])


def collate(features: Sequence[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest sequence: `input_ids`, `token_type_ids`, `attention_mask`
    (B, K, S) int64, and `labels` (B,) int64 (absent when the batch is unlabelled)."""
    if not features:
        raise ValueError("empty batch")
    num_choices = len(features[0]["input_ids"])
    if any(len(f["input_ids"]) != num_choices for f in features):
        raise ValueError("features in a batch must have the same number of choices")
    # The B*K rows padded as one batch of sequences, then viewed (B, K, S).
    flat = pad_inputs([ids for f in features for ids in f["input_ids"]],
                      [types for f in features for types in f["token_type_ids"]], pad_token_id)
    batch = {name: torch.from_numpy(value.reshape(len(features), num_choices, -1)) for name, value in flat.items()}
    labels = batch_labels(features)
    if labels is None:
        return batch
    batch["labels"] = torch.tensor(labels, dtype=torch.long)
    return batch


# ---------------------------------------------------------------------------- training and prediction

def choice_step(model, batch: dict[str, torch.Tensor]):
    """The loss of a batch (cross-entropy over the K choices) and its accuracy."""
    out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"], labels=batch["labels"])
    with torch.no_grad():
        correct = (out.logits.argmax(-1) == batch["labels"]).sum()
    return out.loss, {"accuracy": (correct, len(batch["labels"]))}


@torch.no_grad()
def predict_choice_logits(model, features: Sequence[dict], batch_size: int = 32, pad_token_id: int = 0) -> np.ndarray:
    """Logits (N, K) of a multiple-choice model for `features`, in their order. `batch_size` counts
    examples (each K sequences); examples are batched by length so padding is minimal."""
    return predict_features(model, features, batch_size, pad_token_id, collate_fn=collate, length_fn=feature_length)


def _softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities over the K choices (float32), as written to the predictions files."""
    return softmax(logits, dtype=np.float32)


def write_choice_predictions(path: str | os.PathLike, examples: Sequence[ChoiceExample], logits: np.ndarray) -> Path:
    """Per-example predictions as JSON lines, for error analysis: `{"guid", "index", "video_id",
    "context", "start", "endings", "label", "prediction", "probabilities"}` (+ `"correct"` when labelled)."""
    if len(examples) != len(logits):
        raise ValueError(f"{len(examples)} examples but {len(logits)} predictions")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    probabilities = _softmax(logits)
    lines = []
    for example, probs in zip(examples, probabilities):
        prediction = int(probs.argmax())
        record = {"guid": example.guid, "index": example.index, "video_id": example.video_id,
                  "context": example.context, "start": example.start, "endings": example.endings,
                  "label": example.label, "prediction": prediction,
                  "probabilities": [round(float(p), 6) for p in probs]}
        if example.label is not None:
            record["correct"] = prediction == example.label
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    write_text_atomic(path, "".join(lines))
    return path


def multiple_choice_task(model_dir: str | os.PathLike, train_file: str | os.PathLike, dev_file: str | os.PathLike,
                         *, max_seq_length: int = 128, eval_batch_size: int = 32,
                         max_train_examples: int | None = None):
    """The `FinetuneTask` of a SWAG-layout task: `BertForMultipleChoice` on the pre-trained encoder, accuracy on
    dev (main metric), and OUT/dev_predictions.jsonl from the best model. `eval_batch_size` counts examples."""
    check_pretrained(resolve_model_dir(model_dir))  # the checkpoint whole, before its data is tokenized
    tokenizer = BertTokenizer.from_pretrained(resolve_model_dir(model_dir))
    train = read_swag_file(train_file, max_examples=max_train_examples)
    dev = read_swag_file(dev_file)
    if len(train[0].endings) != len(dev[0].endings):
        raise ValueError(f"{train_file} has {len(train[0].endings)} choices per example but {dev_file} "
                         f"has {len(dev[0].endings)}")
    train_features = convert_examples_to_features(train, tokenizer, max_seq_length)
    dev_features = convert_examples_to_features(dev, tokenizer, max_seq_length)
    dev_labels = np.array([f["label"] for f in dev_features])
    pad_id = tokenizer.vocab.get("[PAD]", 0)

    def build_model():
        return BertForMultipleChoice.from_pretrained(model_dir, finetuning_task=TASK_NAME)

    def evaluate(model):
        logits = predict_choice_logits(model, dev_features, eval_batch_size, pad_id)
        return {"accuracy": float((logits.argmax(-1) == dev_labels).mean())}, logits

    def write_predictions(output_dir: Path, logits) -> None:
        write_choice_predictions(output_dir / "dev_predictions.jsonl", dev, logits)

    return FinetuneTask(
        name=TASK_NAME, build_model=build_model, tokenizer=tokenizer, train_features=train_features,
        collate=lambda rows: collate(rows, pad_id), step_fn=choice_step, evaluate=evaluate,
        main_metric="accuracy", write_predictions=write_predictions,
        # A feature costs K sequences of its longest length: group batches by that.
        lengths=[feature_length(f) for f in train_features])


def predict_choice_file(model_dir: str | os.PathLike, input_file: str | os.PathLike, output_file: str | os.PathLike,
                        *, max_seq_length: int = 128, batch_size: int = 32, dtype: str | None = None) -> Path:
    """Predictions of a fine-tuned multiple-choice model for a SWAG-layout file (labelled or not).

    Writes TSV `index<TAB>prediction<TAB>score`: the file's row id (SWAG's unnamed first column), the
    predicted ending's number, and its probability. Returns the written path. `dtype`: see
    `bertforge.modeling.load_for_inference`.
    """
    examples = read_swag_file(input_file, require_labels=False)
    tokenizer = BertTokenizer.from_pretrained(resolve_model_dir(model_dir))
    model = load_for_inference(BertForMultipleChoice, model_dir, dtype, task="multiple-choice")
    features = convert_examples_to_features(examples, tokenizer, max_seq_length)
    for feature in features:
        feature["label"] = None  # prediction ignores any labels in the file
    probabilities = _softmax(predict_choice_logits(model, features, batch_size, tokenizer.vocab.get("[PAD]", 0)))
    output_file = Path(output_file)
    output_file.parent.mkdir(parents=True, exist_ok=True)
    lines = ["index\tprediction\tscore"] + [f"{e.index}\t{int(p.argmax())}\t{float(p.max()):.6f}"
                                            for e, p in zip(examples, probabilities)]
    write_text_atomic(output_file, "\n".join(lines) + "\n")
    return output_file


# ---------------------------------------------------------------------------- the commands (the registry's entry)

def add_multiple_choice_flags(p: argparse.ArgumentParser) -> None:
    """`bertforge finetune multiple-choice`'s own flags: SWAG-layout files."""
    p.add_argument("--train-file", required=True, help="SWAG CSV: [index], video-id, fold-ind, startphrase, sent1, "
                   "sent2, gold-source, ending0..ending3, label")
    p.add_argument("--dev-file", required=True, help="SWAG CSV with labels (SWAG's val.csv)")
    p.add_argument("--test-file", help="SWAG CSV, labels optional: predicted into OUT/test_predictions.tsv")
    p.add_argument("--max-train-examples", type=int, help="train on the first N examples only")


def multiple_choice_from_args(args: argparse.Namespace) -> FinetuneTask:
    """`multiple_choice_task` from `bertforge finetune multiple-choice`'s flags."""
    return multiple_choice_task(args.model, args.train_file, args.dev_file, max_seq_length=args.max_seq_length,
                                eval_batch_size=args.eval_batch_size, max_train_examples=args.max_train_examples)


def multiple_choice_after(args: argparse.Namespace) -> None:
    """--test-file predicted with the best model into OUT/test_predictions.tsv."""
    if args.test_file:
        path = predict_choice_file(args.output_dir, args.test_file, Path(args.output_dir) / "test_predictions.tsv",
                                   max_seq_length=args.max_seq_length, batch_size=args.eval_batch_size)
        print(f"test predictions: {path}")


def predict_from_args(args: argparse.Namespace) -> None:
    """`bertforge predict` for a multiple-choice model: `predict_choice_file`."""
    if args.max_seq_length is None:  # 128, or fewer for a model with fewer positions
        args.max_seq_length = min(128, model_positions(args.model) or 128)
    path = predict_choice_file(args.model, args.input, args.output, max_seq_length=args.max_seq_length,
                               batch_size=args.batch_size, dtype=args.dtype)
    print(f"wrote {path}")
