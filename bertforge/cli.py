"""The `bertforge` command: parses flags and calls the library. Each sub-command is one stage."""

from __future__ import annotations

import argparse
import glob
import logging
import sys
from pathlib import Path


def _expand(patterns: list[str]) -> list[str]:
    files: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True))
        if not matches:
            raise FileNotFoundError(f"no file matches {pattern}")
        files.extend(m for m in matches if Path(m).is_file())
    return files


def _layers(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers takes comma-separated integers, got {text!r}") from None


def cmd_vocab(args: argparse.Namespace) -> None:
    from .tokenization import train_vocab

    files = _expand(args.input)
    vocab = train_vocab(files, vocab_size=args.vocab_size, lowercase=not args.cased,
                        min_frequency=args.min_frequency, output=args.output)
    print(f"wrote {args.output}: {len(vocab)} tokens ({'cased' if args.cased else 'uncased'}) "
          f"from {len(files)} file(s)")


def cmd_extract_features(args: argparse.Namespace) -> None:
    from .tasks.features import extract_features

    count = extract_features(args.model, args.input_file, args.output_file, args.layers,
                             args.max_seq_length, args.batch_size)
    print(f"wrote {args.output_file}: features of layers {args.layers} for {count} example(s)")


def cmd_convert_tf(args: argparse.Namespace) -> None:
    from .modeling.tf_checkpoint import convert_tf_checkpoint

    out = convert_tf_checkpoint(args.checkpoint, args.output_dir, config_file=args.config, vocab_file=args.vocab)
    print(f"converted {args.checkpoint} -> {out} (config.json, model.safetensors, vocab.txt, tokenizer_config.json)")


def cmd_quickstart(args: argparse.Namespace) -> None:
    from .quickstart import run_quickstart

    run_quickstart(args.output_dir)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertforge", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("quickstart", help="the pipeline in miniature on the built-in Shakespeare corpus")
    p.add_argument("--output-dir", default="quickstart_out")
    p.set_defaults(func=cmd_quickstart)

    p = commands.add_parser("vocab", help="train a WordPiece vocabulary on text files")
    p.add_argument("--input", nargs="+", required=True, help="text files or globs")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--output", required=True, help="vocab.txt to write")
    p.add_argument("--cased", action="store_true", help="keep case and accents (default: lower-case, strip accents)")
    p.add_argument("--min-frequency", type=int, default=2)
    p.set_defaults(func=cmd_vocab)

    p = commands.add_parser("extract-features", help="hidden states of chosen layers as JSON lines")
    p.add_argument("--model", required=True, help="checkpoint directory (config.json, model.safetensors, vocab.txt)")
    p.add_argument("--input-file", required=True, help="one example per line; 'text_a ||| text_b' for pairs")
    p.add_argument("--output-file", required=True)
    p.add_argument("--layers", type=_layers, default=[-1, -2, -3, -4], help="encoder layers, -1 = last")
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.set_defaults(func=cmd_extract_features)

    p = commands.add_parser("convert-tf", help="convert a Google TensorFlow checkpoint (no TensorFlow needed)")
    p.add_argument("checkpoint", help="checkpoint prefix, e.g. uncased_L-12_H-768_A-12/bert_model.ckpt")
    p.add_argument("output_dir")
    p.add_argument("--config", help="bert_config.json (default: beside the checkpoint)")
    p.add_argument("--vocab", help="vocab.txt (default: beside the checkpoint)")
    p.set_defaults(func=cmd_convert_tf)
    return parser


def _attach_negative_values(argv: list[str]) -> list[str]:
    # argparse takes "-1,-2" for an option; `--layers -1,-2,-3,-4` is how users write it (Google's docs).
    out: list[str] = []
    for token in argv:
        if out and out[-1] == "--layers" and token.startswith("-"):
            out[-1] = f"--layers={token}"
        else:
            out.append(token)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(_attach_negative_values(argv))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        args.func(args)
    except (FileNotFoundError, ValueError, ModuleNotFoundError) as error:
        # Bad input is the user's to fix: one clear line, no traceback.
        print(f"bertforge {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
