"""The teacher's outputs over the transfer set, computed once and kept memory-mapped.

Every epoch of every student (each seed, each size) reads the same teacher outputs, so the teacher runs
over the transfer set once: its outputs are saved as `.npy` arrays in a directory named by a key, and read
back with `np.load(..., mmap_mode="r")` (pages are read as batches touch them, so a transfer set larger
than memory works too). The key is a hash of everything the outputs depend on: the teacher's weights,
config.json and vocabulary, the model inputs (which hold the data and --max-seq-length) and what is
computed (the family's `what`). Same key, same outputs: a second student, or a resumed run, reads them
back instead of running the teacher again.

The directory is written whole or not at all: arrays and `meta.json` go to a temporary directory that is
renamed into place last, so a killed run never leaves outputs that look finished.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..modeling.pretrained import weights_path
from ..training.finetune import features_fingerprint

logger = logging.getLogger("bertforge")

__all__ = ["CACHE_DIR", "cache_key", "default_cache_dir", "file_digest", "teacher_outputs"]

CACHE_DIR = "teacher_outputs"  # under the student's OUT, unless --cache-dir says where
META = "meta.json"


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_key(teacher_dir: str | os.PathLike, features: Sequence[Mapping[str, Any]], what: str,
              inputs: Sequence[str] = ("input_ids", "token_type_ids")) -> str:
    """The hash naming a teacher's outputs: its weights, config.json and vocab.txt, the features' `inputs`
    (in order) and `what` is computed ("classify logits", ...). 24 hex digits."""
    teacher_dir = Path(teacher_dir)
    digest = hashlib.sha256(what.encode())
    digest.update(file_digest(weights_path(teacher_dir)).encode())
    for name in ("config.json", "vocab.txt"):
        if (teacher_dir / name).is_file():
            digest.update(file_digest(teacher_dir / name).encode())
    digest.update(features_fingerprint([{k: f[k] for k in inputs if k in f} for f in features]).encode())
    return digest.hexdigest()[:24]


def default_cache_dir(teacher_dir: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """OUT/teacher_outputs: the teacher's directory is the user's input and is never written to (a Hub
    snapshot or a read-only mount included). `--cache-dir` names a shared place instead, so that several
    students of one teacher compute its outputs once."""
    return Path(output_dir) / CACHE_DIR


def teacher_outputs(cache_dir: str | os.PathLike, key: str, compute: Callable[[], Mapping[str, np.ndarray]],
                    rows: int | None = None) -> dict[str, np.ndarray]:
    """The arrays stored under `cache_dir/key`, memory-mapped read-only; computed by `compute()` (name ->
    array) and stored first when absent. `rows`: the first axis every array must have (a stored set of
    another size is recomputed, as is one that cannot be read)."""
    directory = Path(cache_dir) / key
    stored = _read(directory, rows)
    if stored is not None:
        logger.info("teacher outputs read back from %s", directory)
        return stored
    arrays = {name: np.ascontiguousarray(value) for name, value in compute().items()}
    directory.parent.mkdir(parents=True, exist_ok=True)
    temporary = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=directory.parent))
    try:
        for name, value in arrays.items():
            np.save(temporary / f"{name}.npy", value, allow_pickle=False)
        meta = {"key": key, "arrays": {n: {"shape": list(v.shape), "dtype": str(v.dtype)} for n, v in arrays.items()}}
        (temporary / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        if directory.exists():  # unreadable or of another size: replaced
            shutil.rmtree(directory)
        try:
            os.replace(temporary, directory)
        except OSError:  # another run stored the same outputs meanwhile: theirs are read
            if _read(directory, rows) is None:
                raise
    finally:
        if temporary.exists():
            shutil.rmtree(temporary)
    logger.info("teacher outputs computed into %s", directory)
    return _read(directory, rows) or arrays


def _read(directory: Path, rows: int | None) -> dict[str, np.ndarray] | None:
    """The arrays of a finished cache directory, memory-mapped; None when absent, incomplete or unreadable."""
    try:
        meta = json.loads((directory / META).read_text(encoding="utf-8"))
        arrays = {name: np.load(directory / f"{name}.npy", mmap_mode="r", allow_pickle=False)
                  for name in meta["arrays"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for name, info in meta["arrays"].items():
        if list(arrays[name].shape) != info["shape"] or (rows is not None and arrays[name].shape[:1] != (rows,)):
            return None
    return arrays
