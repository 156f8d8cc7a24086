"""Reading a checkpoint's small files (`config.json`, `tokenizer_config.json`, `vocab.txt`) safely.

A checkpoint directory is user input: its `config.json` may be a link to `/dev/zero` or a FIFO, or
a file of gigabytes, and a plain `read_text()` would then wait forever or run out of memory. Here a
file is read only if it is a regular file no larger than a bound, and every way it can be malformed
(not UTF-8, not JSON, nested too deep, not an object) is a ValueError naming the file. The helpers
live in the lowest layer (tokenization) because both the tokenizer and the model read such files.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

# Generous bounds: a config with ten thousand labels is under 1 MiB, the largest BERT vocabularies
# (multilingual, a quarter million tokens) a few MiB.
JSON_LIMIT = 16 << 20
VOCAB_LIMIT = 256 << 20


def read_bounded(path: str | os.PathLike, limit: int, what: str) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them.

    FileNotFoundError if it is absent; ValueError, naming the file and `what` it should be, if it is not
    a regular file (a FIFO, a device such as /dev/zero, a directory) or is larger than `limit` bytes.
    """
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {path}") from None
    except OSError as error:
        raise ValueError(f"{path}: cannot read the {what} ({error.strerror})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ValueError(f"{path}: not a regular file (a device, FIFO or directory); the {what} must be one")
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > limit:
            raise ValueError(f"{path}: {info.st_size:,} bytes, larger than a {what} can be ({limit:,} at most)")
        data = handle.read(limit + 1)
    if len(data) > limit:  # (grew while being read)
        raise ValueError(f"{path}: larger than a {what} can be ({limit:,} bytes at most)")
    return data


def decode_utf8(data: bytes, path: str | os.PathLike) -> str:
    """`data` as UTF-8 text; a byte that is not UTF-8 is a ValueError naming the file and line."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text (byte 0x{data[error.start]:02x} at byte offset "
                         f"{error.start})") from None


def read_json_object(path: str | os.PathLike, what: str, limit: int = JSON_LIMIT) -> dict[str, Any]:
    """The JSON object in `path` (a leading byte-order mark allowed): ValueError naming the file if it
    is not a regular file of at most `limit` bytes holding one JSON object."""
    data = read_bounded(path, limit, what)
    text = decode_utf8(data[3:] if data.startswith(b"\xef\xbb\xbf") else data, path)
    try:
        values = json.loads(text)
    except RecursionError:
        raise ValueError(f"{path}: not valid JSON (nested too deeply)") from None
    except ValueError as error:  # JSONDecodeError, and an integer of too many digits
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(values, dict):
        raise ValueError(f"{path}: the {what} must be a JSON object ({{...}}), not {type(values).__name__}")
    return values


def shown(value: Any, limit: int = 60) -> str:
    """`value` as JSON, cut to about `limit` characters: an error message quotes it in one short line."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (RecursionError, TypeError, ValueError):
        text = f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit] + "..."
