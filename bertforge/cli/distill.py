"""`bertforge distill`: a fine-tuned model's task in a smaller student (`bertforge.distillation`).

The teacher's checkpoint names the task (its family, labels and data format, through the task
registry); the student is the teacher with fewer layers (--layers N, DistilBERT's initialisation), a
preset size, or a checkpoint with the teacher's vocabulary (--student). The shared fine-tuning flags
(--lr, --epochs, --seeds, --lr-grid, --precision, --resume, ...) are `finetune`'s, at the distiller's
recipe.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..distillation import DISTILLERS, distill_task
from ..distillation.augment import check_masked_lm
from ..distillation.run import check_augmentable, check_teacher
from ..distillation.student import check_student
from ..modeling.pretrained import resolve_model_dir
from ..training import finetune as engine  # engine.finetune_grid: looked up per run, as `finetune` does
from ._common import expand, report_finetune
from .finetune import _add_finetune_flags, _arguments, _grid

RECIPE = DISTILLERS["classify"].recipe  # every family distilled so far shares it


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("distill", help="distil a fine-tuned model into a smaller student (DistilBERT-style)")
    p.add_argument("--teacher", required=True, help="a fine-tuned checkpoint (a `bertforge finetune` output "
                   "directory, or transformers'): its task, labels and data format are the student's")
    student = p.add_mutually_exclusive_group()
    student.add_argument("--layers", type=int, help="the student: the teacher with N layers, initialised from "
                         "teacher layers floor(i*L/N) (every other layer for N = L/2) (default: half the layers, "
                         "rounded up)")
    student.add_argument("--student", help="the student: a preset (tiny, mini, small, medium, base, large: random "
                         "weights) or a checkpoint directory with the teacher's vocabulary")
    p.add_argument("--train-file", required=True, help="the teacher's training data (its format: a GLUE task's "
                   "TSV, or CSV/TSV/JSONL with text, [text_pair], [label]); rows without a label are transfer-only")
    p.add_argument("--dev-file", help="selects the best student (default: its agreement with the teacher on "
                   "--train-file)")
    p.add_argument("--unlabeled", action="append", default=[], metavar="GLOB",
                   help="more transfer text: one text per line (text<TAB>text_pair for a pair); repeatable")
    p.add_argument("--temperature", type=float, default=2.0, help="softmax temperature T of the soft targets "
                   "(the KL term is scaled by T^2)")
    p.add_argument("--alpha", type=float, default=0.5, help="weight of the hard-label loss on labelled examples "
                   "(0: soft targets only)")
    p.add_argument("--labels-only", action="store_true", help="the control: the same student trained on the labels "
                   "alone (no soft targets), to measure what distillation adds")
    p.add_argument("--augment", type=int, default=0, metavar="N", help="add N augmented copies of each training "
                   "text to the transfer set (soft targets only): words masked (p 0.1) or replaced (p 0.1), then a "
                   "1-5 word window kept (p 0.25), as Tang et al. 2019 (default: 0, none)")
    p.add_argument("--augment-seed", type=int, default=0, help="the augmentation's seed, apart from --seed: one "
                   "augmented set (and one cache of the teacher's outputs) for every student (default: 0)")
    p.add_argument("--augment-mlm", metavar="DIR", help="replace words as TinyBERT does: a one-piece word by one of "
                   "the top 15 predictions of this masked language model (a checkpoint with an MLM head; default: "
                   "a word drawn from the training text)")
    p.add_argument("--cache-dir", help="where the teacher's outputs are kept (default: OUT/teacher_outputs; name "
                   "one directory for several students of one teacher to compute them once)")
    _add_finetune_flags(p, lr=RECIPE["lr"], batch_size=RECIPE["batch_size"], max_seq_length=None, model=False)
    p.set_defaults(func=run, check=check, recipe_epochs=RECIPE["epochs"])


def check(args: argparse.Namespace) -> None:
    """The flags and both models judged before any data is read or a model loads."""
    if not (math.isfinite(args.temperature) and args.temperature > 0):
        raise ValueError(f"--temperature must be a positive number, got {args.temperature:g}")
    if not (math.isfinite(args.alpha) and args.alpha >= 0):
        raise ValueError(f"--alpha must be 0 or more, got {args.alpha:g}")
    if args.augment < 0:
        raise ValueError(f"--augment must be 0 or more, got {args.augment}")
    if args.augment and args.labels_only:
        raise ValueError("--augment adds unlabelled text, which --labels-only cannot learn from; give one of them")
    if args.augment_mlm is not None:
        if not args.augment:
            raise ValueError("--augment-mlm needs --augment N (the number of augmented copies of each text)")
        args.augment_mlm = str(resolve_model_dir(args.augment_mlm))
        check_masked_lm(args.augment_mlm)
    args.teacher = str(resolve_model_dir(args.teacher))
    if Path(args.output_dir).resolve() == Path(args.teacher).resolve():
        raise ValueError(f"--output-dir {args.output_dir} is the teacher's directory; the student needs its own")
    family, distiller, config = check_teacher(args.teacher)
    check_augmentable(family, distiller, args.augment)
    check_student(args.teacher, config, args.layers, args.student)
    if args.max_seq_length is None:  # the recipe's, or fewer for a teacher with fewer positions
        args.max_seq_length = min(RECIPE["max_seq_length"], config.max_position_embeddings)
    if args.max_seq_length > config.max_position_embeddings:
        raise ValueError(f"--max-seq-length {args.max_seq_length} exceeds the {config.max_position_embeddings} "
                         f"positions of {args.teacher}")
    for flag, path in (("--train-file", args.train_file), ("--dev-file", args.dev_file)):
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"{flag} {path}: no such file")
    args.unlabeled_files = expand(args.unlabeled)


def run(args: argparse.Namespace) -> None:
    augmentation = dict(augment=args.augment, augment_seed=args.augment_seed, augment_mlm=args.augment_mlm) \
        if args.augment else {}  # only for the families that take them (`Distiller.augmentable`)
    task = distill_task(args.teacher, args.train_file, output_dir=args.output_dir, layers=args.layers,
                        student=args.student, dev_file=args.dev_file, unlabeled=args.unlabeled_files,
                        temperature=args.temperature, alpha=args.alpha, max_seq_length=args.max_seq_length,
                        eval_batch_size=args.eval_batch_size, cache_dir=args.cache_dir, labels_only=args.labels_only,
                        device=args.device, **augmentation)
    results = engine.finetune_grid(task, _arguments(args), *_grid(args))
    report_finetune(results, args.output_dir)
