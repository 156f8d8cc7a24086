"""The classify family's distillation adaptor (sentence or pair classification, regression): what the
general distiller (`distiller.py`) needs to know about it.

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
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .._files import read_text
from ..metrics.glue import glue_metrics, main_metric
from ..modeling.pretrained import resolve_model_dir
from ..tasks.classify import classification_task, classify_metrics, logits_to_predictions, predict_features
from ..tasks.classify_features import convert_examples_to_features, pad_batch
from ..tasks.classify_reader import InputExample
from ..tasks.glue_data import TaskSpec, get_task, read_glue_file
from .distiller import Adaptor, DistillRun, Terms
from .objectives import hard_label_loss, soft_target_loss, squared_error_loss

__all__ = ["ClassifyAdaptor", "classify_terms", "distillation_count", "read_unlabeled", "teacher_batch",
           "teacher_logits"]


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


def classify_terms(out, batch: dict[str, torch.Tensor], temperature: float, regression: bool) -> Terms:
    """The classify family's terms (see the module docstring) and the share of examples on which the
    student's label is the teacher's (not for regression)."""
    logits, teacher, mask = out.logits, batch["teacher_logits"], batch["label_mask"]
    metrics = {}
    if regression:
        hard = squared_error_loss(logits, batch["labels"], mask)
        soft = functools.partial(squared_error_loss, logits, teacher[:, 0])
    else:
        hard = hard_label_loss(logits, batch["labels"], mask)
        soft = functools.partial(soft_target_loss, logits, teacher, temperature)
        with torch.no_grad():
            metrics["teacher_agreement"] = ((logits.argmax(-1) == teacher.argmax(-1)).sum(), len(teacher))
    return soft, hard, metrics


def distillation_count(batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Units behind each term's mean: every example for the soft targets, the labelled ones for the labels."""
    return {"distill_loss": float(len(batch["input_ids"])), "label_loss": float(batch["label_mask"].sum())}


def teacher_batch(rows: list[dict], logits: np.ndarray, pad_id: int) -> dict[str, torch.Tensor]:
    """The padded batch of sentence rows with each row's cached teacher logits ("teacher_logits") and
    "label_mask" (the rows that carry a label: unlabeled and augmented text does not); the family adds
    "labels"."""
    batch = pad_batch(rows, pad_id)
    batch["teacher_logits"] = torch.from_numpy(np.asarray(logits[[r["index"] for r in rows]], dtype=np.float32))
    batch["label_mask"] = torch.tensor([r.get("label") is not None for r in rows], dtype=torch.bool)
    return batch


def teacher_logits(teacher, features: Sequence[dict], batch_size: int, pad_id: int) -> np.ndarray:
    """The teacher's logits (N, K) float32 for `features`, in their order (eval mode, as saved)."""
    rows = [{k: f[k] for k in ("input_ids", "token_type_ids")} for f in features]
    return predict_features(teacher, rows, batch_size, pad_id).astype(np.float32)


