"""Multi-label classification: any number of labels per text (emotions, topics, toxicity types, intents).

The head is `BertForSequenceClassification` with config.json's `problem_type="multi_label_classification"`:
a sigmoid per label and binary cross-entropy, as transformers' (a checkpoint of either loads in the other).
A label is predicted when its probability reaches the decision threshold, tuned on the dev set at each
evaluation (one global threshold, or one per label with `per_label_thresholds`) and kept in config.json
(`multi_label_threshold`, `multi_label_thresholds`), where `predict`, `pipeline("classify")` and the
server read it.

* `multi_label_task(...)`: the `FinetuneTask` (`bertforge finetune multi-label`); data: `multi_label_reader`.
* `multi_label_metrics`, `tune_thresholds`: macro-F1 (the main metric), micro-F1, per-label precision,
  recall and F1; the threshold(s) maximising dev macro-F1 on a grid of 0.01 steps.
* `predict_multi_label_file(...)`: `index<TAB>prediction` with the predicted names comma-separated.
* The command functions: `add_multi_label_flags`, `multi_label_from_args`, `after_finetune` (`bertforge
  finetune multi-label`; its recipe `RECIPE`), `add_predict_flags`, `predict_run` (`bertforge predict`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .._checks import model_positions
from .._files import write_text_atomic
from ..modeling import BertConfig, BertForSequenceClassification, load_for_inference
from ..modeling.heads import MULTI_LABEL
from ..modeling.pretrained import check_pretrained, resolve_model_dir
from ..tokenization import BertTokenizer
from ..training.finetune import FinetuneTask
from .classification import predict_features
from .classify_features import batch_labels, convert_examples_to_features, pad_batch
from .classify_reader import InputExample, id2label
from .multi_label_reader import MultiLabelExample, read_label_names, read_multi_label_file

__all__ = ["DEFAULT_THRESHOLD", "HEAD_INITIALIZER", "MULTI_LABEL", "RECIPE", "TASK_NAME", "THRESHOLD_GRID", "add_multi_label_flags",
           "add_predict_flags", "after_finetune",
           "collate", "is_multi_label", "label_thresholds", "labels_without_examples", "multi_label_from_args",
           "multi_label_metrics", "multi_label_task", "predict_multi_label_file", "predict_run", "sigmoid",
           "tune_thresholds", "write_dev_predictions"]

logger = logging.getLogger("bertforge")

TASK_NAME = "multi-label"  # the `finetuning_task` of a fine-tuned multi-label model (and its CLI command)
# `bertforge finetune multi-label`. AdamW's ε is torch's 1e-8, not the paper's 1e-6: the mean binary
# cross-entropy over K labels gives the lower layers gradients near 1e-6, where ε 1e-6 shrinks their updates
# (benchmarks/multi_label_moments.py; RESULTS.md, "Multi-label classification: GoEmotions").
RECIPE = {"lr": 5e-5, "batch_size": 32, "epochs": 3.0, "max_seq_length": 128, "adam_epsilon": 1e-8}
# The new classifier is drawn from a plain normal(0, initializer_range), as transformers draws it, not the
# paper's truncated normal (std 0.88 of that): on GoEmotions the same seeds (the same batches and dropout
# masks) score higher with it, every one, by 1 to 9 points of dev macro-F1 (RESULTS.md, "Multi-label
# classification: GoEmotions").
HEAD_INITIALIZER = "normal"
DEFAULT_THRESHOLD = 0.5  # a checkpoint without a tuned threshold (e.g. one trained by transformers)
THRESHOLD_KEY, THRESHOLDS_KEY = "multi_label_threshold", "multi_label_thresholds"  # config.json
# Candidate thresholds 0.01 ... 0.99, nearest to 0.5 first: among equally good ones the first wins.
THRESHOLD_GRID = np.array(sorted((i / 100 for i in range(1, 100)), key=lambda t: (abs(t - 0.5), t)))


# ---------------------------------------------------------------------------- metrics and thresholds

def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Probabilities of independent labels (float64, no overflow warning for large |logits|)."""
    logits = np.asarray(logits, dtype=np.float64)
    return np.exp(-np.logaddexp(0.0, -logits))


