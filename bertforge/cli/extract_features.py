"""`bertforge extract-features`: hidden states of chosen layers as JSON lines (Google's extract_features.py)."""

from __future__ import annotations

import argparse

from .._checks import check_output, model_positions
from ..tasks.embed import extract_features


def _layers(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers takes comma-separated integers, got {text!r}") from None


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("extract-features", help="hidden states of chosen layers as JSON lines")
    p.add_argument("--model", required=True, help="checkpoint directory (config.json, model.safetensors, vocab.txt)")
    p.add_argument("--input-file", required=True, help="one example per line; 'text_a ||| text_b' for pairs")
    p.add_argument("--output-file", required=True)
    p.add_argument("--layers", type=_layers, default=[-1, -2, -3, -4], help="encoder layers, -1 = last")
    p.add_argument("--max-seq-length", type=int, help="default 128, or the model's positions if fewer")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output-file")
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    """--output-file before the model loads: never the input, a special file, or an existing file without
    --overwrite."""
    check_output(args.output_file, [args.input_file], args.overwrite, flag="--output-file")


def attach_negative_values(argv: list[str]) -> list[str]:
    """`--layers -1,-2` as `--layers=-1,-2`: argparse takes "-1,-2" for an option, and that is how users
    write it (Google's docs)."""
    out: list[str] = []
    for token in argv:
        if out and out[-1] == "--layers" and token.startswith("-"):
            out[-1] = f"--layers={token}"
        else:
            out.append(token)
    return out


def run(args: argparse.Namespace) -> None:
    if args.max_seq_length is None:  # 128, or fewer for a model with fewer positions
        args.max_seq_length = min(128, model_positions(args.model) or 128)
    count = extract_features(args.model, args.input_file, args.output_file, args.layers,
                             args.max_seq_length, args.batch_size)
    print(f"wrote {args.output_file}: features of layers {args.layers} for {count} example(s)")
