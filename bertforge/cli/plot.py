"""`bertforge plot`: PNG curves of a training run's log (matplotlib, the `plot` extra)."""

from __future__ import annotations

import argparse

from ..training.plot import plot_log


def register(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("plot", help="PNG curves (loss, accuracy, lr, throughput) of a training run")
    p.add_argument("run", help="a training output directory (with log.jsonl) or a log.jsonl file")
    p.add_argument("--output-dir", help="where the PNGs go (default: RUN/plots)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    written = plot_log(args.run, args.output_dir)
    print("wrote " + ", ".join(str(p) for p in written))