def multi_hot(labels: Sequence[Sequence[int]], num_labels: int) -> np.ndarray:
    """(N, K) bool: row i has True at the ids of labels[i]."""
    gold = np.zeros((len(labels), num_labels), dtype=bool)
    for i, ids in enumerate(labels):
        gold[i, list(ids)] = True
    return gold


def _counts(predicted: np.ndarray, gold: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """True positives, false positives and false negatives per label (over the last-but-one axis)."""
    tp = (predicted & gold).sum(-2)
    return tp, predicted.sum(-2) - tp, gold.sum(-2) - tp


def _ratio(numerator, denominator) -> np.ndarray:
    """numerator / denominator, 0 where the denominator is 0 (scikit-learn's zero_division=0)."""
    numerator, denominator = np.asarray(numerator, dtype=np.float64), np.asarray(denominator, dtype=np.float64)
    return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator > 0)


def multi_label_metrics(predicted: np.ndarray, gold: np.ndarray) -> dict[str, Any]:
    """Scores of (N, K) bool predictions against (N, K) bool gold labels, as scikit-learn computes them
    (`f1_score(..., average=...)`, `zero_division=0`): `f1_macro` (the mean of the per-label F1s: every
    label counts the same, the rare ones too), `precision_macro`, `recall_macro`, `f1_micro`,
    `precision_micro`, `recall_micro` (over all (text, label) decisions), and `per_label`: arrays
    `precision`, `recall`, `f1`, `support` (gold count) in label order."""
    predicted, gold = np.asarray(predicted, dtype=bool), np.asarray(gold, dtype=bool)
    tp, fp, fn = _counts(predicted, gold)
    precision, recall, f1 = _ratio(tp, tp + fp), _ratio(tp, tp + fn), _ratio(2 * tp, 2 * tp + fp + fn)
    TP, FP, FN = tp.sum(), fp.sum(), fn.sum()
    return {"f1_macro": float(f1.mean()), "precision_macro": float(precision.mean()),
            "recall_macro": float(recall.mean()), "f1_micro": float(_ratio(2 * TP, 2 * TP + FP + FN)),
            "precision_micro": float(_ratio(TP, TP + FP)), "recall_micro": float(_ratio(TP, TP + FN)),
            "per_label": {"precision": precision, "recall": recall, "f1": f1, "support": tp + fn}}


def tune_thresholds(probabilities: np.ndarray, gold: np.ndarray, per_label: bool = False) -> np.ndarray:
    """The decision threshold(s) maximising macro-F1 on (N, K) probabilities against (N, K) bool gold labels,
    over `THRESHOLD_GRID` (0.01 to 0.99; of equally good thresholds, the one nearest to 0.5). Returns (K,)
    thresholds: the same one for every label, or with `per_label` each label's own (the one maximising its
    F1; macro-F1, their mean, is then maximal too). A label is predicted when its probability >= its threshold.

    A label without a positive example in `gold` has F1 0 at every threshold: nothing can be tuned for it, and
    the grid's first candidate (0.5) would pass for a tuned value. With `per_label` such a label gets the
    global tuned threshold instead (`labels_without_examples` names them for the caller to say so)."""
    probabilities, gold = np.asarray(probabilities, dtype=np.float64), np.asarray(gold, dtype=bool)
    num_labels = probabilities.shape[1]
    f1 = np.empty((len(THRESHOLD_GRID), num_labels))
    for row, threshold in enumerate(THRESHOLD_GRID):
        tp, fp, fn = _counts(probabilities >= threshold, gold)
        f1[row] = _ratio(2 * tp, 2 * tp + fp + fn)
    overall = THRESHOLD_GRID[f1.mean(1).argmax()]
    if per_label:
        return np.where(gold.any(0), THRESHOLD_GRID[f1.argmax(0)], overall)
    return np.full(num_labels, overall)


def labels_without_examples(gold: np.ndarray) -> np.ndarray:
    """(K,) bool: the labels with no positive example in (N, K) `gold`, whose per-label threshold cannot be
    tuned (`tune_thresholds` gives them the global one)."""
    return ~np.asarray(gold, dtype=bool).any(0)


