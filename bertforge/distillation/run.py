"""`distill`: a fine-tuned teacher's task in a smaller student, on the shared fine-tuning engine.

The teacher's checkpoint says everything about the task: its family (`family_for_checkpoint`: the
`finetuning_task`, `problem_type` or head in its config.json), hence the data reader, the labels and
the head. A family is distilled by its `Distiller` in `DISTILLERS`: what proves the teacher's head was
trained (`head_tensors`), and `task(...)`, the `FinetuneTask` whose step is the distillation objective.
`training.finetune`'s engine does the rest as for any fine-tuning (precision, seeds, learning-rate grid,
--resume, logs, the best student on dev kept in OUT as a normal checkpoint of the teacher's family).

Adding a family is a module here with its `task` builder (its transfer features, the teacher's outputs
through `cache.teacher_outputs`, a step from `objectives`) and one `DISTILLERS` entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..modeling import BertConfig
from ..modeling.pretrained import read_tensor_shapes, resolve_model_dir, weights_path
from ..tasks.registry import TaskFamily, checkpoint_config, family_for_checkpoint
from ..training.finetune import FinetuneArguments, FinetuneTask, finetune_grid
from . import classify, multi_label
from .student import check_student

__all__ = ["DISTILLERS", "Distiller", "check_augmentable", "check_teacher", "distill", "distill_task"]


@dataclass(frozen=True)
class Distiller:
    """How one task family is distilled.

    head_tensors: tensor names (as the head class saves them) a fine-tuned teacher of the family holds;
        their absence means the head was never trained.
    task(family, teacher_dir, train_file, **options): the `FinetuneTask` of the student (options:
        output_dir, dev_file, unlabeled, layers, student, temperature, alpha, max_seq_length,
        eval_batch_size, cache_dir, labels_only, device; and when `augmentable`, augment, augment_seed,
        augment_mlm).
    recipe: the defaults of the shared flags for `bertforge distill` on this family.
    augmentable: whether `task` takes the augmentation options (augment, augment_seed, augment_mlm:
        `augment.augmented_transfer`'s copies of the training texts added to the transfer set).
    """

    head_tensors: tuple[str, ...]
    task: Callable[..., FinetuneTask]
    recipe: dict[str, Any] = field(default_factory=dict)
    augmentable: bool = False


DISTILLERS: dict[str, Distiller] = {
    "classify": Distiller(("classifier.weight", "classifier.bias"), classify.classify_distill_task,
                          dict(lr=5e-5, batch_size=32, max_seq_length=128, epochs=3.0), augmentable=True),
    "multi-label": Distiller(("classifier.weight", "classifier.bias"), multi_label.multi_label_distill_task,
                             dict(lr=5e-5, batch_size=32, max_seq_length=128, epochs=3.0), augmentable=True),
}


def check_teacher(teacher_dir: str | os.PathLike) -> tuple[TaskFamily, Distiller, BertConfig]:
    """The teacher's family, its `Distiller` and config, from config.json and the weights file's header
    only (milliseconds). ValueError, one line: a teacher never fine-tuned (no finetuning_task nor
    problem_type in config.json, or no head tensors in its weights), or of a family not distilled yet."""
    directory = Path(resolve_model_dir(teacher_dir))
    values = checkpoint_config(directory)
    if not values.get("finetuning_task") and not values.get("problem_type"):
        raise ValueError(f"--teacher {teacher_dir}: not a fine-tuned model (no finetuning_task or problem_type in "
                         "its config.json): its head is untrained; fine-tune it first (bertforge finetune ...)")
    family = family_for_checkpoint(directory, default=None)
    name = family.name if family is not None else values.get("finetuning_task")
    if family is None or family.name not in DISTILLERS:
        raise ValueError(f"--teacher {teacher_dir}: distillation of the {name!r} family is not supported yet "
                         f"(supported: {', '.join(DISTILLERS)})")
    distiller = DISTILLERS[family.name]
    weights = weights_path(directory)
    names = {key[len("bert."):] if key.startswith("bert.") else key for key in read_tensor_shapes(weights)}
    missing = [name for name in distiller.head_tensors if name not in names]
    if missing:
        raise ValueError(f"--teacher {teacher_dir}: {weights} has no trained {family.name} head ({', '.join(missing)} "
                         "missing); fine-tune it first (bertforge finetune ...)")
    return family, distiller, BertConfig.from_pretrained(directory)


def check_augmentable(family: TaskFamily, distiller: Distiller, augment: int) -> None:
    """ValueError, one line: `--augment N` for a family whose transfer set is not augmented yet."""
    if augment and not distiller.augmentable:
        supported = ", ".join(name for name, d in DISTILLERS.items() if d.augmentable)
        raise ValueError(f"--augment: the {family.name} family's transfer set is not augmented yet "
                         f"(supported: {supported})")


def distill_task(teacher_dir: str | os.PathLike, train_file: str | os.PathLike, *, output_dir: str | os.PathLike,
                 layers: int | None = None, student: str | None = None, **options: Any) -> FinetuneTask:
    """The student's `FinetuneTask` for a teacher of any family in `DISTILLERS`; the teacher and the
    student are checked first (`check_teacher`, `student.check_student`), before any data is read."""
    teacher_dir = resolve_model_dir(teacher_dir)
    family, distiller, config = check_teacher(teacher_dir)
    if layers is not None and student is not None:
        raise ValueError("give --layers or --student, not both")
    check_student(teacher_dir, config, layers, student)
    check_augmentable(family, distiller, options.get("augment", 0))
    return distiller.task(family, teacher_dir, train_file, output_dir=output_dir, layers=layers, student=student,
                          **options)


def distill(teacher_dir: str | os.PathLike, train_file: str | os.PathLike, args: FinetuneArguments, *,
            lrs: Sequence[float] | None = None, seeds: Sequence[int] | None = None, **options: Any) -> dict[str, Any]:
    """Distil into `args.output_dir` (the engine's `finetune_grid`: one run, or a grid of learning rates /
    seeds); returns its results (eval_results.json, or the grid's summary)."""
    task = distill_task(teacher_dir, train_file, output_dir=args.output_dir, **options)
    return finetune_grid(task, args, lrs, seeds)
