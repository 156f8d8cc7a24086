"""The general distiller: a fine-tuned teacher of any task family in a smaller student.

TextBrewer's design (Yang et al. 2020): one distiller runs every task, and a task enters only as an
adaptor that says what its outputs are. The distiller does what every family shares, once:

1. the run's settings (`DistillRun`): the teacher, the transfer text (--unlabeled, --augment through
   `DistillRun.augmented`), the objective's temperature and weights, TinyBERT's intermediate terms, the
   labels-only control, where the teacher's outputs are cached;
2. the family's `Adaptor`, made for the run: it reads the data and builds the transfer rows (each with
   its "index" into the teacher's outputs) and the dev rows;
3. the teacher loaded, its outputs over the transfer and dev rows computed once on the device and kept
   memory-mapped (`cache.teacher_outputs`, keyed by the adaptor's `what` and `inputs`);
4. the student (`student.build_student`: teacher layers, a preset or a checkpoint, the head configured by
   `Adaptor.head_overrides`, then `Adaptor.after_build`, e.g. the multi-label thresholds), wrapped with
   the intermediate projections when asked (`intermediate.with_intermediate`);
5. the step: the student's forward pass (`intermediate.StudentPass`), the adaptor's terms (its soft-target
   loss, its label loss, its agreement with the teacher), weighted by alpha or alone for the control,
   plus the intermediate terms; the units behind each mean (`Adaptor.count` + the intermediate counts);
6. evaluation and the family's after-step (`Adaptor.evaluate`: SQuAD 2.0's no-answer threshold,
   multi-label's thresholds, tuned on dev and kept in the student's config), and distillation.json.

What stays per family is the adaptor (`classify`, `multi_label`, `tag`, `answer`): the outputs, their
storage, the loss, the collate of the teacher's targets and the agreement metric.
"""

from __future__ import annotations

import abc
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from .._files import write_text_atomic
from ..modeling import BertConfig, load_for_inference
from ..tasks.registry import TaskFamily
from ..training.finetune import FinetuneTask
from .augment import augmented_transfer
from .cache import cache_settings, key_of, teacher_outputs
from .intermediate import IntermediateTransfer, StudentPass, intermediate_counts, with_intermediate
from .student import build_student

__all__ = ["DISTILL_INFO", "Adaptor", "DistillRun", "Terms", "distillation_step", "general_distill_task"]

# Kept with the student: the teacher, the layers, the objective, the transfer set, the teacher's dev scores.
DISTILL_INFO = "distillation.json"

# A family's loss terms on one batch: (the soft-target loss, computed only when used; the label loss, a mean
# over the labelled units; the step's metrics, e.g. {"teacher_agreement": (count, units)}).
Terms = tuple[Callable[[], torch.Tensor], torch.Tensor, dict[str, Any]]


@dataclass(frozen=True)
class DistillRun:
    """One distillation's settings, the same for every family.

    cache_dir: where the teacher's outputs (and augmented text) are kept, resolved. intermediate: the
    kinds of TinyBERT's terms ("hidden", "attention"; empty: none) with `layer_map` and
    `intermediate_weight`. options: the family's own (`Distillation.options`, e.g. SQuAD's version)."""

    family: TaskFamily
    teacher_dir: Path
    config: BertConfig
    train_file: str | os.PathLike
    output_dir: str | os.PathLike
    cache_dir: Path
    dev_file: str | os.PathLike | None = None
    unlabeled: Sequence[str | os.PathLike] = ()
    layers: int | None = None
    student: str | None = None
    temperature: float = 2.0
    alpha: float = 0.5
    max_seq_length: int | None = None
    eval_batch_size: int = 128
    labels_only: bool = False
    device: str | None = None
    intermediate: Sequence[str] = ()
    layer_map: Sequence[int] | None = None
    intermediate_weight: float = 1.0
    student_vocab: bool = False
    augment: int = 0
    augment_seed: int = 0
    augment_mlm: str | os.PathLike | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def augmented(self, texts: Sequence[Sequence[str | None]]) -> list[tuple[str | None, ...]]:
        """`augment` copies of each text tuple (`augment.augmented_transfer`, kept in `cache_dir`), in order;
        none without --augment."""
        if not self.augment:
            return []
        return augmented_transfer(self.cache_dir, texts, self.augment, self.augment_seed, self.augment_mlm,
                                  device=self.device)

    def augment_info(self, count: int) -> dict[str, Any] | None:
        """distillation.json's "augment": the copies, seed and masked LM behind `count` augmented texts."""
        return {"copies": self.augment, "seed": self.augment_seed,
                "mlm": None if self.augment_mlm is None else str(self.augment_mlm)} if count else None


