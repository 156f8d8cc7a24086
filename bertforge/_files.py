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


def read_text(path: str | os.PathLike) -> str:
    """The whole of a UTF-8 text file (a leading byte-order mark dropped), newlines untranslated.

    A byte that is not UTF-8 is a `ValueError` naming the file, line and byte offset: every data
    reader goes through here so that a Latin-1 file never surfaces as a bare `UnicodeDecodeError`
    without a file name. Newlines are kept as written so that the csv module sees quoted ones.
    """
    with open(path, "rb") as handle:
        data = handle.read()
    start = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as error:
        offset = start + error.start
        line = data.count(b"\n", 0, offset) + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text (byte 0x{data[offset]:02x} at byte offset {offset}); "
                         f"re-save the file as UTF-8") from None


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` through a temporary file renamed into place: an interrupted
    write never leaves a truncated file that looks finished, and never half-replaces an old one."""
    path = os.fspath(path)
    handle, temporary = temporary_file(os.path.dirname(path) or ".", prefix=".tmp.", suffix=".part")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


# -- unfinished runs -------------------------------------------------------------------------------

RUNNING = "RUNNING"  # in a run's output directory from its start until it finished


def mark_running(directory: str | os.PathLike, what: str) -> None:
    """Mark `directory` as holding an unfinished run: `RUNNING` is written before anything else.

    A run that fails, or is killed, leaves the marker behind, so that the model and results it kept so
    far (a best model so far, eval_results.json) are never mistaken for a finished run's: loaders refuse
    the directory (`check_finished`). `finish_run` removes the marker once every output is written.
    """
    import datetime

    os.makedirs(directory, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = (f"An unfinished run: {what}, started {started} (process {os.getpid()}), is still running, failed or "
            "was killed.\nThis file is removed when the run finishes; until then `predict`, `from_pretrained` and "
            "the pipelines refuse this directory.\n")
    path = os.path.join(os.fspath(directory), RUNNING)
    handle, temporary = temporary_file(directory, prefix=".running.", suffix=".tmp")
    with os.fdopen(handle, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(temporary, path)


def finish_run(directory: str | os.PathLike) -> None:
    """Remove `directory`'s RUNNING marker: every output of the run is in place."""
    try:
        os.unlink(os.path.join(os.fspath(directory), RUNNING))
    except FileNotFoundError:
        pass


def check_finished(directory: str | os.PathLike) -> None:
    """Refuse a model directory whose run has not finished (see `mark_running`), in one line.

    Raises ValueError (the CLI's one-line error) naming the directory and what to do about it.
    """
    if os.path.isfile(os.path.join(os.fspath(directory), RUNNING)):
        raise ValueError(f"{directory} holds an unfinished run ({RUNNING} marker: still running, failed or "
                         f"killed): finish it with the same command and --resume, or delete {RUNNING} to use the "
                         "model it kept so far")
