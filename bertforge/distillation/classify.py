"""Distilling the classify family (sentence or pair classification, regression): a `FinetuneTask` whose
step is the distillation objective.

The transfer set is the training file's examples (labelled or not), any unlabelled text (one text per
line; a line with a tab is a pair, text<TAB>text_pair) and, with `augment`, augmented copies of the
training texts (`augment`: masking, replacement, n-gram sampling; each text of a pair augmented). The
teacher's logits over it are computed once (`cache.teacher_outputs`) and each batch reads its rows of them.
The loss of a batch is two terms, each a mean over its own rows, which the Trainer weights across
micro-batches and processes:

* `distill_loss`: T² · KL(teacher_T || student_T) over every example (regression: the squared error
  between the student's and the teacher's output);
* `label_loss`: alpha × the cross-entropy (regression: squared error) against the label, over the
  examples that have one.

With `intermediate` (TinyBERT's intermediate-layer transfer, `intermediate.py`), the teacher also runs on
each batch and `hidden_loss` / `attention_loss` are added, each × `intermediate_weight`. With
`student_vocab`, a student checkpoint with its own vocabulary reads its own tokenization of each
example while the teacher's logits are computed on the teacher's (a sentence-level output does not
depend on how the text is split).

`labels_only=True` is the control the distilled student is compared with: the same student, data and
engine, trained on the labels alone (`label_loss` with weight 1, no soft targets).

The data is read as the teacher was trained: a GLUE teacher (finetuning_task "sst2", "mrpc", ...) reads
the GLUE layout of its task, any other the classify family's reader (`read_classify_file`: CSV, TSV or
JSON lines with text, text_pair, label). Evaluation is the fine-tuning task's on --dev-file, plus the
student's agreement with the teacher there; without --dev-file, the student is judged by its agreement
with the teacher on the training file (the squared error for regression).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from .._files import read_text, write_text_atomic
from ..metrics.glue import glue_metrics, main_metric
from ..modeling import BertConfig, BertForSequenceClassification, load_for_inference
from ..modeling.pretrained import resolve_model_dir
from ..tasks.classification import classification_task, classify_metrics, logits_to_predictions, predict_features
from ..tasks.classify_features import convert_examples_to_features, pad_batch
from ..tasks.classify_reader import InputExample
from ..tasks.glue_data import TaskSpec, get_task, read_glue_file
from ..tasks.registry import TaskFamily
from ..training.finetune import FinetuneTask
from .augment import augmented_transfer
from .cache import cache_key, default_cache_dir, teacher_outputs
from .intermediate import IntermediateTransfer, StudentPass, intermediate_counts, with_intermediate
from .objectives import hard_label_loss, soft_target_loss, squared_error_loss
from .student import build_student

__all__ = ["DISTILL_INFO", "cached_logits", "classify_distill_task", "distillation_step", "read_unlabeled", "teacher_batch"]

# Kept with the student: the teacher, the layers, the objective, the transfer set, the teacher's dev scores.
DISTILL_INFO = "distillation.json"


def read_unlabeled(paths: Sequence[str | os.PathLike]) -> list[InputExample]:
    """Unlabelled transfer examples: each non-blank line of each file is one text, or a pair when it holds
    a tab (text<TAB>text_pair)."""
    examples = []
    for path in paths:
        for line in read_text(path).splitlines():
            if not line.strip():
                continue
            text, tab, pair = line.partition("\t")
            examples.append(InputExample(f"unlabeled-{len(examples)}", text, pair if tab and pair.strip() else None))
    return examples


def _glue_spec(task_name: str) -> TaskSpec | None:
    if task_name == "classify":
        return None
    try:
        return get_task(task_name)
    except ValueError:
        return None


def distillation_step(temperature: float, alpha: float, regression: bool, labels_only: bool = False,
                      intermediate: Callable[[], tuple[nn.Module, IntermediateTransfer]] | None = None,
                      intermediate_weight: float = 1.0):
    """The `step_fn` of a classify student: {"distill_loss", "label_loss"} (see the module docstring) and
    the share of examples on which the student's label is the teacher's; `labels_only`: {"label_loss"}
    alone, unweighted (the control). `intermediate()`: the teacher and the run's `IntermediateTransfer`;
    the teacher then runs on the batch too and `intermediate_weight` × its terms ("hidden_loss",
    "attention_loss") are added."""
    def step(model, batch: dict[str, torch.Tensor]):
        student = StudentPass(model, batch, intermediate)
        logits, teacher, mask = student.out.logits, batch["teacher_logits"], batch["label_mask"]
        metrics = {}
        if regression:
            hard = squared_error_loss(logits, batch["labels"], mask)
            soft = functools.partial(squared_error_loss, logits, teacher[:, 0])
        else:
            hard = hard_label_loss(logits, batch["labels"], mask)
            soft = functools.partial(soft_target_loss, logits, teacher, temperature)
            with torch.no_grad():
                metrics["teacher_agreement"] = ((logits.argmax(-1) == teacher.argmax(-1)).sum(), len(teacher))
        return student.losses(soft, hard, alpha, labels_only, intermediate_weight), metrics
    return step


def distillation_count(batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Units behind each term's mean: every example for the soft targets, the labelled ones for the labels;
    the real tokens for the hidden states, the (real query, real key) pairs for the attention maps."""
    return {"distill_loss": float(len(batch["input_ids"])), "label_loss": float(batch["label_mask"].sum()),
            **intermediate_counts(batch["attention_mask"])}


