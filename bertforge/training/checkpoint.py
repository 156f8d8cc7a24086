"""Training checkpoints: everything a run needs to continue exactly where it stopped.

A checkpoint is one `torch.save` file, `checkpoint-00001000.pt`, holding the model, optimizer,
scheduler and grad-scaler states, the step, the data position, every RNG state (Python `random`,
NumPy, torch CPU and CUDA, per rank) and the model config. It contains only tensors, numbers,
strings, lists and dicts, so it loads with `torch.load(weights_only=True)`: loading never runs code.

Writes are atomic: the file is written to a temporary name in the same directory, flushed and
fsync'ed, then renamed over the final name with `os.replace`; only then is the `latest` pointer
(a one-line text file naming the checkpoint) replaced the same way. A run killed at any moment
leaves the previous checkpoint and a pointer to it intact. Older checkpoints beyond `keep_last`
are deleted after the pointer moved on. Resuming from a directory falls back past a latest checkpoint
that cannot be read (truncated, corrupt) to the newest older one that can; after a divergence, `rewind`
points `latest` back at the last good checkpoint and sets the later ones aside (`diverged-*`).
"""

from __future__ import annotations

import logging
import os
import random
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .._files import atomic_open, fsync_directory

logger = logging.getLogger("bertforge")

LATEST = "latest"
_NAME = re.compile(r"^checkpoint-(\d+)\.pt$")
_TEMP_PREFIX = ".tmp-"


def checkpoint_name(step: int) -> str:
    return f"checkpoint-{step:08d}.pt"


def checkpoint_step(path: str | os.PathLike) -> int:
    """The step in a checkpoint's file name (-1 for another name)."""
    match = _NAME.match(Path(path).name)
    return int(match.group(1)) if match else -1


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None]) -> None:
    """Call `write(file)` on a temporary file beside `path`, fsync it, then rename it to `path`.

    Until the rename, `path` keeps its previous content; if `write` raises, the temporary file is removed.
    (`bertforge._files.atomic_open` with fsync.)
    """
    path = Path(path)
    with atomic_open(path, "wb", fsync=True, prefix=_TEMP_PREFIX + path.name + ".") as file:
        write(file)


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """The checkpoint files in `directory`, oldest step first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The checkpoint the `latest` pointer names, else the newest file present; None if there is none."""
    directory = Path(directory)
    pointer = directory / LATEST
    if pointer.is_file():
        target = directory / pointer.read_text(encoding="utf-8").strip()
        if target.is_file():
            return target
        logger.warning("%s names %s, which is missing; using the newest checkpoint present", pointer, target.name)
    found = list_checkpoints(directory)
    return found[-1] if found else None


def save_checkpoint(directory: str | os.PathLike, state: dict[str, Any], step: int, keep_last: int | None = None,
                    keep: Path | None = None) -> Path:
    """Write `state` as `directory/checkpoint-{step}.pt` atomically, move `latest` to it, keep the last K
    (and `keep`, e.g. the last checkpoint from before a divergence, whatever its age)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(_TEMP_PREFIX + "*"):  # left by a run killed while saving
        stale.unlink(missing_ok=True)
    path = directory / checkpoint_name(step)
    atomic_write(path, lambda file: torch.save(state, file))
    atomic_write(directory / LATEST, lambda file: file.write(f"{path.name}\n".encode()))
    if keep_last is not None and keep_last > 0:
        for old in list_checkpoints(directory)[:-keep_last]:
            if old != path and (keep is None or old.name != Path(keep).name):
                old.unlink(missing_ok=True)
    return path


def _read(path: Path) -> dict[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"{path}: cannot read training checkpoint ({error})") from None
    if not isinstance(state, dict) or "step" not in state or "model" not in state:
        raise ValueError(f"{path}: not a bertforge training checkpoint")
    return state


def load_checkpoint(path: str | os.PathLike) -> tuple[dict[str, Any], Path]:
    """A training state from a checkpoint file, or from the `latest` of a checkpoint directory.

    From a directory, a `latest` that cannot be read (truncated or corrupt: a disk that filled up, a copy
    cut short) falls back to the newest older checkpoint that can, with a warning naming both; a file given
    by name is read or refused, never replaced by another.
    """
    path = Path(path)
    if not path.is_dir():
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint not found: {path}")
        return _read(path), path
    found = latest_checkpoint(path)
    if found is None:
        raise FileNotFoundError(f"no checkpoint in {path}")
    older = [p for p in reversed(list_checkpoints(path)) if checkpoint_step(p) < checkpoint_step(found)]
    first_error = None
    for candidate in [found, *older]:
        try:
            state = _read(candidate)
        except ValueError as error:
            first_error = first_error or error
            logger.warning("%s", error)
            continue
        if candidate != found:
            logger.warning("the latest checkpoint %s cannot be read: resuming from %s, the newest one that can",
                           found.name, candidate)
        return state, candidate
    raise first_error


def rewind(directory: str | os.PathLike, good: Path | None) -> list[Path]:
    """Point `latest` back at `good` and set the later checkpoints aside (renamed `diverged-*`, kept for a
    look but no longer resumed from nor counted by keep_last). Returns the renamed files' new paths."""
    directory = Path(directory)
    step = checkpoint_step(good) if good is not None else -1
    moved = []
    for path in list_checkpoints(directory):
        if checkpoint_step(path) > step:
            target = path.with_name("diverged-" + path.name)
            os.replace(path, target)
            moved.append(target)
    if good is not None:
        atomic_write(directory / LATEST, lambda file: file.write(f"{Path(good).name}\n".encode()))
    elif (directory / LATEST).exists():
        (directory / LATEST).unlink()
    fsync_directory(directory)
    return moved


# -- RNG states -------------------------------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    """Every RNG this process draws from, as tensors and plain numbers (weights_only-loadable)."""
    version, internal, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss"]))
    numpy = state["numpy"]
    np.random.set_state((numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["position"],
                         numpy["has_gauss"], numpy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            logger.warning("checkpoint has CUDA RNG states of %d devices, this machine has %d: not restored",
                           len(cuda), torch.cuda.device_count())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
