"""`bertforge finetune TASK`: fine-tune on GLUE, your own classification data, SWAG-style multiple choice,
SQuAD, CoNLL NER, or any task a family in the task registry declares (`bertforge.tasks.registry`: each
`FinetuneCommand` is one sub-command). The shared flags are FinetuneArguments fields
(bertforge.training.settings); each command's recipe changes only their defaults (learning rate, epochs,
batch size, sequence length)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..tasks.registry import FinetuneCommand, finetune_commands
from ..training import finetune as engine  # engine.finetune_grid: looked up per run, so a test can stand in for it
from ..training.finetune import FinetuneArguments
from ._common import report_finetune
from .flags import add_settings_flags, settings_from_args

# The FinetuneArguments fields every task takes as flags, in --help's order (after --lr, --lr-grid, --seeds).
SHARED_FLAGS = ("epochs", "batch_size", "grad_accum", "max_steps", "warmup_ratio", "weight_decay", "adam_epsilon",
                "max_grad_norm",
                "precision", "seed", "eval_every", "eval_batch_size", "log_every", "save_every", "resume",
                "max_minutes", "group_by_length", "unpad", "compile", "num_threads", "device", "progress")


def _lr_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lr-grid takes comma-separated numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"--lr-grid needs positive learning rates, got {text!r}")
    return values


def _add_finetune_flags(p: argparse.ArgumentParser, *, lr: float | None = 2e-5,
                        batch_size: int | None = 32, max_seq_length: int | None = 128, model: bool = True,
                        adam_epsilon: float | None = None) -> None:
    """The flags every `finetune` task shares; a None default means "the task's recipe decides" (per
    version, approach, ...). --epochs defaults to None whatever the recipe, so that `_arguments` can tell a
    given --epochs from the recipe's (the recipe's epochs: `_arguments`' `epochs`). `model=False` leaves
    out --model (`distill` names its models otherwise: --teacher, --student). `adam_epsilon`: the recipe's
    (None: the run's recipe, else the engine's default, decides in `_arguments`)."""
    recipe = {"lr": lr, "epochs": None, "batch_size": batch_size, "adam_epsilon": adam_epsilon}
    if model:
        p.add_argument("--model", required=True, help="pre-trained checkpoint directory (config.json, weights, "
                       "vocab.txt) or Hub id (org/name[@revision])")
    add_settings_flags(p, FinetuneArguments, ("output_dir",))
    p.add_argument("--max-seq-length", type=int, default=max_seq_length)
    add_settings_flags(p, FinetuneArguments, ("lr",), recipe)
    p.add_argument("--lr-grid", type=_lr_list, metavar="LR,LR,...",
                   help="try each learning rate (the paper: 5e-5,4e-5,3e-5,2e-5), keep the best on dev; runs go "
                   "to OUT/lr{LR}-seed{SEED}/ (even for one rate), the best model and summary.json to OUT")
    p.add_argument("--seeds", type=int, default=1, help="repeat with N seeds (--seed, --seed+1, ...): "
                   "mean, std, min, max of every metric in OUT/summary.json; with --resume, finished runs are "
                   "read back")
    add_settings_flags(p, FinetuneArguments, SHARED_FLAGS, recipe)


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("finetune", help="fine-tune on a task (GLUE, your own classification data, ...)")
    tasks = p.add_subparsers(dest="task_family", required=True, metavar="TASK")
    for command in finetune_commands():  # the registry as it is now: a family registered at run time included
        add_command(tasks, command)


def add_command(tasks: argparse._SubParsersAction, command: FinetuneCommand) -> argparse.ArgumentParser:
    """One sub-command: the command's own flags, then the shared ones at its recipe's defaults."""
    p = tasks.add_parser(command.name, help=command.help)
    command.add_flags(p)
    recipe = command.recipe
    _add_finetune_flags(p, **{k: recipe[k] for k in ("lr", "batch_size", "max_seq_length", "adam_epsilon")
                             if k in recipe})
    p.set_defaults(func=run, check=command.check, finetune_command=command, recipe_epochs=recipe.get("epochs"))
    return p


def run(args: argparse.Namespace) -> None:
    """Any `finetune` sub-command: its task from the flags, the shared engine (a learning-rate grid and
    seeds when asked), the report, then what the command does with the best model (`after`)."""
    command: FinetuneCommand = args.finetune_command
    recipe = command.recipe_of(args)  # per version, approach, ...: resolved once, kept out of the flags
    task = command.task(args)
    results = engine.finetune_grid(task, _arguments(args, recipe), *_grid(args))
    report_finetune(results, args.output_dir)
    if command.after is not None:
        command.after(args)


def _arguments(args: argparse.Namespace, recipe: dict[str, Any] | None = None) -> FinetuneArguments:
    """FinetuneArguments from the flags `_add_finetune_flags` defines; `recipe`: the run's resolved recipe,
    whose lr, batch_size and adam_epsilon fill the flags left None, and whose epochs are used when --epochs is
    not given (default: the command's, `args.recipe_epochs`, else FinetuneArguments' own).
    --max-steps wins over the epochs (the engine's rule); given with --epochs too, that is said on stderr."""
    recipe = recipe or {}
    values = {k: recipe[k] for k in ("lr", "batch_size", "adam_epsilon")
              if recipe.get(k) is not None and getattr(args, k) is None}
    epochs = recipe.get("epochs")
    if epochs is None:
        epochs = getattr(args, "recipe_epochs", None)
    if args.max_steps is not None and args.epochs is not None:
        print(f"bertforge {getattr(args, 'command', 'finetune')}: note: --max-steps {args.max_steps} wins over --epochs {args.epochs:g}: "
              f"training runs {args.max_steps} steps", file=sys.stderr)
    if args.epochs is not None or epochs is None:
        return settings_from_args(FinetuneArguments, args, **values)  # --epochs, or the settings' default
    return settings_from_args(FinetuneArguments, args, epochs=epochs, **values)


def _grid(args: argparse.Namespace) -> tuple[list[float] | None, list[int] | None]:
    """`finetune_grid`'s learning rates and seeds: None for each one the command did not ask to vary."""
    seeds = list(range(args.seed, args.seed + args.seeds)) if args.seeds > 1 else None
    return args.lr_grid or None, seeds
