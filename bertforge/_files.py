"""File helpers shared by every stage that writes atomically (checkpoints, models, features)."""

from __future__ import annotations

import os
import tempfile


def temporary_file(directory: str | os.PathLike, prefix: str, suffix: str = "") -> tuple[int, str]:
    """`tempfile.mkstemp` in `directory`, with the permissions a plain `open()` would give.

    mkstemp makes files readable by their owner only (0600); renamed into place, a model or a
    checkpoint written for a team would stay unreadable to the others.
    """
    handle, name = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=suffix)
    os.fchmod(handle, default_mode())
    return handle, name


def default_mode() -> int:
    """The permission bits `open()` gives a new file under the current umask (0644 under 022)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def save_safetensors(tensors: dict, path: str | os.PathLike) -> None:
    """Write `tensors` to a safetensors file atomically: a reader never sees half a file."""
    from safetensors.torch import save_file

    path = os.fspath(path)
    handle, temporary = temporary_file(os.path.dirname(path) or ".", prefix=".model.", suffix=".tmp")
    os.close(handle)
    try:
        save_file(tensors, temporary, metadata={"format": "pt"})
        os.chmod(temporary, default_mode())  # safetensors recreates the file owner-only
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` through a temporary file renamed into place: a reader never sees half a file."""
    path = os.fspath(path)
    handle, temporary = temporary_file(os.path.dirname(path) or ".", prefix=".write.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