class Adaptor(abc.ABC):
    """What a task family tells the general distiller; one instance per run (`Adaptor(run)` reads the
    data and builds the rows).

    Declared by the class: `what` and `inputs` (the cache key's name of the outputs and the feature
    fields they depend on), `per_row` (every stored array has one row per feature: checked when read
    back), `objective` (distillation.json's words). The teacher's and the student's head class is the
    family's (`TaskFamily.head`).
    Set by `__init__`: `name` (the student's finetuning task, the run's name), `teacher_task` (the task
    the teacher loads for), `tokenizer`, `pad_id`, `teacher_pad_id`, `features` (the transfer rows the
    student trains on, each with "index": its row of the teacher's outputs), `teacher_features` (the rows
    the teacher's outputs are computed on: `features` unless the student has its own vocabulary),
    `teacher_dev_features` (None without a dev file), `head_overrides`, `main_metric`,
    `greater_is_better`, `write_predictions`, `lengths`."""

    what: str
    inputs: tuple[str, ...] = ("input_ids", "token_type_ids")
    per_row: bool = True
    objective: str = "soft targets + labels"

    name: str
    teacher_task: str
    tokenizer: Any
    pad_id: int
    teacher_pad_id: int
    features: list[dict]
    teacher_features: list[dict]
    teacher_dev_features: list[dict] | None = None
    head_overrides: dict[str, Any]
    main_metric: str
    greater_is_better: bool = True
    write_predictions: Callable[[Path, Any], None] | None = None

    def __init__(self, run: DistillRun) -> None:
        self.run = run

    @property
    def lengths(self) -> list[int]:
        """Tokens per transfer row (length-grouped batches)."""
        return [len(f["input_ids"]) for f in self.features]

    @abc.abstractmethod
    def compute(self, teacher: nn.Module, rows: Sequence[dict]) -> dict[str, np.ndarray]:
        """The teacher's outputs over `rows`, in their order, as named arrays (what the cache stores)."""

    @abc.abstractmethod
    def received(self, outputs: dict[str, np.ndarray], dev_outputs: dict[str, np.ndarray] | None
                 ) -> dict[str, float] | None:
        """Keep the teacher's (memory-mapped) outputs over the transfer and dev rows; the teacher's dev scores."""

    def after_build(self, model: nn.Module) -> None:
        """Anything the student's config needs beyond `head_overrides` (before training)."""

    @abc.abstractmethod
    def collate(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        """The batch of `rows` with the teacher's targets for them."""

    @abc.abstractmethod
    def terms(self, out: Any, batch: dict[str, torch.Tensor]) -> Terms:
        """The family's loss terms from the student's outputs on `batch` (see `Terms`)."""

    @abc.abstractmethod
    def count(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """The units behind "distill_loss" and "label_loss" (the intermediate terms' are added)."""

    @abc.abstractmethod
    def evaluate(self, model: nn.Module) -> tuple[dict[str, float], Any]:
        """The student's metrics and predictions (dev, else its agreement on the training rows), and the
        family's after-step (a threshold tuned and kept in the model's config)."""

    def info(self) -> dict[str, Any]:
        """The family's own entries of distillation.json."""
        return {}


def distillation_step(terms: Callable[[Any, dict[str, torch.Tensor]], Terms], alpha: float, labels_only: bool = False,
                      intermediate: Callable[[], tuple[nn.Module, IntermediateTransfer]] | None = None,
                      intermediate_weight: float = 1.0):
    """The `step_fn` of a student: {"distill_loss", "label_loss"} from the family's `terms` (alpha × the label
    loss), or {"label_loss"} alone, unweighted, for the `labels_only` control; with `intermediate()` (the
    teacher and the run's `IntermediateTransfer`) the teacher runs on the batch too and
    `intermediate_weight` × its terms ("hidden_loss", "attention_loss") are added."""
    def step(model, batch: dict[str, torch.Tensor]):
        student = StudentPass(model, batch, intermediate)
        soft, hard, metrics = terms(student.out, batch)
        return student.losses(soft, hard, alpha, labels_only, intermediate_weight), metrics
    return step


def _outputs(run: DistillRun, adaptor: Adaptor, teacher: nn.Module, rows: list[dict]) -> dict[str, np.ndarray]:
    """The teacher's outputs over `rows` from the cache (verified against their checksums and the settings
    that made them), computed and stored first when absent or damaged."""
    settings = cache_settings(run.teacher_dir, rows, adaptor.what, inputs=adaptor.inputs)
    return teacher_outputs(run.cache_dir, key_of(settings), lambda: adaptor.compute(teacher, rows),
                           rows=len(rows) if adaptor.per_row else None, settings=settings)


def divergence_advice(run: DistillRun) -> str:
    """The likely causes of a non-finite loss in a distillation, with the run's values, for its one-line error:
    the temperature (T² scales the soft term), the teacher's outputs (verified on every read, so rarely), then
    the learning rate."""
    labels_only = " (not used: --labels-only)" if run.labels_only else ""
    return (f"In a distillation the likely causes: --temperature {run.temperature:g}{labels_only} (the soft-target "
            f"term is scaled by T²; 1 to 20 is usual); the teacher's outputs cached in {run.cache_dir} (checked "
            "against their checksums when read: a damaged entry is recomputed; delete it to be sure); or the "
            "learning rate (--lr: lower it, with a longer warm-up or --max-grad-norm, and --resume).")


def general_distill_task(run: DistillRun, adaptor_class: type[Adaptor]) -> FinetuneTask:
    """The student's `FinetuneTask` for `run`, the family entering as `adaptor_class` (see the module
    docstring for the order of the work)."""
    if run.labels_only and run.intermediate:
        raise ValueError("--labels-only with --intermediate: the control is trained on the labels alone")
    adaptor = adaptor_class(run)
    teacher = load_for_inference(run.family.head, run.teacher_dir, task=adaptor.teacher_task)
    teacher.to(run.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    outputs = _outputs(run, adaptor, teacher, adaptor.teacher_features)
    dev_outputs = _outputs(run, adaptor, teacher, adaptor.teacher_dev_features) \
        if adaptor.teacher_dev_features is not None else None
    teacher.to("cpu")  # from here on copied from (the student's initial weights); with --intermediate it runs
    # beside the student on each batch too (the step puts it on the training device)
    teacher_dev = adaptor.received(outputs, dev_outputs)
    made: dict[str, Any] = {}

    def build_model():
        model, made["student"] = build_student(teacher, layers=run.layers, student=run.student,
                                               head_overrides=adaptor.head_overrides,
                                               keep_last=run.family.distill.keep_last_layer)
        adaptor.after_build(model)
        trained, made["transfer"] = with_intermediate(model, run.config, run.intermediate, run.layer_map)
        return trained

    if run.intermediate:
        teacher.requires_grad_(False)  # it runs beside the student on every batch, never trained

    def count(batch: dict[str, torch.Tensor]) -> dict[str, float]:
        return {**adaptor.count(batch), **intermediate_counts(batch["attention_mask"])}

    def extra_files(directory: Path) -> None:
        info = {"teacher": str(run.teacher_dir), "task": adaptor.name, "family": run.family.name,
                "teacher_layers": run.config.num_hidden_layers, **made.get("student", {}),
                "objective": "labels only" if run.labels_only else adaptor.objective,
                "temperature": run.temperature, "alpha": run.alpha, **adaptor.info(),
                "teacher_outputs": str(run.cache_dir), "teacher_dev_metrics": teacher_dev}
        if run.intermediate:
            info.update(intermediate=list(run.intermediate), layer_map=list(run.layer_map),
                        intermediate_weight=run.intermediate_weight)
        write_text_atomic(directory / DISTILL_INFO, json.dumps(info, indent=2) + "\n")

    return FinetuneTask(
        divergence_advice=divergence_advice(run),
        name=adaptor.name, build_model=build_model, tokenizer=adaptor.tokenizer, train_features=adaptor.features,
        collate=adaptor.collate,
        step_fn=distillation_step(adaptor.terms, run.alpha, run.labels_only,
                                  (lambda: (teacher, made["transfer"])) if run.intermediate else None,
                                  run.intermediate_weight),
        evaluate=adaptor.evaluate, main_metric=adaptor.main_metric, greater_is_better=adaptor.greater_is_better,
        write_predictions=adaptor.write_predictions, lengths=adaptor.lengths, count_fn=count,
        extra_files=extra_files)