def label_thresholds(config: BertConfig, threshold: float | None = None) -> np.ndarray:
    """(K,) decision thresholds of a multi-label model: `threshold` when given, else its per-label ones
    (config.json `multi_label_thresholds`, {name: t}), else its global one (`multi_label_threshold`), else 0.5."""
    labels = [config.id2label[i] for i in range(config.num_labels)] if config.id2label else []
    if threshold is not None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"--threshold must be between 0 and 1, got {threshold}")
        return np.full(config.num_labels, float(threshold))
    stored = config.extra.get(THRESHOLDS_KEY)
    if isinstance(stored, dict) and labels and set(stored) == set(labels):
        return np.array([float(stored[name]) for name in labels])
    return np.full(config.num_labels, float(config.extra.get(THRESHOLD_KEY, DEFAULT_THRESHOLD)))


def is_multi_label(config: BertConfig | dict) -> bool:
    """Whether a model (its BertConfig, or its config.json as a dict) is a multi-label classifier."""
    values = config if isinstance(config, dict) else {**config.extra, "num_labels": config.num_labels}
    return values.get("problem_type") == MULTI_LABEL or values.get("finetuning_task") == TASK_NAME


# ---------------------------------------------------------------------------- features and the task

def convert_examples(examples: Sequence[MultiLabelExample], tokenizer, max_seq_length: int) -> list[dict]:
    """`{"input_ids", "token_type_ids", "label"}` per example, unpadded; `label` is the tuple of its label
    ids (the multi-hot target is built per batch by `collate`), None when unlabelled."""
    features = convert_examples_to_features([InputExample(e.guid, e.text_a, e.text_b) for e in examples],
                                            tokenizer, None, max_seq_length)
    for feature, example in zip(features, examples):
        feature["label"] = example.labels
    return features


