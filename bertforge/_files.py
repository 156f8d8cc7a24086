"""File helpers shared by every stage: atomic writes (checkpoints, models, features, shards), UTF-8 reading,
the marker of an unfinished run and the lock that gives an output directory to one run.

Every file a later step or a reader relies on is written through `atomic_open` (a file object) or
`atomic_path` (a file name, for writers such as safetensors): a temporary file beside the target, renamed
over it only when complete. A symlink is followed (its target is replaced, in the target's directory, and
the link stays); a path that is not a regular file (a FIFO, a device, a directory, a socket) is refused
before anything is written (`write_target`). A write that fills the disk raises `DiskFullError`, one
line naming the file.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from safetensors.torch import save_file


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


def fsync_directory(directory: str | os.PathLike) -> None:
    """fsync a directory, so that a rename inside it survives a power cut (where the platform allows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not possible on every platform; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- what a write replaces ---------------------------------------------------------------------------

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def special_kind(path: str | os.PathLike) -> str | None:
    """What `path` is when it exists and is not a regular file ("a FIFO (named pipe)", "a character device",
    ...); None for a regular file or a path that does not exist. Symlinks are followed."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def write_target(path: str | os.PathLike) -> str:
    """The file that writing `path` replaces: a symlink's final target (so that the link stays and what it
    points at gets the new content, as `open(path, "w")` would), `path` itself otherwise.

    ValueError (one line, naming `path`) when that is not a regular file: renaming a new file over a FIFO,
    a device node or a socket would destroy it (and its reader would get nothing). Checked before any work.
    """
    path = os.fspath(path)
    target = os.path.realpath(path) if os.path.islink(path) else path
    kind = special_kind(target)
    if kind is not None:
        shown = path if target == path else f"{path} (-> {target})"
        raise ValueError(f"{shown} is {kind}, not a regular file: refusing to write over it; give a file name")
    return target


class DiskFullError(OSError):
    """A write ran out of disk space (ENOSPC, or a disk quota): one line naming the file being written.

    Raised in place of the writer's own error (an OSError, torch's `RuntimeError: [enforce fail at
    inline_container.cc]`, safetensors' `SafetensorError ... No space left on device`); the file's previous
    content is kept, since the write went to a temporary file."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(errno.ENOSPC, "no space left on device", os.fspath(path))

    def __str__(self) -> str:
        return f"no space left on device writing {self.filename}"


_FULL_TEXTS = ("No space left on device", "Disk quota exceeded", "StorageFull")


def _shown_name(part: str) -> str:
    """A path component as an error message shows it: a long one cut to its first 40 characters."""
    return part if len(part) <= 48 else f"{part[:40]}...({len(os.fsencode(part))} bytes)"


def check_writable(path: str | os.PathLike, flag: str, directory: bool) -> None:
    """Refuse, before any work, a path a command will write that the file system cannot take: a component
    longer than its NAME_MAX (255 bytes on most) or a path longer than its PATH_MAX (ENAMETOOLONG), a
    directory to create under a file, an existing non-directory where a directory (`directory`) goes, or a
    place where nothing can be created (a read-only or pseudo file system such as /sys, no permission).

    Writability is probed, not guessed from permission bits (root passes those even on a read-only mount):
    a temporary directory is made in the nearest existing directory and removed at once. ValueError naming
    `flag`; nothing is left behind.
    """
    path = Path(path)
    absolute = Path(os.path.abspath(path))
    ancestor = absolute if directory else absolute.parent  # a file is written (replaced) in its directory
    while not os.path.lexists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    try:
        name_max = os.pathconf(ancestor if ancestor.is_dir() else ancestor.parent, "PC_NAME_MAX")
        path_max = os.pathconf(ancestor if ancestor.is_dir() else ancestor.parent, "PC_PATH_MAX")
    except (OSError, ValueError, TypeError):
        name_max, path_max = 255, 4096
    for part in absolute.parts:
        if len(os.fsencode(part)) > name_max:
            raise ValueError(f"{flag}: the name {_shown_name(part)!r} in it is {len(os.fsencode(part))} bytes long, "
                             f"over the file system's limit of {name_max} bytes per name")
    if len(os.fsencode(str(absolute))) >= path_max:
        raise ValueError(f"{flag}: the path is {len(os.fsencode(str(absolute)))} bytes long, over the file "
                         f"system's limit of {path_max - 1}")
    if absolute == ancestor and directory and not absolute.is_dir():
        raise ValueError(f"{flag} {path} exists and is not a directory")
    if not ancestor.is_dir():
        raise ValueError(f"{flag} {path}: {ancestor} is not a directory, nothing can be created under it")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".bertforge-write-check-", dir=ancestor))
    except OSError as error:
        raise ValueError(f"{flag} {path}: cannot write in {ancestor} ({error.strerror or error})") from None


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from or while handling, says the disk is full."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(text in str(error) for text in _FULL_TEXTS):
            return True
        error = error.__cause__ or error.__context__
    return False


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", *, encoding: str | None = None,
                newline: str | None = None, fsync: bool = False, prefix: str | None = None,
                temporary: str | None = None) -> Iterator[IO]:
    """`with atomic_open(path) as file:` writes to a temporary file beside `path` and renames it over `path`
    when the block ends cleanly; if the block raises, the temporary file is removed and `path` keeps its
    previous content. Why: a reader (or a resumed run) never sees a half-written file that looks finished.

    The temporary file gets the permissions a plain `open()` would give (`temporary_file`); `prefix`
    names it (default ".tmp."); `temporary` instead gives it a fixed name in the same directory (for
    writers whose leftovers are found and cleaned by name). `fsync`: flush the data to disk before the
    rename and the directory after it (checkpoints).

    A symlink `path` is followed: its target is replaced, with a temporary file in the target's directory
    (`write_target`); a FIFO, device, directory or socket is refused (ValueError) before anything is written.
    Running out of disk space raises `DiskFullError` naming `path`.
    """
    path = write_target(path)
    directory = os.path.dirname(path) or "."
    if temporary is None:
        handle, name = temporary_file(directory, prefix=prefix or ".tmp.", suffix=".part")
        file = os.fdopen(handle, mode, encoding=encoding, newline=newline)
    else:
        name = os.path.join(directory, temporary)
        file = open(name, mode, encoding=encoding, newline=newline)
    try:
        with file:
            yield file
            if fsync:
                file.flush()
                os.fsync(file.fileno())
        os.replace(name, path)
    except Exception as error:
        if is_disk_full(error) and not isinstance(error, DiskFullError):
            raise DiskFullError(path) from error
        raise
    finally:
        if os.path.exists(name):
            os.unlink(name)
    if fsync:
        fsync_directory(directory)