class SentenceAdaptor(Adaptor):
    """What the sentence-level families share: the teacher's logits (N, K) per transfer example, stored as
    one array ("logits"); a batch reads its rows."""

    inputs = ("input_ids", "token_type_ids")

    def compute(self, teacher, rows: Sequence[dict]) -> dict[str, np.ndarray]:
        return {"logits": teacher_logits(teacher, rows, self.run.eval_batch_size, self.teacher_pad_id)}

    def count(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        return distillation_count(batch)

    def read_transfer(self, read: Callable[[str | os.PathLike, bool], list], make: Callable[[str, str, str | None], Any]
                      ) -> None:
        """The transfer set, in order: the training file's examples (`read(path, False)`: labelled or not),
        the --unlabeled lines, the augmented copies of the training texts (`make(guid, text, text_pair)`);
        and the dev file's (`read(path, True)`), None without one."""
        run = self.run
        self.train = train = read(run.train_file, False)
        self.extra = extra = [make(e.guid, e.text_a, e.text_b) for e in read_unlabeled(run.unlabeled)]
        self.augmented = augmented = [make(f"augmented-{i}", a, b) for i, (a, b) in enumerate(
            run.augmented([(e.text_a, e.text_b) for e in train]))]
        self.transfer = train + extra + augmented
        self.dev = read(run.dev_file, True) if run.dev_file is not None else None

    def check_labelled(self) -> None:
        """ValueError for the labels-only control on a training file without a label."""
        if self.run.labels_only and not any(f["label"] is not None for f in self.features):
            raise ValueError(f"{self.run.train_file}: no labelled example to train on the labels alone")

    def info(self) -> dict[str, Any]:
        return {"max_seq_length": self.max_seq_length, "transfer_examples": len(self.transfer),
                "labelled_examples": sum(f["label"] is not None for f in self.features),
                "unlabeled_examples": len(self.extra), "augmented_examples": len(self.augmented),
                "augment": self.run.augment_info(len(self.augmented))}


class ClassifyAdaptor(SentenceAdaptor):
    """The classify family: softmax soft targets (regression: the squared error to the teacher's output),
    a GLUE teacher's data and metrics or the classify reader's, and `student_vocab` (a sentence's label
    does not depend on its tokenization). `run.max_seq_length` defaults to 128."""

    what = "classify logits"

    def __init__(self, run: DistillRun) -> None:
        super().__init__(run)
        config, teacher_dir = run.config, run.teacher_dir
        max_seq_length = run.max_seq_length if run.max_seq_length is not None else 128
        self.max_seq_length = max_seq_length
        self.name = self.teacher_task = task_name = config.extra.get("finetuning_task") or "classify"
        self.regression = regression = config.num_labels == 1 or config.extra.get("problem_type") == "regression"
        names = config.id2label or {i: str(i) for i in range(config.num_labels)}
        label_list = None if regression else [names[i] for i in range(config.num_labels)]
        self.spec = spec = _glue_spec(task_name)

        def read(path, dev: bool) -> list[InputExample]:
            if spec is not None:
                return read_glue_file(spec, path, "dev" if dev else "train")
            examples, _ = run.family.reader(path, regression, label_list=label_list, require_labels=dev)
            return examples

        self.read_transfer(read, InputExample)
        transfer, dev = self.transfer, self.dev
        main = (main_metric(spec.name) if spec is not None else "pearson" if regression else "accuracy") \
            if dev is not None else ("teacher_mse" if regression else "teacher_agreement")
        self.main_metric, self.greater_is_better = main, main != "teacher_mse"
        dev_sets = {"dev": dev} if dev is not None else {}
        base = classification_task(task_name, teacher_dir, transfer, dev_sets, label_list, metrics_fn=self.metrics,
                                   main_metric=main, max_seq_length=max_seq_length,
                                   eval_batch_size=run.eval_batch_size)
        teacher_base = base
        if run.student_vocab:  # the teacher's outputs on its own tokens; the student trained and judged on its own
            # (truncation: one feature per example in both, in the examples' order)
            base = classification_task(task_name, resolve_model_dir(run.student), transfer, dev_sets, label_list,
                                       metrics_fn=self.metrics, main_metric=main, max_seq_length=max_seq_length,
                                       eval_batch_size=run.eval_batch_size)
        self.base = base
        self.tokenizer, self.pad_id = base.tokenizer, base.tokenizer.vocab.get("[PAD]", 0)
        self.teacher_pad_id = teacher_base.tokenizer.vocab.get("[PAD]", 0)
        self.features = features = [{**f, "index": i} for i, f in enumerate(base.train_features)]
        self.teacher_features = features if teacher_base is base else \
            [{**f, "index": i} for i, f in enumerate(teacher_base.train_features)]
        self.check_labelled()
        self.dev_features = convert_examples_to_features(dev, self.tokenizer, label_list, max_seq_length) \
            if dev else []
        if dev:
            self.teacher_dev_features = self.dev_features if teacher_base is base else \
                convert_examples_to_features(dev, teacher_base.tokenizer, label_list, max_seq_length)
        self.head_overrides = dict(num_labels=config.num_labels, id2label=config.id2label, finetuning_task=task_name,
                                   problem_type="regression" if regression else "single_label_classification")
        self.write_predictions = base.write_predictions if dev is not None else None

    @property
    def lengths(self):
        return self.base.lengths

    def metrics(self, split: str, predictions, labels) -> dict[str, float]:
        if self.spec is not None:
            return glue_metrics(self.spec.split(split).metrics_task, predictions, labels)
        return classify_metrics(predictions, labels, self.regression)

    def received(self, outputs, dev_outputs):
        self.logits, self.dev_logits = outputs["logits"], dev_outputs["logits"] if dev_outputs is not None else None
        if self.dev is None:
            return None
        return self.metrics("dev", logits_to_predictions(np.asarray(self.dev_logits), self.regression),
                            [f["label"] for f in self.dev_features])

    def collate(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        batch = teacher_batch(rows, self.logits, self.pad_id)
        values = [r["label"] if r.get("label") is not None else 0 for r in rows]
        batch["labels"] = torch.tensor(values, dtype=torch.float32 if self.regression else torch.long)
        return batch

    def terms(self, out, batch: dict[str, torch.Tensor]) -> Terms:
        return classify_terms(out, batch, self.run.temperature, self.regression)

    def evaluate(self, model):
        if self.dev is not None:
            metrics, predictions = self.base.evaluate(model)
            if not self.regression:
                teacher_labels = np.asarray(self.dev_logits).argmax(-1)
                metrics["teacher_agreement"] = float(np.mean(predictions["dev"] == teacher_labels))
            return metrics, predictions
        train = len(self.train)  # the training file's examples come first in the transfer set
        student_logits = predict_features(model, self.features[:train], self.run.eval_batch_size, self.pad_id)
        target = np.asarray(self.logits[:train])
        if self.regression:
            return {"teacher_mse": float(np.mean((student_logits[:, 0] - target[:, 0]) ** 2))}, None
        return {"teacher_agreement": float(np.mean(student_logits.argmax(-1) == target.argmax(-1)))}, None

    def info(self) -> dict[str, Any]:
        info = super().info()
        if self.run.student_vocab:
            info["student_vocab"] = str(Path(resolve_model_dir(self.run.student)) / "vocab.txt")
        return info