def collate(features: Sequence[dict], num_labels: int, pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """A batch padded to its longest row (`pad_batch`) and `labels` (B, K) float32 of 0/1 (none when unlabelled)."""
    batch = pad_batch(features, pad_token_id)
    labels = batch_labels(features)
    if labels is not None:
        batch["labels"] = torch.from_numpy(multi_hot(labels, num_labels).astype(np.float32))
    return batch


def multi_label_step(model, batch: dict[str, torch.Tensor]):
    """The mean binary cross-entropy of a batch (over its texts and labels), as transformers' head."""
    out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"], labels=batch["labels"])
    return out.loss, {}


def write_dev_predictions(output_dir: Path, dev: Sequence[MultiLabelExample], label_list: Sequence[str],
                          result: dict[str, Any]) -> None:
    """dev_predictions.jsonl (per dev row: gold and predicted label names, every label's probability) and
    dev_label_metrics.json (per label: precision, recall, F1, support, threshold, and `threshold_from`: "label"
    (tuned on its own dev examples), "global" (one threshold for all labels) or "global: no dev example" (a
    label the dev set never has, under per-label tuning)) from an evaluation's `result` ({"predicted",
    "probabilities", "per_label", "thresholds", and optionally "threshold_from"})."""
    lines = []
    for example, row, probs in zip(dev, result["predicted"], result["probabilities"]):
        lines.append(json.dumps({"guid": example.guid, "text_a": example.text_a, "text_b": example.text_b,
                                 "label": [label_list[i] for i in example.labels],
                                 "prediction": [label_list[i] for i in np.flatnonzero(row)],
                                 "scores": [round(float(p), 6) for p in probs]}, ensure_ascii=False))
    write_text_atomic(output_dir / "dev_predictions.jsonl", "\n".join(lines) + "\n")
    per_label = result["per_label"]
    table = {name: {"precision": float(per_label["precision"][i]), "recall": float(per_label["recall"][i]),
                    "f1": float(per_label["f1"][i]), "support": int(per_label["support"][i]),
                    "threshold": float(result["thresholds"][i])} for i, name in enumerate(label_list)}
    for name, source in zip(label_list, result.get("threshold_from") or ()):
        table[name]["threshold_from"] = source
    write_text_atomic(output_dir / "dev_label_metrics.json", json.dumps(table, indent=2, ensure_ascii=False) + "\n")


def multi_label_task(model_dir: str | os.PathLike, train_file: str | os.PathLike, dev_file: str | os.PathLike, *,
                     labels_file: str | os.PathLike | None = None, per_label_thresholds: bool = False,
                     max_seq_length: int = 128, eval_batch_size: int = 128) -> FinetuneTask:
    """The `FinetuneTask` of multi-label classification (see the module docstring). The label list is
    `labels_file`'s (ids in GoEmotions' layout name its lines) or the training file's names, saved with the
    model as `config.id2label`. Every evaluation tunes the threshold(s) on dev and records them in the
    model's config (so the best model is saved with its own); the main metric is dev macro-F1."""
    label_list = read_label_names(labels_file) if labels_file is not None else None
    train, label_list = read_multi_label_file(train_file, label_list=label_list, training=True)
    dev, _ = read_multi_label_file(dev_file, label_list=label_list)
    model_path = resolve_model_dir(model_dir)
    check_pretrained(model_path)  # the checkpoint whole, before its data is tokenized
    tokenizer = BertTokenizer.from_pretrained(model_path)
    pad_id = tokenizer.vocab.get("[PAD]", 0)
    num_labels = len(label_list)
    train_features = convert_examples(train, tokenizer, max_seq_length)
    dev_features = convert_examples(dev, tokenizer, max_seq_length)
    gold = multi_hot([e.labels for e in dev], num_labels)
    absent = labels_without_examples(gold)
    if per_label_thresholds:
        threshold_from = ["global: no dev example" if missing else "label" for missing in absent]
        if absent.any():
            logger.warning("%s has no example of %d of the %d labels (%s): their thresholds cannot be tuned per label; "
                           "they get the global threshold tuned on dev (dev_label_metrics.json: threshold_from)",
                           dev_file, int(absent.sum()), num_labels,
                           ", ".join(name for name, missing in zip(label_list, absent) if missing))
    else:
        threshold_from = ["global"] * num_labels

    def build_model():
        return BertForSequenceClassification.from_pretrained(
            model_dir, finetuning_task=TASK_NAME, num_labels=num_labels, id2label=id2label(label_list),
            problem_type=MULTI_LABEL, initializer=HEAD_INITIALIZER)

    def evaluate(model):
        probabilities = sigmoid(predict_features(model, dev_features, eval_batch_size, pad_id))
        thresholds = tune_thresholds(probabilities, gold, per_label_thresholds)
        predicted = probabilities >= thresholds
        scores = multi_label_metrics(predicted, gold)
        per_label = scores.pop("per_label")
        config = getattr(model, "module", model).config  # saved with the model if this evaluation is the best
        config.extra[THRESHOLD_KEY] = float(tune_thresholds(probabilities, gold)[0] if per_label_thresholds
                                            else thresholds[0])
        if per_label_thresholds:
            config.extra[THRESHOLDS_KEY] = {name: float(t) for name, t in zip(label_list, thresholds)}
        else:
            scores["threshold"] = float(thresholds[0])
        return scores, {"predicted": predicted, "probabilities": probabilities, "per_label": per_label,
                        "thresholds": thresholds, "threshold_from": threshold_from}

    def write_predictions(output_dir: Path, result) -> None:
        write_dev_predictions(output_dir, dev, label_list, result)

    return FinetuneTask(
        name=TASK_NAME, build_model=build_model, tokenizer=tokenizer, train_features=train_features,
        collate=lambda rows: collate(rows, num_labels, pad_id), step_fn=multi_label_step, evaluate=evaluate,
        main_metric="f1_macro", write_predictions=write_predictions,
        lengths=[len(f["input_ids"]) for f in train_features])


# ---------------------------------------------------------------------------- prediction

def predict_multi_label_file(model_dir: str | os.PathLike, input_file: str | os.PathLike,
                             output_file: str | os.PathLike, *, max_seq_length: int = 128, batch_size: int = 128,
                             dtype: str | None = None,
                             threshold: float | None = None) -> tuple[Path, dict[str, float] | None]:
    """A multi-label model's predictions for a file (any layout of `read_multi_label_file`; GoEmotions' ids
    name the model's labels in id order): `index<TAB>prediction`, the names over the threshold(s) (see
    `label_thresholds`) comma-separated in label order, empty when none; one row per input row, in order.
    Returns the path and, when every input row is labelled, the scores of `multi_label_metrics` (no per-label)."""
    config = BertConfig.from_pretrained(model_dir)
    if config.num_labels < 2:
        raise ValueError(f"{model_dir}: a model with {config.num_labels} output is not a multi-label classifier")
    label_list = ([config.id2label[i] for i in range(config.num_labels)] if config.id2label
                  else [f"LABEL_{i}" for i in range(config.num_labels)])
    thresholds = label_thresholds(config, threshold)
    examples, _ = read_multi_label_file(input_file, label_list=label_list, require_labels=False)
    tokenizer = BertTokenizer.from_pretrained(resolve_model_dir(model_dir))
    model = load_for_inference(BertForSequenceClassification, model_dir, dtype, task=TASK_NAME)
    features = convert_examples(examples, tokenizer, max_seq_length)
    probabilities = sigmoid(predict_features(model, features, batch_size, tokenizer.vocab.get("[PAD]", 0)))
    predicted = probabilities >= thresholds
    lines = ["index\tprediction"] + [f"{i}\t{','.join(label_list[j] for j in np.flatnonzero(row))}"
                                     for i, row in enumerate(predicted)]
    output_file = Path(output_file)
    output_file.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output_file, "\n".join(lines) + "\n")
    metrics = None
    if all(e.labels is not None for e in examples):
        metrics = multi_label_metrics(predicted, multi_hot([e.labels for e in examples], len(label_list)))
        metrics.pop("per_label")
    return output_file, metrics


