"""Sentence(-pair) classification data: examples and the reader of the user's own files.

* `InputExample`: one example, as in Google's `run_classifier.py` (the GLUE readers of
  `bertforge.tasks.glue_data` build them too).
* `read_classify_file(path)`: CSV, TSV or JSON-lines with `text`, optional `text_pair`, `label`.
* `read_delimited_rows(path)`: the rows of any CSV/TSV with a header line, errors naming `file:line`
  (the SWAG reader of `bertforge.tasks.multiple_choice` uses it too).

Labels: a classification task has a label list (strings); a feature's label is the index into it,
which is the id the model predicts and what `config.id2label = dict(enumerate(label_list))`
records. A regression task (STS-B; `regression=True`) has no label list and float labels.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from .._files import read_text

__all__ = ["CLASSIFY_EXTENSIONS", "InputExample", "id2label", "names_shown", "read_classify_file",
           "read_delimited_rows", "sort_labels"]


@dataclass
class InputExample:
    """One example. `guid` is "<set>-<id>": "train-17", "dev_matched-4", "test-0"; the part after
    the last "-" is the example's id in its file (the `index` of a GLUE test file), see `id`.
    `label` is the label string, the float score of a regression task, or None when unlabelled."""

    guid: str
    text_a: str
    text_b: str | None = None
    label: str | float | None = None

    @property
    def id(self) -> str:
        """The id within its file: what a GLUE submission's `index` column holds for a test example."""
        return self.guid.rpartition("-")[2]


# ---------------------------------------------------------------------------- the user's own files

CLASSIFY_EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}


def sort_labels(labels) -> list[str]:
    """The label list in a deterministic order: numerically when every label is an integer
    ("2" before "10"), else lexicographically. Label id i is the i-th entry."""
    unique = set(labels)
    try:
        return sorted(unique, key=int)
    except ValueError:
        return sorted(unique)


def id2label(label_list: Sequence[str]) -> dict[int, str]:
    """The mapping to store as `BertConfig.id2label` (saved in config.json with the model)."""
    return dict(enumerate(label_list))


def _classify_label(raw: Any, regression: bool, where: str) -> str | float:
    if regression:
        if isinstance(raw, bool):
            raise ValueError(f"{where}: label {raw!r} is not a number (regression=True)")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: label {raw!r} is not a number (regression=True needs a numeric "
                             f"label; drop regression=True for class labels)") from None
        if not math.isfinite(value):
            raise ValueError(f"{where}: label {raw!r} is not a finite number")
        return value
    if isinstance(raw, bool):
        return str(raw).lower()  # JSON true/false
    if isinstance(raw, int):
        return str(raw)
    if isinstance(raw, float):
        if raw.is_integer():
            return str(int(raw))
        raise ValueError(f"{where}: label {raw!r} is a fractional number; for a regression task "
                         f"use regression=True")
    if isinstance(raw, str):
        label = raw.strip()
        if not label:
            raise ValueError(f"{where}: empty label")
        return label
    raise ValueError(f"{where}: label must be a string or a number, got {type(raw).__name__}")


def _classify_text(raw: Any, key: str, where: str) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"{where}: '{key}' must be a string, got {type(raw).__name__}")
    if not raw.strip():
        raise ValueError(f"{where}: empty '{key}'")
    return raw


