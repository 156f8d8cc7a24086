"""`bertforge convert-tf`: a Google TensorFlow checkpoint to this library's layout (no TensorFlow needed)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .._checks import check_output
from ..modeling.tf_checkpoint import convert_tf_checkpoint

# What convert-tf writes into its output directory.
OUTPUTS = ("model.safetensors", "config.json", "vocab.txt", "tokenizer_config.json")


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("convert-tf", help="convert a Google TensorFlow checkpoint (no TensorFlow needed)")
    p.add_argument("checkpoint", help="checkpoint prefix, e.g. uncased_L-12_H-768_A-12/bert_model.ckpt")
    p.add_argument("output_dir")
    p.add_argument("--config", help="bert_config.json (default: beside the checkpoint)")
    p.add_argument("--vocab", help="vocab.txt (default: beside the checkpoint)")
    p.add_argument("--overwrite", action="store_true", help="replace a model already in output_dir")
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    """The files written into output_dir, before the checkpoint is read: never over the inputs (--config,
    --vocab), a special file, or an existing file without --overwrite."""
    files = [Path(args.output_dir) / name for name in OUTPUTS]
    check_output(files[0], [p for p in (args.config, args.vocab) if p], args.overwrite, files[1:],
                 flag="output_dir")


def run(args: argparse.Namespace) -> None:
    out = convert_tf_checkpoint(args.checkpoint, args.output_dir, config_file=args.config, vocab_file=args.vocab)
    print(f"converted {args.checkpoint} -> {out} (config.json, model.safetensors, vocab.txt, tokenizer_config.json)")
