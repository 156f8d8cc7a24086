"""The command line's flag checks: every limit that can be judged from the flags (and a model's
config.json) is checked before a model loads or a data file is read, so that a bad value fails in
a second with the flag's name rather than hours later deep in a batch.

`check_flags(args)` raises ValueError (the CLI prints it as one line); it reads nothing but
config.json. It also judges what the machine must offer: --device (a device it has), --num-threads (at
most its CPUs) and every path a command writes (--output-dir, --output, --output-file, --cache-dir: a
file system that can take the name and be written, `check_writable`), so that every command, through the
CLI's `main`, refuses them in one line before any long work. `check_output(...)` guards every file a
command writes where the user names it (`predict --output`, `vocab --output`, `extract-features
--output-file`, `export-onnx --output`, `convert-tf`'s directory), before the command loads or computes
anything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import torch

from ._files import check_writable, special_kind

# Counts that mean nothing at 0 or below (a batch of 0, a window of 0 tokens, ...).
AT_LEAST_ONE = ("batch_size", "eval_batch_size", "grad_accum", "max_seq_length", "doc_stride", "max_query_length",
                "n_best_size", "max_answer_length", "max_train_examples", "seeds", "save_every", "log_every",
                "eval_every", "max_steps", "phase2_steps", "phase2_batch_size", "max_predictions_per_seq",
                "dupe_factor", "workers", "shard_size", "buffer_documents", "buffer_tokens", "vocab_size",
                "min_frequency", "lstm_hidden", "lstm_layers", "num_threads", "max_length")
# Rates and durations that must be finite and above 0.
POSITIVE = ("lr", "epochs", "max_minutes", "adam_epsilon")
# Values that may be 0 but not negative (nor NaN).
NON_NEGATIVE = ("weight_decay", "max_grad_norm", "warmup_steps", "num_workers")
# Shares in [0, 1]: whether 0 and whether 1 are allowed.
FRACTIONS = {"masked_lm_prob": (False, False), "short_seq_prob": (True, True), "warmup_ratio": (True, False),
             "lstm_dropout": (True, False)}

# Paths a command creates or fills (a directory) and files it writes, by argparse destination: each checked by
# `check_writable` before any work (every command's flags go through `check_flags`).
OUTPUT_DIRECTORIES = ("output_dir", "cache_dir")
OUTPUT_FILES = ("output", "output_file")

# The most bytes of a config.json worth reading for its max_position_embeddings.
MODEL_CONFIG_LIMIT = 16 << 20


def flag(name: str) -> str:
    """The command-line spelling of an argparse destination: max_seq_length -> --max-seq-length."""
    return "--" + name.replace("_", "-")


def model_positions(model: str | os.PathLike) -> int | None:
    """`max_position_embeddings` of a model directory's config.json (None when there is no readable one:
    loading the model reports that later with its own message)."""
    path = Path(model) / "config.json"
    try:
        # Only a regular file of config size is read here: /dev/zero or a FIFO named config.json would never
        # end (loading the model refuses such a file with its own message).
        if not path.is_file() or path.stat().st_size > MODEL_CONFIG_LIMIT:
            return None
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    value = config.get("max_position_embeddings", 512) if isinstance(config, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_flags(args: argparse.Namespace) -> None:
    """ValueError naming the first flag whose value cannot work; reads only the model's config.json."""
    values = vars(args)
    for name in AT_LEAST_ONE:
        value = values.get(name)
        if value is not None and value < 1:
            raise ValueError(f"{flag(name)} must be at least 1, got {value}")
    for name in POSITIVE:
        value = values.get(name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{flag(name)} must be a positive number, got {value:g}")
    for name in NON_NEGATIVE:
        value = values.get(name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{flag(name)} must be 0 or more, got {value:g}")
    for name, (zero, one) in FRACTIONS.items():
        value = values.get(name)
        if value is not None and not ((0 < value or (zero and value == 0)) and (value < 1 or (one and value == 1))):
            raise ValueError(f"{flag(name)} must be in {'[' if zero else '('}0, 1{']' if one else ')'}, got {value:g}")
    threshold = values.get("null_score_diff_threshold")
    if threshold is not None and not math.isfinite(threshold):
        raise ValueError(f"--null-score-diff-threshold must be a finite number, got {threshold}")
    check_device(values.get("device"))
    check_threads(values.get("num_threads"))
    for name in OUTPUT_DIRECTORIES + OUTPUT_FILES:
        if isinstance(values.get(name), (str, os.PathLike)):
            check_writable(values[name], flag(name), directory=name in OUTPUT_DIRECTORIES)
    check_positions(args)
    # Classification's windows; `finetune squad` checks its windows with the question's tokens (its `check`).
    if values.get("task_family") != "squad" and values.get("doc_stride") is not None \
            and values.get("max_seq_length") is not None and values["doc_stride"] >= values["max_seq_length"]:
        raise ValueError(f"--doc-stride ({values['doc_stride']}) must be less than --max-seq-length "
                         f"({values['max_seq_length']}) so that windows overlap")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity set where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def check_threads(num_threads: int | None, name: str = "--num-threads") -> None:
    """ValueError unless `num_threads` (torch's intra-op threads) is at most the CPUs this process may run on:
    more only wait for a core, and far more (100,000) crash OpenMP's thread creation, or the process."""
    if num_threads is None:
        return
    cpus = usable_cpus()
    if num_threads > cpus:
        raise ValueError(f"{name} {num_threads} is more than the {cpus} CPU(s) this process may run on; "
                         f"give at most {cpus}")


def check_device(device: str | None, name: str = "--device") -> None:
    """ValueError unless `device` names a device this machine has: "cpu", or "cuda"/"cuda:N" where torch
    sees CUDA and GPU N exists (else torch fails deep in set-up, on a CPU-only build with an AttributeError
    of its internals), or "mps" where the Apple backend is available."""
    if device is None:
        return
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"{name} {device!r} is not a device: give cpu, cuda or cuda:N") from None
    if parsed.type == "cpu":
        return
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            build = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ValueError(f"{name} {device}: {build} on this machine; use --device cpu")
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(f"{name} {device}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
        return
    if parsed.type == "mps" and torch.backends.mps.is_available():
        return
    raise ValueError(f"{name} {device}: bertforge runs on cpu or cuda (cuda:N), and {parsed.type} is not "
                     "available here")


def check_positions(args: argparse.Namespace) -> None:
    """--max-seq-length against the position embeddings in --model's config.json (read alone; a model
    that is not a local directory yet, a Hub id, is skipped)."""
    model, length = getattr(args, "model", None), getattr(args, "max_seq_length", None)
    if model is None or length is None:
        return
    positions = model_positions(model)
    if positions is not None and length > positions:
        raise ValueError(f"--max-seq-length {length} exceeds the {positions} positions of {model} "
                         f"(max_position_embeddings in its config.json)")


def check_output(output: str | os.PathLike, inputs: list[str | os.PathLike], overwrite: bool,
                 also: list[str | os.PathLike] = (), flag: str = "--output") -> None:
    """Refuse to write `output` (and the side files `also`) over an input, over something that is not a
    regular file (a directory, a FIFO, a device node, a socket: a write would replace or block on it), or
    over an existing file without `overwrite`: a command never destroys what the user gave. A symlink is
    judged by what it points at (the write replaces its target and keeps the link). ValueError naming
    `flag`; reads and writes nothing."""
    written = [Path(output), *(Path(p) for p in also)]
    for path in written:
        kind = special_kind(path)
        if kind == "a directory":
            raise ValueError(f"{flag} {path} is a directory; give a file name")
        if kind is not None:
            shown = f"{path} (-> {os.path.realpath(path)})" if path.is_symlink() else str(path)
            raise ValueError(f"{flag} {shown} is {kind}, not a regular file: refusing to write over it; give a "
                             "file name")
        for source in inputs:
            source = Path(source)
            same = path.resolve() == source.resolve() or (path.exists() and source.exists()
                                                           and os.path.samefile(path, source))
            if same:
                raise ValueError(f"{flag} {path} is the input file {source}: a command never overwrites its "
                                 f"input; choose another {flag}")
        if path.exists() and not overwrite:
            raise ValueError(f"{flag}: {path} exists; pass --overwrite to replace it")