def names_shown(names: Sequence[str], limit: int = 12, width: int = 40) -> str:
    """Column names (or keys) for a one-line error message: a name holding a line break or another
    control character (a corrupted header) is quoted, a long one cut, a long list shortened."""
    def one(name: str) -> str:
        name = name if len(name) <= width else name[:width - 3] + "..."
        return name if name.isprintable() else repr(name)

    shown = ", ".join(one(str(name)) for name in list(names)[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def read_delimited_rows(path: str | os.PathLike, delimiter: str = ",", *,
                        header_hint: str = "a header line naming the columns") -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) per row of a CSV/TSV file: first its header (line 1, names stripped of
    white space), then each data row.

    Standard CSV quoting (what pandas, Excel and the csv module write): a field holding the
    delimiter, a newline or a leading quote is quoted, `"` inside it doubled; a row's number is that
    of its first line. Blank lines are skipped. Errors name `file:line`: a malformed row, a data row
    whose number of fields differs from the header's, an empty file (`header_hint` says what its
    first line should have been). A generator: the caller checks the header before any data row is
    read, so a bad header is reported first.
    """
    with io.StringIO(read_text(path), newline="") as handle:
        reader = csv.reader(handle, delimiter=delimiter)
        try:
            header = next(reader, None)
        except csv.Error as error:
            raise ValueError(f"{path}:1: {error}") from None
        if header is None:
            raise ValueError(f"{path}: empty file (expected {header_hint})")
        header = [name.strip() for name in header]
        yield 1, header
        while True:
            start = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                raise ValueError(f"{path}:{start}: {error}") from None
            if not row:  # a blank line
                continue
            if len(row) != len(header):
                raise ValueError(f"{path}:{start}: expected {len(header)} fields ({names_shown(header)}), "
                                 f"found {len(row)}")
            yield start, row


def _records_delimited(path: Path, delimiter: str):
    """(line number, {column: value}) per data row of a CSV/TSV with a header line."""
    rows = read_delimited_rows(path, delimiter)
    _, header = next(rows)
    if "text" not in header:
        raise ValueError(f"{path}:1: no 'text' column in the header (found: {names_shown(header)}); "
                         f"expected columns text, optional text_pair, label")
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        raise ValueError(f"{path}:1: duplicate column(s) {names_shown(duplicates)}")
    for start, row in rows:
        yield start, dict(zip(header, row))


def jsonl_records(path: Path, keys: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSONL file; a line that is not a JSON object is an
    error naming the file, the line and `keys` (the keys a record should have, as the message says them)."""
    with io.StringIO(read_text(path), newline=None) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error.msg} at column {error.colno})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object with keys {keys}; "
                                 f"got {type(record).__name__}")
            yield number, record


def _records_jsonl(path: Path):
    for number, record in jsonl_records(path, "text, optional text_pair, label"):
        if "text" not in record:
            raise ValueError(f"{path}:{number}: no 'text' key (found: {names_shown(record) or 'none'})")
        yield number, record


def read_classify_file(path: str | os.PathLike, regression: bool = False, *,
                       label_list: Sequence[str] | None = None,
                       require_labels: bool = True) -> tuple[list[InputExample], list[str] | None]:
    """Read the user's own classification (or regression) data.

    By extension: `.csv`, `.tsv` (a header line naming the columns) or `.jsonl` / `.json` (one JSON
    object per line). Columns/keys: `text`, optional `text_pair`, and `label`; others are ignored.

    Returns `(examples, label_list)`. For classification the label list is the sorted set of the
    labels found (see `sort_labels`) unless `label_list` is given, the training set's, in which
    case a dev/test label outside it is an error: read the training file first and pass its list
    on, and save it with the model as `config.id2label = id2label(label_list)`. With
    `regression=True`, labels are floats and the label list is None.

    `require_labels=False` reads unlabelled files (for prediction): a file without a label
    column, or rows whose label is missing (JSON: absent or null), give `label=None`.
    Errors name `file:line`.
    """
    path = Path(path)
    kind = CLASSIFY_EXTENSIONS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"{path}: unknown extension {path.suffix!r}; use .csv, .tsv, .jsonl or .json (JSON lines)")
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    if regression and label_list is not None:
        raise ValueError("a regression task has no label list")
    records = _records_jsonl(path) if kind == "jsonl" else _records_delimited(path, "," if kind == "csv" else "\t")
    known = None if label_list is None else {label: i for i, label in enumerate(label_list)}
    examples = []
    for number, record in records:
        where = f"{path}:{number}"
        text = _classify_text(record["text"], "text", where)
        pair = record.get("text_pair")
        if pair is not None:
            pair = _classify_text(pair, "text_pair", where)
        raw = record.get("label")
        if isinstance(raw, str) and not raw.strip() and not require_labels:
            raw = None  # an empty cell in an unlabelled file
        if raw is None:
            if require_labels:
                what = ("no 'label' column in the header" if kind != "jsonl" else
                        "no 'label' key" if "label" not in record else "label is null")
                raise ValueError(f"{where}: {what}; pass require_labels=False to read unlabelled data")
            label = None
        else:
            label = _classify_label(raw, regression, where)
            if known is not None and label not in known:
                raise ValueError(f"{where}: label {label!r} is not one of the training labels {list(label_list)}")
        examples.append(InputExample(f"{path.stem}-{len(examples)}", text, pair, label))
    if not examples:
        raise ValueError(f"{path}: no examples")
    if regression:
        return examples, None
    if label_list is not None:
        return examples, list(label_list)
    found = [e.label for e in examples if e.label is not None]
    return examples, (sort_labels(found) if found else None)
