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
from . import answer, classify, multi_label, tag
from .intermediate import IntermediateTransfer, layer_map_for, parse_intermediate
from .student import check_student, student_config

__all__ = ["DISTILLERS", "Distiller", "check_augmentable", "check_options", "check_teacher", "distill", "distill_task"]


@dataclass(frozen=True)
class Distiller:
    """How one task family is distilled.

    head_tensors: tensor names (as the head class saves them) a fine-tuned teacher of the family holds;
        their absence means the head was never trained.
    task(family, teacher_dir, train_file, **options): the `FinetuneTask` of the student (options:
        output_dir, dev_file, unlabeled, layers, student, temperature, alpha, max_seq_length,
        eval_batch_size, cache_dir, labels_only, device; and when `augmentable`, augment, augment_seed,
        augment_mlm; for the INTERMEDIATE_FAMILIES, intermediate, layer_map, intermediate_weight).
    recipe: the defaults of the shared flags for `bertforge distill` on this family.
    options: the family's own `task` options (the CLI's flags of the same `dest`, e.g. the answer
        family's version and doc_stride); the CLI refuses them for a teacher of another family.
    recipe_for(config, options): the recipe for one teacher when it depends on it (SQuAD's per version).
    augmentable: whether `task` takes the augmentation options (augment, augment_seed, augment_mlm:
        `augment.augmented_transfer`'s copies of the training texts added to the transfer set).
    head_proves_training: whether a checkpoint whose config.json records no training (no finetuning_task,
        no problem_type) is a teacher when its `head_tensors` are in its weights: transformers saves a
        fine-tuned token-classification or question-answering model so (its heads' training records
        nothing in the config), while its sequence classifier records a problem_type on its first
        labelled step, so one without is a head never trained.
    """

    head_tensors: tuple[str, ...]
    task: Callable[..., FinetuneTask]
    recipe: dict[str, Any] = field(default_factory=dict)
    options: tuple[str, ...] = ()
    recipe_for: Callable[[BertConfig, dict[str, Any]], dict[str, Any]] | None = None

    def recipe_of(self, config: BertConfig, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """The shared flags' defaults for the teacher whose config this is."""
        return self.recipe_for(config, options or {}) if self.recipe_for is not None else dict(self.recipe)
    augmentable: bool = False
    head_proves_training: bool = False


DISTILLERS: dict[str, Distiller] = {
    "classify": Distiller(("classifier.weight", "classifier.bias"), classify.classify_distill_task,
                          dict(lr=5e-5, batch_size=32, max_seq_length=128, epochs=3.0), augmentable=True),
    # `bertforge finetune ner`'s recipe (the tag family's FinetuneCommand and ner_from_args)
    "tag": Distiller(("classifier.weight", "classifier.bias"), tag.tag_distill_task,
                     dict(lr=5e-5, batch_size=16, max_seq_length=128, epochs=3.0), augmentable=True,
                     head_proves_training=True),
    "answer": Distiller(("qa_outputs.weight", "qa_outputs.bias"), answer.answer_distill_task, answer.ANSWER_RECIPE,
                        options=("version", "doc_stride", "tune_threshold"), recipe_for=answer.answer_recipe,
                        head_proves_training=True),
    "multi-label": Distiller(("classifier.weight", "classifier.bias"), multi_label.multi_label_distill_task,
                             dict(lr=5e-5, batch_size=32, max_seq_length=128, epochs=3.0), augmentable=True),
}


def check_teacher(teacher_dir: str | os.PathLike) -> tuple[TaskFamily, Distiller, BertConfig]:
    """The teacher's family, its `Distiller` and config, from config.json and the weights file's header
    only (milliseconds). ValueError, one line: a teacher never fine-tuned (no finetuning_task nor
    problem_type in config.json and, for a family whose head's training records neither
    (`Distiller.head_proves_training`: transformers' tagger and QA model), no head tensors in its
    weights; or a head missing from its weights), or of a family not distilled yet."""
    directory = Path(resolve_model_dir(teacher_dir))
    values = checkpoint_config(directory)
    family = family_for_checkpoint(directory, default=None)
    if not values.get("finetuning_task") and not values.get("problem_type"):
        # the family then comes from the head (config.json `architectures`); its tensors must be there
        distiller = DISTILLERS.get(family.name) if family is not None else None
        if distiller is None or not distiller.head_proves_training or \
                not _has_tensors(directory, distiller.head_tensors):
            raise ValueError(f"--teacher {teacher_dir}: not a fine-tuned model (no finetuning_task or problem_type "
                             "in its config.json, nor a tagging or question-answering head in its weights): its "
                             "head is untrained; fine-tune it first (bertforge finetune ...)")
    name = family.name if family is not None else values.get("finetuning_task")
    if family is None or family.name not in DISTILLERS:
        raise ValueError(f"--teacher {teacher_dir}: distillation of the {name!r} family is not supported yet "
                         f"(supported: {', '.join(DISTILLERS)})")
    distiller = DISTILLERS[family.name]
    weights = weights_path(directory)
    names = _tensor_names(directory)
    missing = [name for name in distiller.head_tensors if name not in names]
    if missing:
        raise ValueError(f"--teacher {teacher_dir}: {weights} has no trained {family.name} head ({', '.join(missing)} "
                         "missing); fine-tune it first (bertforge finetune ...)")
    return family, distiller, BertConfig.from_pretrained(directory)


def _tensor_names(directory: Path) -> set[str]:
    """The tensor names in a checkpoint's weights file (its header only), without a "bert." prefix."""
    return {key[len("bert."):] if key.startswith("bert.") else key
            for key in read_tensor_shapes(weights_path(directory))}


def _has_tensors(directory: Path, tensors: Sequence[str]) -> bool:
    names = _tensor_names(directory)
    return all(name in names for name in tensors)


# The families whose task takes --intermediate (TinyBERT's terms), and --student-vocab (sentence-level outputs only).
INTERMEDIATE_FAMILIES = ("classify", "tag", "answer")
STUDENT_VOCAB_FAMILIES = ("classify",)


def check_options(teacher_dir: str | os.PathLike, family: TaskFamily, config: BertConfig, layers: int | None,
                  student: str | None, *, intermediate: str | None = None, layer_map: str | None = None,
                  student_vocab: bool = False) -> None:
    """The student and the options that depend on the family judged before anything loads (ValueError,
    one line): `student.check_student`; --student-vocab only for sentence-level outputs (the classify
    family: a per-token or span output would need an alignment between the two tokenizations);
    --intermediate (its kinds, --layer-map, the attention heads) for the families in
    INTERMEDIATE_FAMILIES, and not with --student-vocab (the two models' token positions differ)."""
    check_student(teacher_dir, config, layers, student, student_vocab)
    if student_vocab and family.name not in STUDENT_VOCAB_FAMILIES:
        raise ValueError(f"--student-vocab: not for a {family.name!r} teacher: its outputs are per token or span, and "
                         "the two tokenizations would need an alignment (only sentence-level outputs: "
                         f"{', '.join(STUDENT_VOCAB_FAMILIES)})")
    if layer_map is not None and intermediate is None:
        raise ValueError("--layer-map: give --intermediate hidden, attention or hidden,attention with it")
    if intermediate is None:
        return
    if family.name not in INTERMEDIATE_FAMILIES:
        raise ValueError(f"--intermediate: not supported for a {family.name!r} teacher yet (supported: "
                         f"{', '.join(INTERMEDIATE_FAMILIES)})")
    if student_vocab:
        raise ValueError("--intermediate with --student-vocab: the two models' tokens differ, so their hidden "
                         "states and attention maps do not pair position by position")
    kinds = parse_intermediate(intermediate)
    IntermediateTransfer(student_config(config, layers, student), config, kinds,
                         layer_map_for(config, layers, student, layer_map))


def check_augmentable(family: TaskFamily, distiller: Distiller, augment: int) -> None:
    """ValueError, one line: `--augment N` for a family whose transfer set is not augmented yet."""
    if augment and not distiller.augmentable:
        supported = ", ".join(name for name, d in DISTILLERS.items() if d.augmentable)
        raise ValueError(f"--augment: the {family.name} family's transfer set is not augmented yet "
                         f"(supported: {supported})")


def distill_task(teacher_dir: str | os.PathLike, train_file: str | os.PathLike, *, output_dir: str | os.PathLike,
                 layers: int | None = None, student: str | None = None, intermediate: str | None = None,
                 layer_map: str | None = None, intermediate_weight: float = 1.0, student_vocab: bool = False,
                 **options: Any) -> FinetuneTask:
    """The student's `FinetuneTask` for a teacher of any family in `DISTILLERS`; the teacher and the
    student are checked first (`check_teacher`, `check_options`), before any data is read.
    `intermediate` ("hidden", "attention" or "hidden,attention"), `layer_map` ("0,2,4"),
    `intermediate_weight` are the INTERMEDIATE_FAMILIES' (see `intermediate`), `student_vocab` the classify
    family's (see `classify`)."""
    teacher_dir = resolve_model_dir(teacher_dir)
    family, distiller, config = check_teacher(teacher_dir)
    if layers is not None and student is not None:
        raise ValueError("give --layers or --student, not both")
    check_options(teacher_dir, family, config, layers, student, intermediate=intermediate, layer_map=layer_map,
                  student_vocab=student_vocab)
    if intermediate is not None:
        options.update(intermediate=parse_intermediate(intermediate),
                       layer_map=layer_map_for(config, layers, student, layer_map),
                       intermediate_weight=intermediate_weight)
    if student_vocab:
        options["student_vocab"] = True
    check_augmentable(family, distiller, options.get("augment", 0))
    return distiller.task(family, teacher_dir, train_file, output_dir=output_dir, layers=layers, student=student,
                          **options)


def distill(teacher_dir: str | os.PathLike, train_file: str | os.PathLike, args: FinetuneArguments, *,
            lrs: Sequence[float] | None = None, seeds: Sequence[int] | None = None, **options: Any) -> dict[str, Any]:
    """Distil into `args.output_dir` (the engine's `finetune_grid`: one run, or a grid of learning rates /
    seeds); returns its results (eval_results.json, or the grid's summary)."""
    task = distill_task(teacher_dir, train_file, output_dir=args.output_dir, **options)
    return finetune_grid(task, args, lrs, seeds)