# ---------------------------------------------------------------------------- the command functions

def add_multi_label_flags(p: argparse.ArgumentParser) -> None:
    """`bertforge finetune multi-label`'s own flags (the shared engine's are added by the CLI)."""
    p.add_argument("--train-file", required=True, help="GoEmotions TSV (text<TAB>label ids<TAB>id, no header; "
                   "with --labels), or CSV/JSONL with text and labels (a list, or names separated by ';')")
    p.add_argument("--dev-file", required=True, help="the same layout, labelled: macro-F1 picks the best epoch and "
                   "the decision threshold is tuned on it")
    p.add_argument("--labels", metavar="FILE", help="label names, one per line in id order (GoEmotions' "
                   "emotions.txt); default: the names found in --train-file")
    p.add_argument("--test-file", help="predicted with the best model into OUT/test_predictions.tsv")
    p.add_argument("--per-label-thresholds", action="store_true",
                   help="tune one decision threshold per label on dev (default: one for all labels); a label "
                   "with no dev example gets the global tuned threshold (logged; dev_label_metrics.json)")


def add_predict_flags(p: argparse.ArgumentParser) -> None:
    """`bertforge predict`'s flag for a multi-label model, beyond the shared ones."""
    p.add_argument("--threshold", type=float, help="multi-label: predict the labels whose probability reaches this "
                   "(default: the model's, tuned on dev when it was fine-tuned)")


def multi_label_from_args(args: argparse.Namespace) -> FinetuneTask:
    """The `FinetuneTask` of `bertforge finetune multi-label`'s parsed flags."""
    return multi_label_task(args.model, args.train_file, args.dev_file, labels_file=args.labels,
                            per_label_thresholds=args.per_label_thresholds, max_seq_length=args.max_seq_length,
                            eval_batch_size=args.eval_batch_size)


def after_finetune(args: argparse.Namespace) -> None:
    """After `bertforge finetune multi-label`: --test-file's predictions by the best model into
    OUT/test_predictions.tsv (scored when it is labelled)."""
    if not args.test_file:
        return
    path, metrics = predict_multi_label_file(args.output_dir, args.test_file,
                                             Path(args.output_dir) / "test_predictions.tsv",
                                             max_seq_length=args.max_seq_length, batch_size=args.eval_batch_size)
    print(f"test predictions: {path}" + (f"; macro-F1 {metrics['f1_macro']:.4f}" if metrics else ""))


def predict_run(args: argparse.Namespace) -> None:
    """`bertforge predict` for a multi-label model: --input to --output (`predict_multi_label_file`; the
    CLI has checked both files)."""
    max_seq_length = args.max_seq_length or min(128, model_positions(args.model) or 128)
    path, metrics = predict_multi_label_file(args.model, args.input, args.output, max_seq_length=max_seq_length,
                                             batch_size=args.batch_size, dtype=args.dtype,
                                             threshold=getattr(args, "threshold", None))
    print(f"wrote {path}")
    if metrics is not None:  # the input had gold labels
        print(", ".join(f"{name} {value:.4f}" for name, value in metrics.items()))
