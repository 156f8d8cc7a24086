"""`distill`: a fine-tuned teacher's task in a smaller student, on the shared fine-tuning engine.

The teacher's checkpoint says everything about the task: its family (`family_for_checkpoint`: the
`finetuning_task`, `problem_type` or head in its config.json), hence the data reader, the labels and
the head. The family's `distill` entry in the task registry (`tasks.registry.Distillation`) says how its
teachers are taken: what proves the head was trained, the recipe, its own options, what it supports
(--intermediate, --student-vocab, --augment) and its adaptor, which the general distiller
(`distiller.general_distill_task`) runs. `training.finetune`'s engine does the rest as for any
fine-tuning (precision, seeds, learning-rate grid, --resume, logs, the best student on dev kept in OUT
as a normal checkpoint of the teacher's family).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, Sequence

from .._files import check_not_in_use, check_writable
from ..modeling import BertConfig, BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification
from ..modeling.pretrained import read_tensor_shapes, resolve_model_dir, weights_path
from ..tasks.registry import TASKS, Distillation, TaskFamily, checkpoint_config, family_for_checkpoint
from ..training.finetune import FinetuneArguments, FinetuneTask, check_output_dir, finetune_grid, grid_runs
from .augment import check_augment
from .cache import default_cache_dir
from .distiller import Adaptor, DistillRun, general_distill_task
from .intermediate import IntermediateTransfer, layer_map_for, parse_intermediate
from .objectives import check_temperature
from .student import check_student, student_config

__all__ = ["adaptor_for", "check_augmentable", "check_options", "check_paths", "check_teacher", "distill",
           "distill_task", "distilled_families"]


def distilled_families(what: str | None = None) -> list[str]:
    """The names of the families `bertforge distill` takes (with `what`, those whose `Distillation` has that
    attribute true: "intermediate", "student_vocab", "augment")."""
    return [family.name for family in TASKS.values()
            if family.distill is not None and (what is None or getattr(family.distill, what))]


def adaptor_for(family: TaskFamily) -> type[Adaptor]:
    """The family's adaptor class, imported from its `Distillation.adaptor` path ("module:Class")."""
    module, _, name = family.distill.adaptor.partition(":")
    return getattr(importlib.import_module(module), name)


def check_teacher(teacher_dir: str | os.PathLike) -> tuple[TaskFamily, Distillation, BertConfig]:
    """The teacher's family, its `Distillation` and config, from config.json and the weights file's header
    only (milliseconds). ValueError, one line: a teacher never fine-tuned (no finetuning_task nor
    problem_type in config.json and, for a family whose head's training records neither
    (`Distillation.head_proves_training`: transformers' tagger and QA model), no head tensors in its
    weights; or a head missing from its weights), or of a family not distilled yet."""
    directory = Path(resolve_model_dir(teacher_dir))
    values = checkpoint_config(directory)
    family = family_for_checkpoint(directory, default=None)
    distillation = family.distill if family is not None else None
    if not values.get("finetuning_task") and not values.get("problem_type"):
        # the family then comes from the head (config.json `architectures`); its tensors must be there
        if distillation is None or not distillation.head_proves_training or \
                not _has_tensors(directory, distillation.head_tensors):
            raise ValueError(f"--teacher {teacher_dir}: not a fine-tuned model (no finetuning_task or problem_type "
                             "in its config.json, nor a tagging or question-answering head in its weights): its "
                             "head is untrained; fine-tune it first (bertforge finetune ...)")
    name = family.name if family is not None else values.get("finetuning_task")
    if distillation is None:
        raise ValueError(f"--teacher {teacher_dir}: distillation of the {name!r} family is not supported yet "
                         f"(supported: {', '.join(distilled_families())})")
    weights = weights_path(directory)
    names = _tensor_names(directory)
    missing = [name for name in distillation.head_tensors if name not in names]
    if missing:
        raise ValueError(f"--teacher {teacher_dir}: {weights} has no trained {family.name} head ({', '.join(missing)} "
                         "missing); fine-tune it first (bertforge finetune ...)")
    return family, distillation, BertConfig.from_pretrained(directory)


def _tensor_names(directory: Path) -> set[str]:
    """The tensor names in a checkpoint's weights file (its header only), without a "bert." prefix."""
    return {key[len("bert."):] if key.startswith("bert.") else key
            for key in read_tensor_shapes(weights_path(directory))}


def _has_tensors(directory: Path, tensors: Sequence[str]) -> bool:
    names = _tensor_names(directory)
    return all(name in names for name in tensors)


