"""The teacher's outputs over the transfer set, computed once and kept memory-mapped.

Every epoch of every student (each seed, each size) reads the same teacher outputs, so the teacher runs
over the transfer set once: its outputs are saved as `.npy` arrays in a directory named by a key, and read
back with `np.load(..., mmap_mode="r")` (pages are read as batches touch them, so a transfer set larger
than memory works too). The key is a hash of everything the outputs depend on: the teacher's weights,
config.json and vocabulary, the model inputs (which hold the data and --max-seq-length) and what is
computed (the family's `what`). Same key, same outputs: a second student, or a resumed run, reads them
back instead of running the teacher again.

The directory is written whole or not at all: arrays and `meta.json` go to a temporary directory that is
renamed into place last, so a killed run never leaves outputs that look finished. It gets the mode a
plain `mkdir` gives under the umask (not `mkdtemp`'s owner-only 0700), so that a `--cache-dir` shared by
a team can be read by each of its users.

The bytes are not trusted: `meta.json` records each array's SHA-256 and the settings that made it (the
teacher's files' digests, what was computed, from which inputs, how many rows). On every read the arrays
are hashed again (in 1 MiB blocks, so a cache larger than memory still works) and the settings compared;
a damaged or foreign entry (a file overwritten, truncated, filled with NaN) is reported in one line and
recomputed over, never trained on. Outputs that hold NaN or +inf when computed are refused (the teacher
itself is broken): they are not stored. (-inf is allowed: a family may mark positions that take no
probability, as the answer family does outside a window's passage.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..modeling.pretrained import weights_path
from ..training.finetune import features_fingerprint

logger = logging.getLogger("bertforge")

__all__ = ["CACHE_DIR", "cache_key", "cache_settings", "default_cache_dir", "file_digest", "key_of", "teacher_outputs"]

CACHE_DIR = "teacher_outputs"  # under the student's OUT, unless --cache-dir says where
META = "meta.json"


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_settings(teacher_dir: str | os.PathLike, features: Sequence[Mapping[str, Any]], what: str,
                   inputs: Sequence[str] = ("input_ids", "token_type_ids")) -> dict[str, Any]:
    """Everything a teacher's outputs depend on, as stored in their `meta.json`: what is computed
    ("classify logits", ...), the SHA-256 of the teacher's weights, config.json and vocab.txt, the model
    inputs read (`inputs`), the number of rows and a fingerprint of the features' inputs (in order)."""
    teacher_dir = Path(teacher_dir)
    files = {"weights": file_digest(weights_path(teacher_dir))}
    for name in ("config.json", "vocab.txt"):
        if (teacher_dir / name).is_file():
            files[name] = file_digest(teacher_dir / name)
    return {"what": what, "teacher": files, "inputs": list(inputs), "rows": len(features),
            "features": features_fingerprint([{k: f[k] for k in inputs if k in f} for f in features])}


def cache_key(teacher_dir: str | os.PathLike, features: Sequence[Mapping[str, Any]], what: str,
              inputs: Sequence[str] = ("input_ids", "token_type_ids")) -> str:
    """The hash naming a teacher's outputs: of their `cache_settings` (the teacher's weights, config.json
    and vocab.txt, the features' `inputs` in order, `what` is computed). 24 hex digits."""
    return key_of(cache_settings(teacher_dir, features, what, inputs))


