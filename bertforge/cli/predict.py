"""`bertforge predict`: a fine-tuned model's predictions for a file (or one SQuAD question).

`--task` names the task, as everywhere on the command line (by its name or an alias; default: the one
the model was fine-tuned for): it picks the family, whose `predict` (`bertforge.tasks.registry`) reads
the input and writes the output; a GLUE task name picks its labels and submission format. The flags
every family shares are here; each family adds its own (a flag several define is added once).
"""

from __future__ import annotations

import argparse
from typing import Any

from .._checks import check_output
from ..tasks.registry import TASKS, PredictCommand
from ._common import task_family

# The family whose `predict` runs for a model that names none with one (a bare encoder, an unknown
# finetuning_task: the classifier reports what is missing).
DEFAULT_FAMILY = "classify"


class _AddOnce:
    """A parser's `add_argument` for the families' flags: a flag one family added already is not added
    again; the later family's help is appended to it (--doc-stride: classification's windows and SQuAD's)."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action | None:
        existing = next((a for a in self.parser._actions if set(names) & set(a.option_strings)), None)
        if existing is None:
            return self.parser.add_argument(*names, **kwargs)
        if kwargs.get("help") and existing.help and kwargs["help"] not in existing.help:
            existing.help = f"{existing.help}; {kwargs['help']}"
        return existing


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("predict", help="predictions of a fine-tuned model for a file")
    p.add_argument("--model", required=True, help="a `bertforge finetune` output directory")
    p.add_argument("--input", help="GLUE test.tsv (or dev-shaped), or CSV/TSV/JSONL with text; SQuAD JSON; SWAG CSV")
    p.add_argument("--output", help="TSV: index, prediction (GLUE submission format); SQuAD: predictions JSON")
    p.add_argument("--task", help="the task, by name or alias: classify or a GLUE task (mrpc, ...: its labels and "
                   "submission format), answer or squad, tag or ner, multiple-choice (default: the model's, "
                   "finetuning_task in config.json)")
    p.add_argument("--max-seq-length", type=int, help="default 128; SQuAD: the model's (384)")
    once = _AddOnce(p)
    for family in TASKS.values():  # the registry as it is now: a family registered at run time included
        if family.predict is not None and family.predict.add_flags is not None:
            family.predict.add_flags(once)  # type: ignore[arg-type]
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output (never the --input)")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16", "int8"),
                   help="run the model unpadded in this precision (optimize_for_inference): fp32 exact, bf16 "
                        "(CPUs with AVX-512 BF16/AMX, GPUs) or int8 (CPU) faster at a small cost in accuracy "
                        "(default: as saved, padded batches)")
    p.set_defaults(func=run)


def predict_command(args: argparse.Namespace) -> PredictCommand:
    """The `predict` of the family asked for: a family whose `selected_by` flag is given, else --task or the
    model's (`task_family`), else the default family's."""
    for family in TASKS.values():
        if family.predict is not None and any(getattr(args, flag, None) is not None
                                              for flag in family.predict.selected_by):
            return family.predict
    name = task_family(args.task, args.model)
    family = TASKS.get(name) if name is not None else None
    if family is None or family.predict is None:
        family = TASKS[DEFAULT_FAMILY]
    return family.predict  # type: ignore[return-value]


def run(args: argparse.Namespace) -> None:
    command = predict_command(args)
    if not command.own_files:
        if not args.input or not args.output:
            raise ValueError("--input and --output are required (or --question and --context for a SQuAD model)")
        check_output(args.output, [args.input], args.overwrite)
    command.run(args)
