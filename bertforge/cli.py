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


def cmd_prepare_pretraining(args: argparse.Namespace) -> None:
    from .pretraining import prepare_pretraining

    index = prepare_pretraining(
        _expand(args.input), args.vocab, args.output_dir, max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq, masked_lm_prob=args.masked_lm_prob,
        short_seq_prob=args.short_seq_prob, dupe_factor=args.dupe_factor, whole_word_mask=args.whole_word_mask,
        masking=args.masking, do_lower_case=args.do_lower_case, seed=args.seed, workers=args.workers,
        input_format=args.input_format, shard_size=args.shard_size, buffer_documents=args.buffer_documents,
        buffer_tokens=args.buffer_tokens, progress=not args.quiet)
    stats = index["stats"]
    print(f"wrote {args.output_dir}: {index['num_instances']} instances in {len(index['shards'])} shard(s) from "
          f"{index['num_documents']} document(s) ({args.masking} masking, {stats['is_next']} IsNext, "
          f"{stats['tokens']} tokens)")


def cmd_pretrain(args: argparse.Namespace) -> None:
    import os

    from .pretraining.trainer import arguments_from, run_pretraining
    from .training import NonFiniteLossError

    try:
        final = run_pretraining(arguments_from(args))
    except NonFiniteLossError as error:  # diverged: say where to resume from, no traceback
        raise SystemExit(f"bertforge pretrain: error: {error}") from None
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"pre-trained {args.config}: log {Path(args.output_dir) / 'log.jsonl'}, "
              f"checkpoints {Path(args.output_dir) / 'checkpoints'}, model {final}")


def cmd_plot(args: argparse.Namespace) -> None:
    from .training.plot import plot_log

    written = plot_log(args.run, args.output_dir)
    print("wrote " + ", ".join(str(p) for p in written))


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

    p = commands.add_parser("prepare-pretraining", help="masked-LM / next-sentence instances from raw text")
    p.add_argument("--input", nargs="+", required=True, help="text files or globs")
    p.add_argument("--vocab", required=True, help="vocab.txt")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--input-format", choices=("auto", "bert", "text", "wiki"), default="auto",
                   help="auto: wiki for <doc> files, bert for one-sentence-per-line files, else text")
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--max-predictions-per-seq", type=int, default=20)
    p.add_argument("--masked-lm-prob", type=float, default=0.15)
    p.add_argument("--short-seq-prob", type=float, default=0.1)
    p.add_argument("--dupe-factor", type=int, default=5)
    p.add_argument("--whole-word-mask", action="store_true")
    p.add_argument("--masking", choices=("static", "dynamic"), default="static",
                   help="dynamic: store unmasked, mask at load time (new masks every epoch)")
    case = p.add_mutually_exclusive_group()
    case.add_argument("--do-lower-case", dest="do_lower_case", action="store_const", const=True, default=None,
                      help="(default: guessed from the vocabulary)")
    case.add_argument("--no-lower-case", dest="do_lower_case", action="store_const", const=False)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--shard-size", type=int, default=65536, help="instances per shard")
    p.add_argument("--buffer-documents", type=int, default=1000, help="documents kept for NotNext sampling")
    p.add_argument("--buffer-tokens", type=int, default=4_000_000, help="tokens kept for NotNext sampling")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_prepare_pretraining)

    p = commands.add_parser("pretrain", help="pre-train BERT (masked LM + next sentence) on prepared instances",
                            description="Pre-train on `prepare-pretraining` output. Multi-process: "
                            "torchrun --nproc_per_node N -m bertforge pretrain ... (--batch-size stays global).")
    p.add_argument("--data", required=True, help="prepared instances (prepare-pretraining's output directory)")
    p.add_argument("--config", default="base",
                   help="tiny, mini, small, medium, base, large, or a config.json (default: base)")
    p.add_argument("--output-dir", required=True, help="log.jsonl, checkpoints/ and final/ go here")
    p.add_argument("--vocab", help="the vocab.txt the data was prepared with (default: DATA/vocab.txt)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per micro-batch, all processes together")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup-steps", type=int, help="linear warm-up steps (default: 1%% of all steps)")
    p.add_argument("--max-steps", type=int, help="optimizer steps, both phases (default: one epoch of --data)")
    p.add_argument("--epochs", type=float, help="passes over --data (instead of --max-steps)")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="global-norm clipping; 0: none")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=1000, help="checkpoint every N steps (and at the end)")
    p.add_argument("--keep-last", type=int, default=3, help="checkpoints kept")
    p.add_argument("--resume", nargs="?", const=True, default=None, metavar="CHECKPOINT",
                   help="continue OUT's latest checkpoint (or the file/directory given)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-data", help="prepared instances to evaluate on")
    p.add_argument("--eval-every", type=int, help="evaluate every N steps (default: at the end)")
    p.add_argument("--eval-batch-size", type=int, help="per process (default: --batch-size / processes)")
    p.add_argument("--phase2-data", help="second phase's instances (the paper: 512 tokens)")
    p.add_argument("--phase2-steps", type=int, help="the last N of --max-steps run on --phase2-data")
    p.add_argument("--phase2-batch-size", type=int, help="(default: --batch-size)")
    p.add_argument("--no-nsp", dest="nsp", action="store_false", help="masked LM only, no next-sentence loss")
    p.add_argument("--objective", choices=("mlm", "ltr"), default="mlm",
                   help="ltr: left-to-right LM with a causal encoder, no NSP (the paper's ablation)")
    p.add_argument("--fsdp", action="store_true", help="FullyShardedDataParallel under torchrun (GPU-oriented)")
    p.add_argument("--num-workers", type=int, default=0, help="data-loading worker processes")
    p.add_argument("--num-threads", type=int, help="torch threads per process")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: the GPU if there is one)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(func=cmd_pretrain)

    p = commands.add_parser("plot", help="PNG curves (loss, accuracy, lr, throughput) of a training run")
    p.add_argument("run", help="a training output directory (with log.jsonl) or a log.jsonl file")
    p.add_argument("--output-dir", help="where the PNGs go (default: RUN/plots)")
    p.set_defaults(func=cmd_plot)
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
