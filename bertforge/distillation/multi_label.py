"""The multi-label family's distillation adaptor (`bertforge finetune multi-label`: a sigmoid per label):
soft targets of independent labels, and the decision thresholds as the family's after-step.

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
from typing import Sequence

import numpy as np
import torch

from ..modeling import BertConfig
from ..modeling.heads import MULTI_LABEL
from ..tasks.classify import predict_features
from ..tasks.multi_label import (TASK_NAME, THRESHOLD_KEY, THRESHOLDS_KEY, convert_examples, label_thresholds,
                                 multi_hot, multi_label_metrics, sigmoid, tune_thresholds, write_dev_predictions)
from ..tasks.multi_label_reader import MultiLabelExample
from ..tokenization import BertTokenizer
from .classify import SentenceAdaptor, teacher_batch
from .distiller import DistillRun, Terms
from .objectives import binary_label_loss, soft_binary_target_loss

__all__ = ["MultiLabelAdaptor", "multi_label_terms"]


def multi_label_terms(out, batch: dict[str, torch.Tensor], temperature: float, cut: torch.Tensor) -> Terms:
    """The multi-label terms (see the module docstring) and the share of (text, label) decisions on which
    the student agrees with the teacher at the logit thresholds `cut` (p >= t  <=>  logit >= logit(t))."""
    logits, teacher, mask = out.logits, batch["teacher_logits"], batch["label_mask"]
    hard = binary_label_loss(logits, batch["labels"], mask)
    with torch.no_grad():
        threshold = cut.to(logits.device)
        same = (logits.float() >= threshold) == (teacher >= threshold)
        metrics = {"teacher_agreement": (same.sum(), same.numel())}
    soft = functools.partial(soft_binary_target_loss, logits, teacher, temperature)
    return soft, hard, metrics


class MultiLabelAdaptor(SentenceAdaptor):
    """The multi-label family: per-label sigmoid soft targets; its after-step tunes the decision
    threshold(s) on dev and keeps them in the student's config (without dev: the teacher's)."""

    what = "multi-label logits"
    objective = "soft targets (per-label sigmoid) + labels"

    def __init__(self, run: DistillRun) -> None:
        super().__init__(run)
        config, teacher_dir = run.config, run.teacher_dir
        self.max_seq_length = max_seq_length = run.max_seq_length if run.max_seq_length is not None else 128
        self.name = self.teacher_task = TASK_NAME
        self.num_labels = num_labels = config.num_labels
        self.label_list = label_list = [config.id2label[i] for i in range(num_labels)] if config.id2label \
            else [f"LABEL_{i}" for i in range(num_labels)]
        self.teacher_thresholds = label_thresholds(config)
        self.per_label = isinstance(config.extra.get(THRESHOLDS_KEY), dict)
        self.teacher_overall = float(config.extra.get(THRESHOLD_KEY, self.teacher_thresholds[0]))
        self.cut = torch.from_numpy(np.log(self.teacher_thresholds / (1.0 - self.teacher_thresholds))).float()

        def read(path, dev: bool) -> list[MultiLabelExample]:
            examples, _ = run.family.reader(path, label_list=label_list, require_labels=dev)
            return examples

        self.read_transfer(read, MultiLabelExample)
        transfer, dev = self.transfer, self.dev

        self.tokenizer = tokenizer = BertTokenizer.from_pretrained(teacher_dir)
        self.pad_id = self.teacher_pad_id = tokenizer.vocab.get("[PAD]", 0)
        self.features = features = [{**f, "index": i}
                                    for i, f in enumerate(convert_examples(transfer, tokenizer, max_seq_length))]
        self.teacher_features = features
        self.check_labelled()
        self.dev_features = convert_examples(dev, tokenizer, max_seq_length) if dev else []
        if dev:
            self.teacher_dev_features = self.dev_features
        self.gold = multi_hot([e.labels for e in dev], num_labels) if dev else None
        self.head_overrides = dict(num_labels=num_labels, id2label=config.id2label, finetuning_task=TASK_NAME,
                                   problem_type=MULTI_LABEL)
        self.main_metric = "f1_macro" if dev is not None else "teacher_agreement"
        if dev is not None:
            self.write_predictions = lambda directory, result: write_dev_predictions(directory, dev, label_list,
                                                                                     result)

    def received(self, outputs, dev_outputs):
        self.logits, self.dev_logits = outputs["logits"], dev_outputs["logits"] if dev_outputs is not None else None
        if self.dev is None:
            return None
        teacher_dev = multi_label_metrics(sigmoid(self.dev_logits) >= self.teacher_thresholds, self.gold)
        teacher_dev.pop("per_label")
        return teacher_dev

    def after_build(self, model) -> None:
        self._keep(model.config, self.teacher_thresholds, self.teacher_overall)  # until dev

    def collate(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        batch = teacher_batch(rows, self.logits, self.pad_id)
        batch["labels"] = torch.from_numpy(multi_hot([r.get("label") or () for r in rows],
                                                     self.num_labels).astype(np.float32))
        return batch

    def terms(self, out, batch: dict[str, torch.Tensor]) -> Terms:
        return multi_label_terms(out, batch, self.run.temperature, self.cut)

    def evaluate(self, model):
        model_config = getattr(model, "module", model).config
        teacher_thresholds, batch_size = self.teacher_thresholds, self.run.eval_batch_size
        if self.dev is None:
            student_logits = predict_features(model, self.features[:len(self.train)], batch_size, self.pad_id)
            target = np.asarray(self.logits[:len(self.train)])
            same = (sigmoid(student_logits) >= teacher_thresholds) == (sigmoid(target) >= teacher_thresholds)
            self._keep(model_config, teacher_thresholds, self.teacher_overall)
            return {"teacher_agreement": float(same.mean())}, None
        gold = self.gold
        probabilities = sigmoid(predict_features(model, self.dev_features, batch_size, self.pad_id))
        thresholds = tune_thresholds(probabilities, gold, self.per_label)
        predicted = probabilities >= thresholds
        scores = multi_label_metrics(predicted, gold)
        per_label_scores = scores.pop("per_label")
        scores["f1_macro_teacher_threshold"] = multi_label_metrics(probabilities >= teacher_thresholds,
                                                                   gold)["f1_macro"]
        teacher_decisions = sigmoid(self.dev_logits) >= teacher_thresholds
        scores["teacher_agreement"] = float(np.mean((probabilities >= teacher_thresholds) == teacher_decisions))
        if not self.per_label:
            scores["threshold"] = float(thresholds[0])
        # saved with the model if this evaluation is the best (as `finetune multi-label` does)
        self._keep(model_config, thresholds, overall=float(tune_thresholds(probabilities, gold)[0]))
        return scores, {"predicted": predicted, "probabilities": probabilities, "per_label": per_label_scores,
                        "thresholds": thresholds}

    def _keep(self, config: BertConfig, thresholds: np.ndarray, overall: float | None = None) -> None:
        _keep_thresholds(config, thresholds, self.label_list, self.per_label, overall)

    def info(self) -> dict:
        return {**super().info(), "teacher_thresholds": [float(t) for t in self.teacher_thresholds]}


def _keep_thresholds(config: BertConfig, thresholds: np.ndarray, label_list: Sequence[str], per_label: bool,
                     overall: float | None = None) -> None:
    """The decision threshold(s) in the student's config (config.json `multi_label_threshold`, and per label
    `multi_label_thresholds`), where `predict` and `pipeline` read them."""
    config.extra[THRESHOLD_KEY] = float(thresholds[0] if overall is None else overall)
    if per_label:
        config.extra[THRESHOLDS_KEY] = {name: float(t) for name, t in zip(label_list, thresholds)}
    else:
        config.extra.pop(THRESHOLDS_KEY, None)