def teacher_batch(rows: list[dict], logits: np.ndarray, pad_id: int) -> dict[str, torch.Tensor]:
    """The padded batch of sentence rows with each row's cached teacher logits ("teacher_logits") and
    "label_mask" (the rows that carry a label: unlabeled and augmented text does not); the family adds
    "labels"."""
    batch = pad_batch(rows, pad_id)
    batch["teacher_logits"] = torch.from_numpy(np.asarray(logits[[r["index"] for r in rows]], dtype=np.float32))
    batch["label_mask"] = torch.tensor([r.get("label") is not None for r in rows], dtype=torch.bool)
    return batch


def _collate(rows: list[dict], logits: np.ndarray, pad_id: int, regression: bool) -> dict[str, torch.Tensor]:
    batch = teacher_batch(rows, logits, pad_id)
    values = [r["label"] if r.get("label") is not None else 0 for r in rows]
    batch["labels"] = torch.tensor(values, dtype=torch.float32 if regression else torch.long)
    return batch


def classify_distill_task(family: TaskFamily, teacher_dir: str | os.PathLike, train_file: str | os.PathLike, *,
                          output_dir: str | os.PathLike, dev_file: str | os.PathLike | None = None,
                          unlabeled: Sequence[str | os.PathLike] = (), layers: int | None = None,
                          student: str | None = None, temperature: float = 2.0, alpha: float = 0.5,
                          max_seq_length: int = 128, eval_batch_size: int = 128,
                          cache_dir: str | os.PathLike | None = None, labels_only: bool = False,
                          device: str | None = None, intermediate: Sequence[str] = (),
                          layer_map: Sequence[int] | None = None, intermediate_weight: float = 1.0,
                          student_vocab: bool = False, augment: int = 0, augment_seed: int = 0,
                          augment_mlm: str | os.PathLike | None = None) -> FinetuneTask:
    """The `FinetuneTask` that distils the classifier in `teacher_dir` into a student (see
    `student.build_student` for `layers` / `student`); the teacher's logits are computed on `device`
    (default: the GPU if there is one) and cached in `cache_dir` (default: `cache.default_cache_dir`).
    `labels_only`: the control, trained on the labels alone (see the module docstring).
    `intermediate` ("hidden", "attention"), `layer_map`, `intermediate_weight`: TinyBERT's intermediate
    terms (`intermediate`; the run's checks are `run.check_options`'). `student_vocab`: the `student`
    checkpoint has its own vocabulary: its features are its tokenizer's, the teacher's cached logits the
    teacher's tokenizer's, matched example by example (a sentence's label does not depend on how it is
    split into tokens). `augment`: that many augmented copies of each training example added to the
    transfer set, unlabelled (`augment.augmented_transfer` with `augment_seed` and, for TinyBERT's
    replacements, `augment_mlm`)."""
    if labels_only and intermediate:
        raise ValueError("--labels-only with --intermediate: the control is trained on the labels alone")
    teacher_dir = Path(teacher_dir)
    config = BertConfig.from_pretrained(teacher_dir)
    task_name = config.extra.get("finetuning_task") or "classify"
    regression = config.num_labels == 1 or config.extra.get("problem_type") == "regression"
    names = config.id2label or {i: str(i) for i in range(config.num_labels)}
    label_list = None if regression else [names[i] for i in range(config.num_labels)]
    spec = _glue_spec(task_name)

    def read(path, split: str, require_labels: bool) -> list[InputExample]:
        if spec is not None:
            return read_glue_file(spec, path, split)
        examples, _ = family.reader(path, regression, label_list=label_list, require_labels=require_labels)
        return examples

    train = read(train_file, "train", False)
    extra = read_unlabeled(unlabeled)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(teacher_dir, output_dir)
    augmented = [InputExample(f"augmented-{i}", a, b) for i, (a, b) in enumerate(augmented_transfer(
        cache_dir, [(e.text_a, e.text_b) for e in train], augment, augment_seed, augment_mlm,
        device=device))] if augment else []
    transfer = train + extra + augmented
    dev = read(dev_file, "dev", True) if dev_file is not None else None

    def metrics_fn(split: str, predictions, labels) -> dict[str, float]:
        if spec is not None:
            return glue_metrics(spec.split(split).metrics_task, predictions, labels)
        return classify_metrics(predictions, labels, regression)

    main = (main_metric(spec.name) if spec is not None else "pearson" if regression else "accuracy") \
        if dev is not None else ("teacher_mse" if regression else "teacher_agreement")
    dev_sets = {"dev": dev} if dev is not None else {}
    base = classification_task(task_name, teacher_dir, transfer, dev_sets, label_list, metrics_fn=metrics_fn,
                               main_metric=main, max_seq_length=max_seq_length, eval_batch_size=eval_batch_size)
    teacher_base = base
    if student_vocab:  # the teacher's outputs on its own tokens; the student trained and judged on its own
        # (truncation: one feature per example in both, in the examples' order)
        base = classification_task(task_name, resolve_model_dir(student), transfer, dev_sets, label_list,
                                   metrics_fn=metrics_fn, main_metric=main, max_seq_length=max_seq_length,
                                   eval_batch_size=eval_batch_size)
    tokenizer, pad_id = base.tokenizer, base.tokenizer.vocab.get("[PAD]", 0)
    teacher_pad_id = teacher_base.tokenizer.vocab.get("[PAD]", 0)
    features = [{**f, "index": i} for i, f in enumerate(base.train_features)]
    teacher_features = features if teacher_base is base else \
        [{**f, "index": i} for i, f in enumerate(teacher_base.train_features)]
    if labels_only and not any(f["label"] is not None for f in features):
        raise ValueError(f"{train_file}: no labelled example to train on the labels alone")

    teacher = load_for_inference(BertForSequenceClassification, teacher_dir, task=task_name)

    def outputs_of(rows: list[dict]) -> np.ndarray:
        return cached_logits(cache_dir, teacher_dir, teacher, rows, "classify logits", eval_batch_size, teacher_pad_id)

    teacher.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    logits = outputs_of(teacher_features)
    dev_features = convert_examples_to_features(dev, tokenizer, label_list, max_seq_length) if dev else []
    teacher_dev_features = dev_features if teacher_base is base else \
        convert_examples_to_features(dev, teacher_base.tokenizer, label_list, max_seq_length) if dev else []
    dev_logits = outputs_of(teacher_dev_features) if dev else None
    teacher.to("cpu")  # from here on copied from (the student's initial weights); with --intermediate it runs
    # beside the student on each batch too (the step puts it on the training device)
    teacher_dev = None
    if dev is not None:
        teacher_dev = metrics_fn("dev", logits_to_predictions(np.asarray(dev_logits), regression),
                                 [f["label"] for f in dev_features])
    overrides = dict(num_labels=config.num_labels, id2label=config.id2label, finetuning_task=task_name,
                     problem_type="regression" if regression else "single_label_classification")
    made: dict[str, Any] = {}

    def build_model():
        model, made["student"] = build_student(teacher, layers=layers, student=student, head_overrides=overrides)
        trained, made["transfer"] = with_intermediate(model, config, intermediate, layer_map)
        return trained

    if intermediate:
        teacher.requires_grad_(False)  # it runs beside the student on every batch, never trained

    train_rows = range(len(train))  # the training file's examples come first in the transfer set

    def evaluate(model):
        if dev is not None:
            metrics, predictions = base.evaluate(model)
            if not regression:
                teacher_labels = np.asarray(dev_logits).argmax(-1)
                metrics["teacher_agreement"] = float(np.mean(predictions["dev"] == teacher_labels))
            return metrics, predictions
        student_logits = predict_features(model, [features[i] for i in train_rows], eval_batch_size, pad_id)
        target = np.asarray(logits[:len(train)])
        if regression:
            return {"teacher_mse": float(np.mean((student_logits[:, 0] - target[:, 0]) ** 2))}, None
        return {"teacher_agreement": float(np.mean(student_logits.argmax(-1) == target.argmax(-1)))}, None

    def extra_files(directory: Path) -> None:
        info = {"teacher": str(teacher_dir), "task": task_name, "family": family.name,
                "teacher_layers": config.num_hidden_layers, **made.get("student", {}),
                "objective": "labels only" if labels_only else "soft targets + labels",
                "temperature": temperature, "alpha": alpha, "max_seq_length": max_seq_length,
                "transfer_examples": len(transfer), "labelled_examples": sum(f["label"] is not None for f in features),
                "unlabeled_examples": len(extra), "augmented_examples": len(augmented),
                "augment": {"copies": augment, "seed": augment_seed, "mlm": None if augment_mlm is None
                            else str(augment_mlm)} if augmented else None,
                "teacher_outputs": str(cache_dir),
                "teacher_dev_metrics": teacher_dev}
        if intermediate:
            info.update(intermediate=list(intermediate), layer_map=list(layer_map),
                        intermediate_weight=intermediate_weight)
        if student_vocab:
            info["student_vocab"] = str(Path(resolve_model_dir(student)) / "vocab.txt")
        write_text_atomic(directory / DISTILL_INFO, json.dumps(info, indent=2) + "\n")

    return FinetuneTask(
        name=task_name, build_model=build_model, tokenizer=tokenizer, train_features=features,
        collate=lambda rows: _collate(rows, logits, pad_id, regression),
        step_fn=distillation_step(temperature, alpha, regression, labels_only,
                                  (lambda: (teacher, made["transfer"])) if intermediate else None,
                                  intermediate_weight),
        evaluate=evaluate, main_metric=main,
        greater_is_better=main != "teacher_mse", write_predictions=base.write_predictions if dev is not None else None,
        lengths=base.lengths, count_fn=distillation_count, extra_files=extra_files)


def cached_logits(cache_dir: Path, teacher_dir: str | os.PathLike, teacher, features: Sequence[dict], what: str,
                  batch_size: int, pad_id: int) -> np.ndarray:
    """The teacher's logits (N, K) over `features`, from `cache_dir` when computed before (memory-mapped),
    else computed now (`teacher_logits`) and cached under the key of the teacher, the inputs and `what`."""
    def compute() -> dict[str, np.ndarray]:
        return {"logits": teacher_logits(teacher, features, batch_size, pad_id)}
    key = cache_key(teacher_dir, features, what)
    return teacher_outputs(cache_dir, key, compute, rows=len(features))["logits"]


def teacher_logits(teacher, features: Sequence[dict], batch_size: int, pad_id: int) -> np.ndarray:
    """The teacher's logits (N, K) float32 for `features`, in their order (eval mode, as saved)."""
    rows = [{k: f[k] for k in ("input_ids", "token_type_ids")} for f in features]
    return predict_features(teacher, rows, batch_size, pad_id).astype(np.float32)
