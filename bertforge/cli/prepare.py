"""`bertforge prepare-pretraining`: masked-LM / next-sentence instances from raw text."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..pretraining import prepare_pretraining
from ..pretraining.shards import INDEX_NAME
from ._common import expand


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("prepare-pretraining", help="masked-LM / next-sentence instances from raw text")
    p.add_argument("--input", nargs="+", required=True, help="text files or globs")
    p.add_argument("--vocab", required=True, help="vocab.txt")
    p.add_argument("--output-dir", required=True, help="instances, index.json, and a copy of --vocab with the "
                   "tokenizer settings (all that `pretrain --data` needs)")
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
    p.add_argument("--strict", action="store_true", help="refuse input that is not UTF-8 (default: replace such "
                   "bytes with U+FFFD and report how many)")
    p.add_argument("--overwrite", action="store_true", help="replace the instances an earlier run left in "
                   "--output-dir")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    inputs = expand(args.input)
    if (Path(args.output_dir) / INDEX_NAME).exists() and not args.overwrite:
        raise ValueError(f"--output-dir {args.output_dir} holds prepared instances ({INDEX_NAME}); pass --overwrite "
                         "to replace them")
    index = prepare_pretraining(
        inputs, args.vocab, args.output_dir, max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq, masked_lm_prob=args.masked_lm_prob,
        short_seq_prob=args.short_seq_prob, dupe_factor=args.dupe_factor, whole_word_mask=args.whole_word_mask,
        masking=args.masking, do_lower_case=args.do_lower_case, seed=args.seed, workers=args.workers,
        input_format=args.input_format, shard_size=args.shard_size, buffer_documents=args.buffer_documents,
        buffer_tokens=args.buffer_tokens, progress=not args.quiet, strict=args.strict)
    stats = index["stats"]
    print(f"wrote {args.output_dir}: {index['num_instances']} instances in {len(index['shards'])} shard(s) from "
          f"{index['num_documents']} document(s) ({args.masking} masking, {stats['is_next']} IsNext, "
          f"{stats['tokens']} tokens)")
    if index["replaced_bytes"]:
        first = next(iter(index["replaced_bytes"]))
        print(f"warning: replaced {stats['replaced_bytes']} byte(s) that are not UTF-8 with U+FFFD in "
              f"{len(index['replaced_bytes'])} file(s) (first: {first}); --strict refuses such input", file=sys.stderr)
