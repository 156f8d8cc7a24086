"""The `bertforge` command: parses flags and calls the library. Each sub-command is one stage."""

from __future__ import annotations

import argparse
import logging
import sys

from .._checks import check_flags, check_positions
from .._files import is_disk_full
from ..modeling.pretrained import resolve_model_dir
from ..training import NonFiniteLossError
from . import (convert_tf, distill, export_onnx, extract_features, finetune, plot, predict, prepare, pretrain,
               quickstart, reproduce, serve, vocab)

# The sub-commands in --help's order; each module's `register` adds its parser, whose `func` runs it
# (and `check`, where a command has one, judges its flags together before anything loads).
COMMANDS = (quickstart, vocab, extract_features, convert_tf, prepare, pretrain, finetune, distill, predict, plot,
            export_onnx, serve, reproduce)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every sub-command (`finetune`'s and `predict`'s read the task registry as it is now)."""
    parser = argparse.ArgumentParser(prog="bertforge", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); 0 on success, 2 for input to fix, 1 for a disk
    that filled up or a training run whose loss became non-finite (each one line on stderr, no traceback)."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(extract_features.attach_negative_values(argv))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        check_flags(args)  # every flag's limits, before a model is fetched or loads, or data is read
        if getattr(args, "check", None) is not None:
            args.check(args)
        # A Hub id names a model as a directory does (serve resolves its own, to report a failure its way).
        for flag in ("model", "init_from"):
            if isinstance(getattr(args, flag, None), str) and args.command != "serve":
                setattr(args, flag, str(resolve_model_dir(getattr(args, flag))))
        check_positions(args)  # again: a Hub model's config.json is here once fetched
        args.func(args)
    except (FileNotFoundError, ValueError, ModuleNotFoundError) as error:
        # Bad input is the user's to fix: one clear line, no traceback.
        print(f"bertforge {args.command}: error: {error}", file=sys.stderr)
        return 2
    except NonFiniteLossError as error:
        # A diverged run (too high a learning rate, ...): one line naming the checkpoint to resume from and the
        # likely causes. Not a usage error (2): the flags were valid, the run failed.
        print(f"bertforge {args.command}: error: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # a full disk, whichever writer met it: one line, what was kept, what to do
        if not is_disk_full(error):
            raise
        print(f"bertforge {args.command}: error: {disk_full_message(error, args)}", file=sys.stderr)
        return 1
    return 0


def disk_full_message(error: BaseException, args: argparse.Namespace) -> str:
    """"no space left on device writing PATH" (the file, where the writer named it), and for a training run
    that the last checkpoint is kept and how to continue from it (writes go to temporary files, so a full
    disk never leaves a truncated file under a final name)."""
    text = str(error) if str(error).startswith("no space left on device") else "no space left on device" + (
        f" writing {error.filename}" if isinstance(error, OSError) and error.filename else "")
    if args.command in ("pretrain", "finetune"):
        text += ("; what was written before is intact (the last checkpoint included): free some space, then "
                 "rerun the same command with --resume")
    else:
        text += "; free some space and rerun"
    return text


__all__ = ["build_parser", "main"]