def key_of(settings: Mapping[str, Any]) -> str:
    """The cache key of `cache_settings`' result: 24 hex digits of the SHA-256 of its canonical JSON."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:24]


def default_cache_dir(teacher_dir: str | os.PathLike, output_dir: str | os.PathLike) -> Path:
    """OUT/teacher_outputs: the teacher's directory is the user's input and is never written to (a Hub
    snapshot or a read-only mount included). `--cache-dir` names a shared place instead, so that several
    students of one teacher compute its outputs once."""
    return Path(output_dir) / CACHE_DIR


def teacher_outputs(cache_dir: str | os.PathLike, key: str, compute: Callable[[], Mapping[str, np.ndarray]],
                    rows: int | None = None, settings: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """The arrays stored under `cache_dir/key`, memory-mapped read-only; computed by `compute()` (name ->
    array) and stored first when absent. `rows`: the first axis every array must have; `settings`: what made
    them (`cache_settings`), stored and compared. A stored entry that is unfinished is recomputed quietly; one
    that is damaged (a checksum that differs, another size, other settings, unreadable) is reported in one
    warning line and recomputed. ValueError when `compute()` gives NaN or +inf (nothing is stored)."""
    directory = Path(cache_dir) / key
    stored, damage = _read(directory, key, rows, settings)
    if stored is not None:
        logger.info("teacher outputs read back from %s", directory)
        return stored
    if damage is not None:
        logger.warning("the teacher's outputs in %s are damaged (%s): computing them again", directory, damage)
    arrays = {name: np.ascontiguousarray(value) for name, value in compute().items()}
    for name, value in arrays.items():
        if value.dtype.kind == "f" and (np.isnan(value).any() or np.isposinf(value).any()):
            bad = int(np.isnan(value).sum() + np.isposinf(value).sum())
            raise ValueError(f"the teacher's outputs hold {bad} NaN or +inf value(s) in {name!r}: the teacher's "
                             "weights are broken (or overflow in its precision); nothing was cached")
    directory.parent.mkdir(parents=True, exist_ok=True)  # the umask's mode
    temporary = directory.parent / f".{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    os.mkdir(temporary)  # the umask's mode, as every directory made here (see the module docstring)
    try:
        meta = {"key": key, "settings": dict(settings) if settings is not None else None, "arrays": {}}
        for name, value in arrays.items():
            path = temporary / f"{name}.npy"
            with open(path, "wb") as handle:
                np.save(handle, value, allow_pickle=False)
            meta["arrays"][name] = {"shape": list(value.shape), "dtype": str(value.dtype), "sha256": file_digest(path)}
        (temporary / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        if directory.exists():  # damaged: replaced
            shutil.rmtree(directory)
        try:
            os.replace(temporary, directory)
        except OSError:  # another run stored the same outputs meanwhile: theirs are read
            if _read(directory, key, rows, settings)[0] is None:
                raise
    finally:
        if temporary.exists():
            shutil.rmtree(temporary)
    logger.info("teacher outputs computed into %s", directory)
    return _read(directory, key, rows, settings)[0] or arrays


def _read(directory: Path, key: str, rows: int | None, settings: Mapping[str, Any] | None
          ) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """(the arrays of a finished cache entry, memory-mapped, None) after their checksums, shapes, key and
    settings are verified; (None, None) when absent or unfinished (no meta.json); (None, what is wrong) when
    damaged."""
    if not (directory / META).is_file():
        return None, None
    try:
        meta = json.loads((directory / META).read_text(encoding="utf-8"))
        entries = meta["arrays"]
        if meta.get("key") != key:
            return None, f"its meta.json names key {meta.get('key')!r}"
        if settings is not None and meta.get("settings") != json.loads(json.dumps(dict(settings))):
            return None, "it was computed with other settings than its key says"
        for name, info in entries.items():
            if "sha256" not in info:
                return None, f"{name}.npy has no checksum (an older cache)"
            if file_digest(directory / f"{name}.npy") != info["sha256"]:
                return None, f"{name}.npy does not match its checksum"
        arrays = {name: np.load(directory / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in entries}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return None, f"unreadable: {error}"
    for name, info in entries.items():
        if list(arrays[name].shape) != info["shape"] or (rows is not None and arrays[name].shape[:1] != (rows,)):
            expected = info["shape"] if list(arrays[name].shape) != info["shape"] else f"{rows} rows"
            return None, f"{name}.npy has shape {list(arrays[name].shape)}, not {expected}"
    return arrays, None
