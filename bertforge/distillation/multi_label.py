"""Distilling the multi-label family (`bertforge finetune multi-label`: a sigmoid per label): a
`FinetuneTask` whose step is the distillation objective for independent labels.

The transfer set is built as for classify (`classify`'s module docstring): the training file's examples
(labelled or not), unlabelled text, augmented copies. The teacher's logits over it are computed once and
cached (`cache.teacher_outputs`). The loss of a batch is two terms, each a mean over its own rows:

* `distill_loss`: T² · the mean binary cross-entropy of the student's per-label sigmoid(z_s / T) against the
  teacher's sigmoid(z_t / T) (`objectives.soft_binary_target_loss`), over every example;
* `label_loss`: alpha × the binary cross-entropy against the gold label sets, over the labelled examples
  (`labels_only`: the control, this term alone with weight 1).

The data is read by the multi-label family's reader (`tasks.multi_label_reader.read_multi_label_file`:
GoEmotions' TSV, CSV or JSON lines). The label names are the teacher's (`id2label` in its config.json):
GoEmotions' label ids index them, as emotions.txt did when the teacher was fine-tuned, so no --labels file
is needed; a name the teacher does not know is an error naming the file and line.

Evaluation on --dev-file: macro-F1 (the main metric) at the decision threshold(s) re-tuned on dev for the
student, as `finetune multi-label` does (one global threshold, or one per label when the teacher has
per-label ones), kept in the student's config.json, where `predict`, `pipeline` and `serve` read it; also
macro-F1 at the teacher's own threshold(s) (`f1_macro_teacher_threshold`) and the share of (text, label)
decisions the student makes as the teacher does (`teacher_agreement`). Without --dev-file the student is
judged by that agreement on the training file, and keeps the teacher's threshold(s).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .._files import write_text_atomic
from ..modeling import BertConfig, BertForSequenceClassification, load_for_inference
from ..modeling.heads import MULTI_LABEL
from ..tasks.classification import predict_features
from ..tasks.multi_label import (TASK_NAME, THRESHOLD_KEY, THRESHOLDS_KEY, convert_examples, label_thresholds,
                                 multi_hot, multi_label_metrics, sigmoid, tune_thresholds, write_dev_predictions)
from ..tasks.multi_label_reader import MultiLabelExample
from ..tasks.registry import TaskFamily
from ..tokenization import BertTokenizer
from ..training.finetune import FinetuneTask
from .augment import augmented_transfer
from .cache import default_cache_dir
from .classify import DISTILL_INFO, cached_logits, distillation_count, read_unlabeled, teacher_batch
from .intermediate import StudentPass
from .objectives import binary_label_loss, soft_binary_target_loss
from .student import build_student

__all__ = ["multi_label_distill_task", "multi_label_distillation_step"]


def multi_label_distillation_step(temperature: float, alpha: float, thresholds: np.ndarray,
                                  labels_only: bool = False):
    """The `step_fn` of a multi-label student: {"distill_loss", "label_loss"} (see the module docstring)
    and the share of (text, label) decisions on which the student agrees with the teacher at `thresholds`;
    `labels_only`: {"label_loss"} alone, unweighted (the control)."""
    cut = torch.from_numpy(np.log(thresholds / (1.0 - thresholds))).float()  # p >= t  <=>  logit >= logit(t)

    def step(model, batch: dict[str, torch.Tensor]):
        student = StudentPass(model, batch)
        logits, teacher, mask = student.out.logits, batch["teacher_logits"], batch["label_mask"]
        hard = binary_label_loss(logits, batch["labels"], mask)
        with torch.no_grad():
            threshold = cut.to(logits.device)
            same = (logits.float() >= threshold) == (teacher >= threshold)
            metrics = {"teacher_agreement": (same.sum(), same.numel())}
        soft = functools.partial(soft_binary_target_loss, logits, teacher, temperature)
        return student.losses(soft, hard, alpha, labels_only), metrics
    return step


def _collate(rows: list[dict], logits: np.ndarray, pad_id: int, num_labels: int) -> dict[str, torch.Tensor]:
    batch = teacher_batch(rows, logits, pad_id)
    batch["labels"] = torch.from_numpy(multi_hot([r.get("label") or () for r in rows], num_labels).astype(np.float32))
    return batch


def multi_label_distill_task(family: TaskFamily, teacher_dir: str | os.PathLike, train_file: str | os.PathLike, *,
                             output_dir: str | os.PathLike, dev_file: str | os.PathLike | None = None,
                             unlabeled: Sequence[str | os.PathLike] = (), layers: int | None = None,
                             student: str | None = None, temperature: float = 2.0, alpha: float = 0.5,
                             max_seq_length: int = 128, eval_batch_size: int = 128,
                             cache_dir: str | os.PathLike | None = None, labels_only: bool = False,
                             device: str | None = None, augment: int = 0, augment_seed: int = 0,
                             augment_mlm: str | os.PathLike | None = None) -> FinetuneTask:
    """The `FinetuneTask` that distils the multi-label classifier in `teacher_dir` into a student; the
    options are `classify.classify_distill_task`'s (see the module docstring for the objective, the data
    and the evaluation)."""
    teacher_dir = Path(teacher_dir)
    config = BertConfig.from_pretrained(teacher_dir)
    num_labels = config.num_labels
    label_list = [config.id2label[i] for i in range(num_labels)] if config.id2label \
        else [f"LABEL_{i}" for i in range(num_labels)]
    teacher_thresholds = label_thresholds(config)
    per_label = isinstance(config.extra.get(THRESHOLDS_KEY), dict)
    teacher_overall = float(config.extra.get(THRESHOLD_KEY, teacher_thresholds[0]))

    def read(path, require_labels: bool) -> list[MultiLabelExample]:
        examples, _ = family.reader(path, label_list=label_list, require_labels=require_labels)
        return examples

    train = read(train_file, False)
    extra = [MultiLabelExample(e.guid, e.text_a, e.text_b) for e in read_unlabeled(unlabeled)]
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(teacher_dir, output_dir)
    augmented = [MultiLabelExample(f"augmented-{i}", a, b) for i, (a, b) in enumerate(augmented_transfer(
        cache_dir, [(e.text_a, e.text_b) for e in train], augment, augment_seed, augment_mlm,
        device=device))] if augment else []
    transfer = train + extra + augmented
    dev = read(dev_file, True) if dev_file is not None else None

    tokenizer = BertTokenizer.from_pretrained(teacher_dir)
    pad_id = tokenizer.vocab.get("[PAD]", 0)
    features = [{**f, "index": i} for i, f in enumerate(convert_examples(transfer, tokenizer, max_seq_length))]
    if labels_only and not any(f["label"] is not None for f in features):
        raise ValueError(f"{train_file}: no labelled example to train on the labels alone")
    dev_features = convert_examples(dev, tokenizer, max_seq_length) if dev else []
    gold = multi_hot([e.labels for e in dev], num_labels) if dev else None

    teacher = load_for_inference(BertForSequenceClassification, teacher_dir, task=TASK_NAME)

    def outputs_of(rows: list[dict]) -> np.ndarray:
        return cached_logits(cache_dir, teacher_dir, teacher, rows, "multi-label logits", eval_batch_size, pad_id)

    teacher.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    logits = outputs_of(features)
    dev_logits = outputs_of(dev_features) if dev else None
    teacher.to("cpu")  # from here on only copied from (the student's initial weights)
    teacher_dev = None
    if dev is not None:
        teacher_dev = multi_label_metrics(sigmoid(dev_logits) >= teacher_thresholds, gold)
        teacher_dev.pop("per_label")
    overrides = dict(num_labels=num_labels, id2label=config.id2label, finetuning_task=TASK_NAME,
                     problem_type=MULTI_LABEL)
    made: dict[str, Any] = {}

    def build_model():
        model, made["student"] = build_student(teacher, layers=layers, student=student, head_overrides=overrides)
        _keep_thresholds(model.config, teacher_thresholds, label_list, per_label, teacher_overall)  # until dev
        return model

    def evaluate(model):
        model_config = getattr(model, "module", model).config
        if dev is None:
            student_logits = predict_features(model, features[:len(train)], eval_batch_size, pad_id)
            target = np.asarray(logits[:len(train)])
            same = (sigmoid(student_logits) >= teacher_thresholds) == (sigmoid(target) >= teacher_thresholds)
            _keep_thresholds(model_config, teacher_thresholds, label_list, per_label, teacher_overall)
            return {"teacher_agreement": float(same.mean())}, None
        probabilities = sigmoid(predict_features(model, dev_features, eval_batch_size, pad_id))
        thresholds = tune_thresholds(probabilities, gold, per_label)
        predicted = probabilities >= thresholds
        scores = multi_label_metrics(predicted, gold)
        per_label_scores = scores.pop("per_label")
        scores["f1_macro_teacher_threshold"] = multi_label_metrics(probabilities >= teacher_thresholds,
                                                                   gold)["f1_macro"]
        teacher_decisions = sigmoid(dev_logits) >= teacher_thresholds
        scores["teacher_agreement"] = float(np.mean((probabilities >= teacher_thresholds) == teacher_decisions))
        if not per_label:
            scores["threshold"] = float(thresholds[0])
        # saved with the model if this evaluation is the best (as `finetune multi-label` does)
        _keep_thresholds(model_config, thresholds, label_list, per_label,
                         overall=float(tune_thresholds(probabilities, gold)[0]))
        return scores, {"predicted": predicted, "probabilities": probabilities, "per_label": per_label_scores,
                        "thresholds": thresholds}

    def write_predictions(directory: Path, result) -> None:
        write_dev_predictions(directory, dev, label_list, result)

    def extra_files(directory: Path) -> None:
        info = {"teacher": str(teacher_dir), "task": TASK_NAME, "family": family.name,
                "teacher_layers": config.num_hidden_layers, **made.get("student", {}),
                "objective": "labels only" if labels_only else "soft targets (per-label sigmoid) + labels",
                "temperature": temperature, "alpha": alpha, "max_seq_length": max_seq_length,
                "transfer_examples": len(transfer), "labelled_examples": sum(f["label"] is not None for f in features),
                "unlabeled_examples": len(extra), "augmented_examples": len(augmented),
                "augment": {"copies": augment, "seed": augment_seed, "mlm": None if augment_mlm is None
                            else str(augment_mlm)} if augmented else None,
                "teacher_outputs": str(cache_dir), "teacher_thresholds": [float(t) for t in teacher_thresholds],
                "teacher_dev_metrics": teacher_dev}
        write_text_atomic(directory / DISTILL_INFO, json.dumps(info, indent=2) + "\n")

    main = "f1_macro" if dev is not None else "teacher_agreement"
    return FinetuneTask(
        name=TASK_NAME, build_model=build_model, tokenizer=tokenizer, train_features=features,
        collate=lambda rows: _collate(rows, logits, pad_id, num_labels),
        step_fn=multi_label_distillation_step(temperature, alpha, teacher_thresholds, labels_only),
        evaluate=evaluate, main_metric=main, write_predictions=write_predictions if dev is not None else None,
        lengths=[len(f["input_ids"]) for f in features], count_fn=distillation_count, extra_files=extra_files)


def _keep_thresholds(config: BertConfig, thresholds: np.ndarray, label_list: Sequence[str], per_label: bool,
                     overall: float | None = None) -> None:
    """The decision threshold(s) in the student's config (config.json `multi_label_threshold`, and per label
    `multi_label_thresholds`), where `predict` and `pipeline` read them."""
    config.extra[THRESHOLD_KEY] = float(thresholds[0] if overall is None else overall)
    if per_label:
        config.extra[THRESHOLDS_KEY] = {name: float(t) for name, t in zip(label_list, thresholds)}
    else:
        config.extra.pop(THRESHOLDS_KEY, None)
