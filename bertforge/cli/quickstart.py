"""`bertforge quickstart`: the pipeline in miniature on the built-in Shakespeare corpus."""

from __future__ import annotations

import argparse

from ..quickstart import run_quickstart


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("quickstart", help="the pipeline in miniature on the built-in Shakespeare corpus")
    p.add_argument("--output-dir", default="quickstart_out")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the instances, the weights, dropout and the data order (default 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    run_quickstart(args.output_dir, seed=args.seed)
