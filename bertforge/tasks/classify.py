"""Sentence(-pair) classification and regression: prediction, metrics, the fine-tuning task.

* `predict_features` / `predict_examples`: a model's logits for features (windows of one example averaged).
* `classify_metrics`: the user's own task's scores; `classification_task`: the `FinetuneTask` of any
  sentence(-pair) task (GLUE's `glue_task` and `classify_task` build on it).
* `predict_file`: a fine-tuned classifier's predictions for a GLUE or a CSV/TSV/JSONL file.
* the classify family's commands (`bertforge finetune classify`, `bertforge predict` for a classifier),
  read by the task registry; GLUE's are in `bertforge.tasks.glue`.

Its data pieces live one concern per module (import them from there): examples and the reader of the
user's files in `bertforge.tasks.classify_reader`, features and batches in
`bertforge.tasks.classify_features`, the GLUE layout in `bertforge.tasks.glue_data`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from sklearn.metrics import f1_score

from .._checks import model_positions
from .._files import read_text, write_text_atomic
from ..metrics.glue import accuracy, pearson, spearman
from ..modeling import BertConfig, BertForSequenceClassification, load_for_inference
from ..modeling.modes import evaluating
from ..modeling.pretrained import check_pretrained, resolve_model_dir
from ..tokenization import BertTokenizer
from ..training.finetune import FinetuneTask
from .arrays import softmax
from .classify_features import LONG_INPUT_MODES, collate, example_label, examples_to_features
from .classify_reader import InputExample, id2label, read_classify_file
from .glue_data import get_task, read_glue_file, write_dev_predictions, write_predictions
from .windows import aggregate_window_logits

__all__ = ["add_classify_flags", "add_long_input_flags", "add_predict_flags", "classification_task",
           "classify_after", "classify_from_args", "classify_metrics", "classify_task", "logits_to_predictions",
           "predict_examples", "predict_features", "predict_file", "predict_from_args",
           "sequence_classification_step"]


def predict_examples(model, features: Sequence[dict], batch_size: int = 128, pad_token_id: int = 0) -> np.ndarray:
    """Logits (N, K), one row per example: `predict_features`, then, for window features (those with an
    `example` index), the MEAN of each example's window logits (every part of a long document votes
    equally; see `bertforge.tasks.windows.aggregate_window_logits`)."""
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
    if regression:
        predictions, labels = np.asarray(predictions, dtype=np.float64), np.asarray(labels, dtype=np.float64)
        return {"pearson": pearson(predictions, labels), "spearman": spearman(predictions, labels),
                "mse": float(np.mean((predictions - labels) ** 2))}
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
    with evaluating(model):
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            batch = collate_fn([{k: v for k, v in features[i].items() if k != "label"} for i in rows], pad_token_id)
            out = model(**{k: v.to(device) for k, v in batch.items()})
            for i, row in zip(rows, out.logits.float().cpu().numpy()):
                logits[i] = row
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
    check_pretrained(resolve_model_dir(model_dir))  # the checkpoint whole, before its data is tokenized
    tokenizer = BertTokenizer.from_pretrained(resolve_model_dir(model_dir))
    regression = label_list is None
    train_features = examples_to_features(train_examples, tokenizer, label_list, max_seq_length, long_input,
                                          window_stride)
    dev_features = {split: examples_to_features(examples, tokenizer, label_list, max_seq_length, long_input,
                                                window_stride)
                    for split, examples in dev_sets.items()}
    # Metrics are per example (a windowed example has several features, one prediction).
    label_map = None if label_list is None else {label: i for i, label in enumerate(label_list)}
    dev_labels = {split: [example_label(e, label_map) for e in examples] for split, examples in dev_sets.items()}
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
    features = examples_to_features([InputExample(e.guid, e.text_a, e.text_b) for e in examples], tokenizer, label_list,
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
        probabilities = softmax(logits)
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
    if label_list is not None and len(label_list) < 2:  # saved as num_labels 1, which loaders read as regression
        raise ValueError(f"{train_file}: every example has the label {label_list[0]!r}: a classifier needs two or "
                         "more labels (for numeric targets pass --regression)")
    dev, _ = read_classify_file(dev_file, regression, label_list=label_list)

    def metrics_fn(split: str, predictions, labels) -> dict[str, float]:
        return classify_metrics(predictions, labels, regression)

    return classification_task("classify", model_dir, train, {"dev": dev}, label_list, metrics_fn=metrics_fn,
                               main_metric="pearson" if regression else "accuracy",
                               max_seq_length=max_seq_length, eval_batch_size=eval_batch_size,
                               long_input=long_input, window_stride=window_stride)


# ---------------------------------------------------------------------------- the commands (the registry's entry)

def add_long_input_flags(p: argparse.ArgumentParser) -> None:
    """Classification's handling of inputs longer than --max-seq-length (`finetune classify` and `glue`)."""
    p.add_argument("--long-input", choices=LONG_INPUT_MODES, default="truncate",
                   help="truncate: cut a long input to --max-seq-length (Google's run_classifier); windows: "
                   "cut it into overlapping windows, train on each with the example's label, predict the mean "
                   "of the windows' logits")
    p.add_argument("--doc-stride", type=int, help="--long-input windows: tokens between window starts "
                   "(default: half a window)")


def add_classify_flags(p: argparse.ArgumentParser) -> None:
    """`bertforge finetune classify`'s own flags: the user's files, --regression, long inputs."""
    p.add_argument("--train-file", required=True)
    p.add_argument("--dev-file", required=True)
    p.add_argument("--test-file", help="predicted with the best model into OUT/test_predictions.tsv")
    p.add_argument("--regression", action="store_true", help="numeric labels: one output, MSE loss")
    add_long_input_flags(p)


def classify_from_args(args: argparse.Namespace) -> FinetuneTask:
    """`classify_task` from `bertforge finetune classify`'s flags."""
    return classify_task(args.model, args.train_file, args.dev_file, regression=args.regression,
                         max_seq_length=args.max_seq_length, eval_batch_size=args.eval_batch_size,
                         long_input=args.long_input, window_stride=args.doc_stride)


def classify_after(args: argparse.Namespace) -> None:
    """--test-file predicted with the best model into OUT/test_predictions.tsv."""
    if args.test_file:
        path = predict_file(args.output_dir, args.test_file, Path(args.output_dir) / "test_predictions.tsv",
                            task="classify", max_seq_length=args.max_seq_length, long_input=args.long_input,
                            window_stride=args.doc_stride)
        print(f"test predictions: {path}")


def add_predict_flags(p: argparse.ArgumentParser) -> None:
    """`bertforge predict`'s flags for a classifier: how long inputs are handled."""
    p.add_argument("--long-input", choices=LONG_INPUT_MODES,
                   help="classification: truncate long inputs, or classify overlapping windows and average "
                   "their logits (default: what the model was fine-tuned with)")
    p.add_argument("--doc-stride", type=int, help="classification with --long-input windows: tokens between "
                   "window starts (default: the model's, or half a window)")


def predict_from_args(args: argparse.Namespace) -> None:
    """`bertforge predict` for a classifier: `predict_file` (--task: a GLUE task's labels and format)."""
    if args.max_seq_length is None:  # 128, or fewer for a model with fewer positions
        args.max_seq_length = min(128, model_positions(args.model) or 128)
    path = predict_file(args.model, args.input, args.output, task=args.task, max_seq_length=args.max_seq_length,
                        batch_size=args.batch_size, long_input=args.long_input, window_stride=args.doc_stride,
                        dtype=args.dtype)
    print(f"wrote {path}")
