"""`bertforge distill`: a fine-tuned model's task in a smaller student (`bertforge.distillation`).

The teacher's checkpoint names the task (its family, labels and data format, through the task
registry); the student is the teacher with fewer layers (--layers N, DistilBERT's initialisation), a
preset size, or a checkpoint with the teacher's vocabulary (--student; its own with --student-vocab).
--intermediate adds TinyBERT's hidden-state / attention-map terms (`distillation.intermediate`). The
shared fine-tuning flags (--lr, --epochs, --seeds, --lr-grid, --precision, --resume, ...) are
`finetune`'s, at the recipe of the teacher's family (its `Distillation.recipe` in the task registry:
`settings` gives the run's values for the flags not given; the parsed flags are never overwritten).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from .._files import check_not_in_use
from ..distillation import distill_task
from ..distillation.augment import MAX_AUGMENT, MAX_AUGMENTED_TEXTS, check_augment, check_masked_lm
from ..distillation.objectives import TEMPERATURE_RANGE, check_temperature
from ..distillation.run import check_augmentable, check_options, check_paths, check_teacher
from ..modeling import BertConfig
from ..modeling.pretrained import resolve_model_dir
from ..tasks.registry import Distillation
from ..training import finetune as engine  # engine.finetune_grid: looked up per run, as `finetune` does
from ._common import expand, report_finetune
from .finetune import _add_finetune_flags, _arguments, _grid


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("distill", help="distil a fine-tuned model into a smaller student (DistilBERT-style)")
    p.add_argument("--teacher", required=True, help="a fine-tuned checkpoint (a `bertforge finetune` output "
                   "directory, or transformers'): its task, labels and data format are the student's")
    student = p.add_mutually_exclusive_group()
    student.add_argument("--layers", type=int, help="the student: the teacher with N layers, initialised from "
                         "teacher layers floor(i*L/N) (every other layer for N = L/2; a sentence-embedding "
                         "teacher's student keeps the first and the last layer, the rest evenly between) "
                         "(default: half the layers, rounded up)")
    student.add_argument("--student", help="the student: a preset (tiny, mini, small, medium, base, large: random "
                         "weights) or a checkpoint directory with the teacher's vocabulary")
    p.add_argument("--train-file", required=True, help="the teacher's training data (its format: a GLUE task's "
                   "TSV, or CSV/TSV/JSONL with text, [text_pair], [label]; a tagger's: CoNLL columns; a SQuAD "
                   "teacher's: SQuAD JSON); rows without a label are transfer-only")
    p.add_argument("--dev-file", help="selects the best student (default: its agreement with the teacher on "
                   "--train-file)")
    p.add_argument("--unlabeled", action="append", default=[], metavar="GLOB",
                   help="more transfer text: one text per line (text<TAB>text_pair for a pair; a tagger: one "
                   "sentence per line, words split on whitespace); repeatable")
    p.add_argument("--temperature", type=float, default=2.0, help="softmax temperature T of the soft targets "
                   f"(the KL term is scaled by T^2), from {TEMPERATURE_RANGE[0]:g} to {TEMPERATURE_RANGE[1]:g} "
                   "(default: 2)")
    p.add_argument("--alpha", type=float, default=0.5, help="weight of the hard-label loss on labelled examples "
                   "(0: soft targets only)")
    p.add_argument("--labels-only", action="store_true", help="the control: the same student trained on the labels "
                   "alone (no soft targets), to measure what distillation adds")
    p.add_argument("--intermediate", metavar="KINDS", help="TinyBERT's intermediate-layer transfer too: hidden, "
                   "attention or hidden,attention (the teacher then runs beside the student on each batch)")
    p.add_argument("--layer-map", metavar="M0,M1,...", help="with --intermediate: the teacher layer (0-based) of "
                   "each student layer (default: the layers a --layers student started from, else TinyBERT's "
                   "uniform map)")
    p.add_argument("--intermediate-weight", type=float, default=1.0, help="weight of the --intermediate terms")
    p.add_argument("--student-vocab", action="store_true", help="a --student checkpoint with its own vocabulary: "
                   "it reads its own tokenization of each example (classify teachers: sentence-level outputs)")
    p.add_argument("--augment", type=int, default=0, metavar="N", help="add N augmented copies of each training "
                   "text to the transfer set (soft targets only): words masked (p 0.1) or replaced (p 0.1), then a "
                   f"1-5 word window kept (p 0.25), as Tang et al. 2019; N at most {MAX_AUGMENT}, and at most "
                   f"{MAX_AUGMENTED_TEXTS:,} augmented texts in all (the transfer set is held in memory) "
                   "(default: 0, none)")
    p.add_argument("--augment-seed", type=int, default=0, help="the augmentation's seed, apart from --seed: one "
                   "augmented set (and one cache of the teacher's outputs) for every student (default: 0)")
    p.add_argument("--augment-mlm", metavar="DIR", help="replace words as TinyBERT does: a one-piece word by one of "
                   "the top 15 predictions of this masked language model (a checkpoint with an MLM head; default: "
                   "a word drawn from the training text)")
    p.add_argument("--cache-dir", help="where the teacher's outputs are kept (default: OUT/teacher_outputs; name "
                   "one directory for several students of one teacher to compute them once)")
    # the answer family's own flags (a SQuAD teacher): its Distillation.options
    p.add_argument("--version", choices=("1.1", "2.0"), help="a SQuAD teacher whose config.json does not say its "
                   "version: 2.0 has unanswerable questions (default: the teacher's, else 1.1)")
    p.add_argument("--doc-stride", type=int, help="a SQuAD teacher: tokens between the starts of passage windows "
                   "(default: the teacher's, else 128)")
    p.add_argument("--tune-threshold", action="store_true", default=None, help="a SQuAD 2.0 teacher: choose the "
                   "student's own no-answer threshold on --dev-file (saved with it; default: the teacher's)")
    _add_finetune_flags(p, lr=None, batch_size=None, max_seq_length=None, model=False)
    p.set_defaults(func=run, check=check)

# Every family's own flags (their `dest`) with the flag's name: given for a teacher of another family, refused.
FAMILY_FLAGS = {"version": "--version", "doc_stride": "--doc-stride", "tune_threshold": "--tune-threshold"}


def check(args: argparse.Namespace) -> None:
    """The flags and both models judged before any data is read or a model loads."""
    check_temperature(args.temperature)
    if not (math.isfinite(args.alpha) and args.alpha >= 0):
        raise ValueError(f"--alpha must be 0 or more, got {args.alpha:g}")
    check_augment(args.augment)  # its total (copies × training texts) once the training file is read
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
    # nothing written into the user's models, nor where nothing can be written (`check_paths`)
    check_paths(args.teacher, args.output_dir, args.cache_dir, args.student, args.augment_mlm)
    if not (math.isfinite(args.intermediate_weight) and args.intermediate_weight >= 0):
        raise ValueError(f"--intermediate-weight must be 0 or more, got {args.intermediate_weight:g}")
    if args.labels_only and args.intermediate is not None:
        raise ValueError("--labels-only with --intermediate: the control is trained on the labels alone")
    family, distillation, config = check_teacher(args.teacher)
    check_augmentable(family, args.augment)
    check_options(args.teacher, family, config, args.layers, args.student, intermediate=args.intermediate,
                  layer_map=args.layer_map, student_vocab=args.student_vocab)
    for dest, flag in FAMILY_FLAGS.items():
        if getattr(args, dest, None) is not None and dest not in distillation.options:
            raise ValueError(f"{flag} applies to another family's teacher; {args.teacher} is a {family.name} model")
    args.family_options = {dest: getattr(args, dest, None) for dest in distillation.options}
    recipe = settings(args, distillation, config)  # judged now (SQuAD: --version agrees; --max-seq-length fits)
    check_not_in_use(args.output_dir)  # OUT held by a running command, refused before the teacher's pass too
    lrs, seeds = _grid(args)  # an OUT holding a run (without --resume) is refused before the teacher's pass
    engine.check_output_dir(args.output_dir, args.resume, engine.grid_runs(
        args.lr if args.lr is not None else recipe["lr"], args.seed, lrs, seeds))
    for flag, path in (("--train-file", args.train_file), ("--dev-file", args.dev_file)):
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"{flag} {path}: no such file")
    args.unlabeled_files = expand(args.unlabeled)


def settings(args: argparse.Namespace, distillation: Distillation, config: BertConfig) -> dict[str, Any]:
    """The shared settings of the run: the flags given, else the teacher's family's recipe (SQuAD: per
    version; --max-seq-length: the recipe's, or fewer for a teacher with fewer positions). ValueError for a
    --max-seq-length beyond the teacher's positions."""
    recipe = distillation.recipe_of(config, args.family_options)
    max_seq_length = args.max_seq_length if args.max_seq_length is not None else \
        min(recipe["max_seq_length"], config.max_position_embeddings)
    if max_seq_length > config.max_position_embeddings:
        raise ValueError(f"--max-seq-length {max_seq_length} exceeds the {config.max_position_embeddings} "
                         f"positions of {args.teacher}")
    return dict(recipe, max_seq_length=max_seq_length)


def _transfer_options(args: argparse.Namespace) -> dict:
    """--intermediate, --layer-map, --intermediate-weight and --student-vocab, where given."""
    options = {}
    if args.intermediate is not None:
        options.update(intermediate=args.intermediate, layer_map=args.layer_map,
                       intermediate_weight=args.intermediate_weight)
    if args.student_vocab:
        options["student_vocab"] = True
    return options


def run(args: argparse.Namespace) -> None:
    _, distillation, config = check_teacher(args.teacher)  # config.json and the weights' header: milliseconds
    recipe = settings(args, distillation, config)
    augmentation = dict(augment=args.augment, augment_seed=args.augment_seed, augment_mlm=args.augment_mlm) \
        if args.augment else {}  # only for the families that take them (`Distillation.augment`)
    task = distill_task(args.teacher, args.train_file, output_dir=args.output_dir, layers=args.layers,
                        student=args.student, dev_file=args.dev_file, unlabeled=args.unlabeled_files,
                        temperature=args.temperature, alpha=args.alpha, max_seq_length=recipe["max_seq_length"],
                        eval_batch_size=args.eval_batch_size, cache_dir=args.cache_dir, labels_only=args.labels_only,
                        device=args.device, **args.family_options, **_transfer_options(args), **augmentation)
    results = engine.finetune_grid(task, _arguments(args, recipe), *_grid(args))
    report_finetune(results, args.output_dir)
