"""`bertforge convert-tf`: a Google TensorFlow checkpoint to this library's layout (no TensorFlow needed)."""

from __future__ import annotations

import argparse

from ..modeling.tf_checkpoint import convert_tf_checkpoint


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("convert-tf", help="convert a Google TensorFlow checkpoint (no TensorFlow needed)")
    p.add_argument("checkpoint", help="checkpoint prefix, e.g. uncased_L-12_H-768_A-12/bert_model.ckpt")
    p.add_argument("output_dir")
    p.add_argument("--config", help="bert_config.json (default: beside the checkpoint)")
    p.add_argument("--vocab", help="vocab.txt (default: beside the checkpoint)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    out = convert_tf_checkpoint(args.checkpoint, args.output_dir, config_file=args.config, vocab_file=args.vocab)
    print(f"converted {args.checkpoint} -> {out} (config.json, model.safetensors, vocab.txt, tokenizer_config.json)")