def check_options(teacher_dir: str | os.PathLike, family: TaskFamily, config: BertConfig, layers: int | None,
                  student: str | None, *, intermediate: str | None = None, layer_map: str | None = None,
                  student_vocab: bool = False) -> None:
    """The student and the options that depend on the family judged before anything loads (ValueError,
    one line): `student.check_student`; --student-vocab only for a family whose `Distillation` takes it
    (sentence-level outputs: a per-token or span output would need an alignment between the two
    tokenizations; the refusal says which holds for the family); --intermediate (its kinds, --layer-map, the attention heads) for a family that takes
    it, and not with --student-vocab (the two models' token positions differ)."""
    check_student(teacher_dir, config, layers, student, student_vocab)
    if student_vocab and not family.distill.student_vocab:
        raise ValueError(f"--student-vocab: not for a {family.name!r} teacher: {_why_one_vocabulary(family)} "
                         f"(supported: {', '.join(distilled_families('student_vocab'))})")
    if layer_map is not None and intermediate is None:
        raise ValueError("--layer-map: give --intermediate hidden, attention or hidden,attention with it")
    if intermediate is None:
        return
    if not family.distill.intermediate:
        raise ValueError(f"--intermediate: not supported for a {family.name!r} teacher yet (supported: "
                         f"{', '.join(distilled_families('intermediate'))})")
    if student_vocab:
        raise ValueError("--intermediate with --student-vocab: the two models' tokens differ, so their hidden "
                         "states and attention maps do not pair position by position")
    kinds = parse_intermediate(intermediate)
    IntermediateTransfer(student_config(config, layers, student), config, kinds,
                         layer_map_for(config, layers, student, layer_map, family.distill.keep_last_layer))


def _why_one_vocabulary(family: TaskFamily) -> str:
    """Why a family's distillation needs the teacher's vocabulary, by the granularity of its head's outputs:
    per token or span (a tagger, a reader: the two tokenizations would need an alignment), or per sentence
    (a multi-label classifier: possible, but its distiller reads one tokenization, the teacher's)."""
    if issubclass(family.head, (BertForTokenClassification, BertForQuestionAnswering)):
        return "its outputs are per token or span, and the two tokenizations would need an alignment"
    if issubclass(family.head, BertForSequenceClassification):
        return ("its outputs are per sentence, but its distiller reads each text in one tokenization, the "
                "teacher's, for both models; give a --student with the teacher's vocabulary")
    return "its distiller reads each text in one tokenization, the teacher's, for both models"


def check_augmentable(family: TaskFamily, augment: int) -> None:
    """ValueError, one line: `--augment N` for a family whose transfer set is not augmented yet."""
    if augment and not family.distill.augment:
        raise ValueError(f"--augment: the {family.name} family's transfer set is not augmented yet "
                         f"(supported: {', '.join(distilled_families('augment'))})")


def _within(path: Path, directory: Path) -> bool:
    """Whether `path` is `directory` or lies under it (both resolved: symlinks followed)."""
    return path == directory or directory in path.parents


def check_paths(teacher_dir: str | os.PathLike, output_dir: str | os.PathLike, cache_dir: str | os.PathLike | None,
                student: str | None = None, augment_mlm: str | os.PathLike | None = None) -> Path:
    """The directories the run writes judged before any work (ValueError, one line naming the flag); returns
    the cache directory (`cache_dir`, else OUT/teacher_outputs).

    The models the user gives (--teacher, a --student checkpoint, --augment-mlm) are inputs and are never
    written: neither --output-dir nor the cache (--cache-dir, or OUT/teacher_outputs) may be one of them or
    lie inside one. Both must be places a directory can be created and written (`check_writable`: not
    under a file, not on a read-only or pseudo file system, names within the file system's limits), so
    that a refusal comes before the teacher's pass, not after it."""
    output = Path(output_dir)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir(teacher_dir, output_dir)
    cache_flag = "--cache-dir" if cache_dir is not None else f"--output-dir (its {cache.name}/, the teacher's outputs)"
    inputs = [("--teacher", "the teacher's", Path(teacher_dir))]
    if student is not None and Path(student).is_dir():
        inputs.append(("--student", "the student checkpoint's", Path(student)))
    if augment_mlm is not None:
        inputs.append(("--augment-mlm", "the masked language model's", Path(augment_mlm)))
    written = (("--output-dir", output, "another --output-dir"),
               (cache_flag, cache, "another --cache-dir" if cache_dir is not None else "another --output-dir"))
    for flag, path, remedy in written:
        for given, whose, model in inputs:
            if _within(path.resolve(), model.resolve()):
                where = "is" if path.resolve() == model.resolve() else "is inside"
                raise ValueError(f"{flag} {path} {where} {whose} directory ({given} {model}), an input that is "
                                 f"never written to; give {remedy}")
    check_writable(output, "--output-dir", directory=True)
    check_writable(cache, cache_flag, directory=True)
    return cache


