"""`bertforge vocab`: train a WordPiece vocabulary, or extend one with a domain's words (`--extend`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .._checks import check_output
from .._files import atomic_path, write_target
from ..pretraining.text import read_documents
from ..tokenization import train_vocab
from ..tokenization.extend import extend_vocab, report_path
from ..tokenization.vocab import save_vocab
from ._common import expand


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("vocab", help="train a WordPiece vocabulary on text files")
    p.add_argument("--input", nargs="+", required=True, help="text files or globs")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--output", required=True, help="vocab.txt to write")
    p.add_argument("--cased", action="store_true", help="keep case and accents (default: lower-case, strip accents)")
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--extend", metavar="MODEL_OR_VOCAB", help="instead of training: put the --input domain's "
                   "words that this vocab.txt (or model directory) splits into --min-pieces or more pieces into "
                   "its [unusedN] slots, by tokens saved; every other id kept (report: OUTPUT's stem + .extend.json)")
    p.add_argument("--max-new", type=int, help="--extend: words to add (default: as many as there are free slots)")
    p.add_argument("--min-pieces", type=int, default=3, help="--extend: add only words split into this many pieces")
    p.add_argument("--min-count", type=int, default=2, help="--extend: add only words seen this many times")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output (never an --input)")
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    """--output (and --extend's report beside it) before any text is read: never over an input, a special
    file, or an existing file without --overwrite."""
    also = [report_path(args.output)] if args.extend else []
    inputs = [p for p in [args.extend] if p] + [p for p in args.input if Path(p).is_file()]
    check_output(args.output, inputs, args.overwrite, also)


def run(args: argparse.Namespace) -> None:
    files = expand(args.input)
    if args.extend:
        run_extend(args, files)
        return
    check_output(args.output, files, args.overwrite)  # the globs' files too
    vocab = train_vocab(files, vocab_size=args.vocab_size, lowercase=not args.cased,
                        min_frequency=args.min_frequency)
    with atomic_path(args.output, prefix=".vocab.") as temporary:  # a symlink's target; never half a file
        save_vocab(vocab, temporary)
    print(f"wrote {args.output}: {len(vocab)} tokens ({'cased' if args.cased else 'uncased'}) "
          f"from {len(files)} file(s)")


def run_extend(args: argparse.Namespace, files: list[str]) -> None:
    """`vocab --extend`: the domain's words in the [unusedN] slots of an existing vocabulary."""
    if args.cased:
        raise ValueError("--cased: with --extend, case and accents follow the model's tokenizer settings")
    # The text prepare-pretraining reads (WikiExtractor markup and repeated titles dropped).
    texts = (sentence for file in files for document in read_documents(file) for sentence in document)
    check_output(args.output, files, args.overwrite, [report_path(args.output)])
    report = extend_vocab(args.extend, texts, write_target(args.output), max_new=args.max_new,
                          min_pieces=args.min_pieces, min_count=args.min_count, inputs=files)
    before, after = report["before"], report["after"]
    print(f"wrote {args.output}: {report['new_words']} new words in [unusedN] slots ({report['unused_slots_left']} "
          f"left); {report['new_word_occurrences']:,} of {report['words']:,} word occurrences "
          f"({100 * report['new_word_share']:.2f}%) become single tokens; tokens per word "
          f"{before['tokens_per_word']:.4f} -> {after['tokens_per_word']:.4f}; report {report_path(args.output)}")
