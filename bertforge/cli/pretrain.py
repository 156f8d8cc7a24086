"""`bertforge pretrain`: pre-train BERT on prepared instances; every flag is a PretrainingArguments field."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..pretraining.trainer import PretrainingArguments, run_pretraining
from ..training import NonFiniteLossError
from .flags import add_settings_flags, settings_from_args

# The flags, in --help's order: each is the PretrainingArguments field of that name.
FLAGS = ("data", "config", "init_from", "output_dir", "vocab", "batch_size", "grad_accum", "lr", "warmup_steps",
         "max_steps", "epochs", "max_minutes", "budget_schedule", "weight_decay", "adam_epsilon",
         "max_grad_norm", "precision", "seed",
         "save_every", "keep_last", "resume", "log_every", "eval_data", "eval_every", "eval_batch_size",
         "phase2_data", "phase2_steps", "phase2_batch_size", "nsp", "unpad", "objective", "fsdp", "compile", "num_workers",
         "num_threads", "device", "progress")


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("pretrain", help="pre-train BERT (masked LM + next sentence) on prepared instances",
                            description="Pre-train on `prepare-pretraining` output. Multi-process: "
                            "torchrun --nproc_per_node N -m bertforge pretrain ... (--batch-size stays global).")
    add_settings_flags(p, PretrainingArguments, FLAGS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    if args.max_steps is not None and args.epochs is not None and int(os.environ.get("RANK", "0")) == 0:
        print(f"bertforge pretrain: note: --max-steps {args.max_steps} wins over --epochs {args.epochs:g}: "
              f"training runs {args.max_steps} steps", file=sys.stderr)
    try:
        final = run_pretraining(settings_from_args(PretrainingArguments, args))
    except NonFiniteLossError as error:  # diverged: say where to resume from, no traceback
        raise SystemExit(f"bertforge pretrain: error: {error}") from None
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"pre-trained {args.init_from or args.config or 'base'}: log {Path(args.output_dir) / 'log.jsonl'}, "
              f"checkpoints {Path(args.output_dir) / 'checkpoints'}, model {final}")