def distill_task(teacher_dir: str | os.PathLike, train_file: str | os.PathLike, *, output_dir: str | os.PathLike,
                 layers: int | None = None, student: str | None = None, intermediate: str | None = None,
                 layer_map: str | None = None, intermediate_weight: float = 1.0, student_vocab: bool = False,
                 dev_file: str | os.PathLike | None = None, unlabeled: Sequence[str | os.PathLike] = (),
                 temperature: float = 2.0, alpha: float = 0.5, max_seq_length: int | None = None,
                 eval_batch_size: int = 128, cache_dir: str | os.PathLike | None = None, labels_only: bool = False,
                 device: str | None = None, augment: int = 0, augment_seed: int = 0,
                 augment_mlm: str | os.PathLike | None = None, **options: Any) -> FinetuneTask:
    """The student's `FinetuneTask` for a teacher of any distilled family; the teacher and the student are
    checked first (`check_teacher`, `check_options`), before any data is read. `intermediate` ("hidden",
    "attention" or "hidden,attention"), `layer_map` ("0,2,4"), `intermediate_weight`: TinyBERT's terms;
    `student_vocab`: a --student checkpoint with its own vocabulary; `augment`, `augment_seed`,
    `augment_mlm`: augmented transfer text; `options`: the family's own (`Distillation.options`).
    `max_seq_length` None: the family's default (the answer family: the teacher's)."""
    teacher_dir = Path(resolve_model_dir(teacher_dir))
    family, distillation, config = check_teacher(teacher_dir)
    if layers is not None and student is not None:
        raise ValueError("give --layers or --student, not both")
    check_options(teacher_dir, family, config, layers, student, intermediate=intermediate, layer_map=layer_map,
                  student_vocab=student_vocab)
    check_augmentable(family, augment)
    check_augment(augment)  # the copies per text; their total when the training file is read (`augmented_transfer`)
    check_temperature(temperature)
    unknown = sorted(set(options) - set(distillation.options))
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not an option of the {family.name} family's distillation "
                         f"(its own: {', '.join(distillation.options) or 'none'})")
    cache = check_paths(teacher_dir, output_dir, cache_dir, student, augment_mlm)  # before the data and the teacher
    run = DistillRun(
        family=family, teacher_dir=teacher_dir, config=config, train_file=train_file, output_dir=output_dir,
        cache_dir=cache,
        dev_file=dev_file, unlabeled=unlabeled, layers=layers, student=student, temperature=temperature,
        alpha=alpha, max_seq_length=max_seq_length, eval_batch_size=eval_batch_size, labels_only=labels_only,
        device=device, intermediate=parse_intermediate(intermediate) if intermediate is not None else (),
        layer_map=layer_map_for(config, layers, student, layer_map, family.distill.keep_last_layer)
        if intermediate is not None else None,
        intermediate_weight=intermediate_weight, student_vocab=student_vocab, augment=augment,
        augment_seed=augment_seed, augment_mlm=augment_mlm, options=dict(options))
    return general_distill_task(run, adaptor_for(family))


def distill(teacher_dir: str | os.PathLike, train_file: str | os.PathLike, args: FinetuneArguments, *,
            lrs: Sequence[float] | None = None, seeds: Sequence[int] | None = None, **options: Any) -> dict[str, Any]:
    """Distil into `args.output_dir` (the engine's `finetune_grid`: one run, or a grid of learning rates /
    seeds); returns its results (eval_results.json, or the grid's summary). An OUT that another run holds now,
    or that already holds a run (without `args.resume`), is refused before the teacher's pass
    (`check_not_in_use`, `check_output_dir`)."""
    check_not_in_use(args.output_dir)
    check_output_dir(args.output_dir, args.resume, grid_runs(args.lr, args.seed, lrs, seeds))
    task = distill_task(teacher_dir, train_file, output_dir=args.output_dir, **options)
    return finetune_grid(task, args, lrs, seeds)