@contextmanager
def atomic_path(path: str | os.PathLike, prefix: str = ".tmp.") -> Iterator[str]:
    """`with atomic_path(path) as temporary:` for writers that take a file name, not a file (safetensors,
    `shutil.copyfile`): the block writes `temporary`, which is renamed over `path` when the block ends
    cleanly and removed if it raises. The result has `open()`'s default permissions even where the writer
    recreates the file owner-only. Symlinks, special files and a full disk as `atomic_open`."""
    path = write_target(path)
    handle, temporary = temporary_file(os.path.dirname(path) or ".", prefix=prefix, suffix=".tmp")
    os.close(handle)
    try:
        yield temporary
        os.chmod(temporary, default_mode())
        os.replace(temporary, path)
    except Exception as error:
        if is_disk_full(error) and not isinstance(error, DiskFullError):
            raise DiskFullError(path) from error
        raise
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def save_safetensors(tensors: dict, path: str | os.PathLike) -> None:
    """Write `tensors` to a safetensors file atomically: a reader never sees half a file."""
    with atomic_path(path, prefix=".model.") as temporary:
        save_file(tensors, temporary, metadata={"format": "pt"})


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
    with atomic_open(path, "w", encoding="utf-8", newline="") as out:
        out.write(text)


# -- unfinished runs -------------------------------------------------------------------------------

RUNNING = "RUNNING"  # in a run's output directory from its start until it finished


def mark_running(directory: str | os.PathLike, what: str) -> None:
    """Mark `directory` as holding an unfinished run: `RUNNING` is written before anything else.

    A run that fails, or is killed, leaves the marker behind, so that the model and results it kept so
    far (a best model so far, eval_results.json) are never mistaken for a finished run's: loaders refuse
    the directory (`check_finished`). `finish_run` removes the marker once every output is written.
    """
    os.makedirs(directory, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = (f"An unfinished run: {what}, started {started} (process {os.getpid()}), is still running, failed or "
            "was killed.\nThis file is removed when the run finishes; until then `predict`, `from_pretrained` and "
            "the pipelines refuse this directory.\n")
    with atomic_open(os.path.join(os.fspath(directory), RUNNING), "w", encoding="utf-8", prefix=".running.") as file:
        file.write(text)


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


# -- one run per output directory ------------------------------------------------------------------

LOCK = ".bertforge-lock"  # in a run's output directory while the run holds it (holds the run's process id)


def _holder(fd: int) -> str:
    """What the lock file says about the run holding it (its process id and command)."""
    for _ in range(20):  # the holder writes it just after locking
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        if text:
            return text
        time.sleep(0.05)
    return "process unknown"


def check_not_in_use(directory: str | os.PathLike) -> None:
    """Refuse (ValueError, one line, as `own_directory` would) a `directory` that another run holds now: for a
    command that does long work (a teacher's pass) before it takes the directory, so that it learns at once
    rather than after that work. Takes and drops the lock at once; never called while this process holds it
    (flock locks of two opens of one file conflict within a process too)."""
    path = os.path.join(os.fspath(directory), LOCK)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no lock file (or no directory): nobody holds it
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ValueError(f"{directory} is in use by another run ({_holder(fd)}): wait for it to end, or choose "
                         "another output directory") from None
    finally:
        os.close(fd)  # releases the lock if it was taken


@contextmanager
def own_directory(directory: str | os.PathLike, what: str, enabled: bool = True) -> Iterator[None]:
    """Hold `directory` for one run: an exclusive `flock` on `directory/.bertforge-lock`, taken before the
    run looks at what the directory holds and kept until the block ends (normally or not; the kernel
    releases it when the process dies, even by SIGKILL). A second run into the same directory is refused
    at once, in one line naming the first run's process id: two runs checking "does it already hold a
    run?" at the same moment would both pass, interleave their logs and leave one's model under the
    other's name.

    `enabled` False (the other ranks of a multi-process run) does nothing. A directory this call created
    is removed again if the run left nothing in it (its settings were refused).
    """
    if not enabled:
        yield
        return
    directory = os.fspath(directory)
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, default_mode())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise ValueError(f"{directory} is in use by another run ({holder}): wait for it to end, or choose "
                             "another output directory") from None
        try:  # the previous holder may have removed the file between our open and flock: lock the one in place
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        if current is not None and os.path.samestat(os.fstat(fd), current):
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"process {os.getpid()}: {what}\n".encode())
        yield
    finally:
        try:
            os.unlink(path)  # while still locked: a run waiting on this file retries with a fresh one
        except FileNotFoundError:
            pass
        os.close(fd)
        if created:
            try:
                os.rmdir(directory)  # only if empty
            except OSError:
                pass
