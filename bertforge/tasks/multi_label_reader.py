"""Multi-label classification data: any number of labels per text.

Three layouts, by extension and first line:

* a TSV without a header, GoEmotions' as released: `text<TAB>comma-separated label ids<TAB>comment id`
  (the id column optional), split on tabs only, quotes NOT special (GoEmotions' texts hold unbalanced
  `"`s that a CSV reader would merge into the next rows). The ids index a label list given apart
  (`--labels FILE`: one name per line, in id order, GoEmotions' `emotions.txt`).
* a CSV, or a TSV whose header names a `text` column: columns `text`, optional `text_pair`, and `labels`
  (or `label`), a cell holding the names separated by `;` (`joy;love`), empty for none; standard CSV
  quoting.
* JSON lines: `{"text": ..., "labels": ["joy", "love"]}` (a list, or a string `"joy;love"`).

Bad input is one `ValueError` naming the file and line: an unknown label name, a label id out of range
or not in ASCII digits (`1_0`, `٣`: Python's `int` would read them as 10 and 3), a JSON label that is a
float or a file mixing string and integer labels (`[1, "1"]` would become one name), a row with no text,
a training file in which no row has a label (nothing to learn) and one in which every row has exactly one
label (single-label data: `bertforge finetune classify` trains that). A GoEmotions row whose text is the
word `text` is a row, not a header: a header's second field names a column, never label ids.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from .._files import read_text
from .classify_reader import CLASSIFY_EXTENSIONS, jsonl_records, names_shown, read_delimited_rows, sort_labels

__all__ = ["LABEL_SEPARATOR", "MultiLabelExample", "read_label_names", "read_multi_label_file"]

LABEL_SEPARATOR = ";"  # between the names of a CSV cell or a JSON string
LABEL_COLUMNS = ("labels", "label")  # the column (key) holding a row's labels, in order of preference


@dataclass
class MultiLabelExample:
    """One text (or text pair) and the ids of its labels (indexes into the label list, sorted; empty when
    none applies; None when the file gives none, e.g. an input to predict). `line`: its line in the file."""

    guid: str
    text_a: str
    text_b: str | None = None
    labels: tuple[int, ...] | None = None
    line: int = 0


def read_label_names(path: str | os.PathLike) -> list[str]:
    """Label names, one per line in id order (GoEmotions' emotions.txt; a last line without a newline is
    fine). A blank line, a name holding a comma (predictions list names comma-separated) or a name given
    twice is an error naming the line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"label file not found: {path}")
    lines = read_text(path).split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()  # the newline after the last name
    names: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        name = line.strip()
        if not name:
            raise ValueError(f"{path}:{number}: empty line (one label name per line)")
        _check_name(name, f"{path}:{number}")
        if name in names:
            raise ValueError(f"{path}:{number}: label {name!r} given twice (first on line {names[name]})")
        names[name] = number
    if len(names) < 2:
        raise ValueError(f"{path}: {len(names)} label name(s); a multi-label classifier needs two or more")
    return list(names)


def _check_name(name: str, where: str) -> None:
    if "," in name or not name.isprintable():
        raise ValueError(f"{where}: label name {name!r} holds a comma or a control character (predictions list "
                         "label names comma-separated)")


def _is_label_ids(field: str) -> bool:
    """Whether a field is GoEmotions' label ids: comma-separated ASCII digits (or empty: no label)."""
    return all(not piece.strip() or _is_ascii_number(piece.strip()) for piece in field.split(","))


def _is_ascii_number(raw: str) -> bool:
    """Whether `raw` is a whole number in ASCII digits 0-9 alone: `int()` would also take "1_0" (as 10), " 3",
    "+3" and other scripts' digits ("٣" as 3), none of which is a label id a file should hold."""
    return raw.isascii() and raw.isdigit()


def _headerless_tsv(path: Path) -> bool:
    """A .tsv in GoEmotions' layout (no header): its first line names no `text` column, or it is a row whose
    text is the word "text" (`text<TAB>27<TAB>id`: a header's second field is a column name, never label ids)."""
    first = read_text(path).split("\n", 1)[0].rstrip("\r")
    fields = [field.strip() for field in first.split("\t")]
    if "text" not in fields:
        return True
    return fields[0] == "text" and len(fields) > 1 and _is_label_ids(fields[1])


def _text(raw: Any, key: str, where: str) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"{where}: '{key}' must be a string, got {type(raw).__name__}")
    if not raw.strip():
        raise ValueError(f"{where}: no text (empty '{key}')")
    return raw


def _rows_by_id(path: Path, label_list: Sequence[str] | None, require_labels: bool) -> Iterator[tuple]:
    """(line, text, None, label names or None) per row of a GoEmotions-layout TSV."""
    lines = read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline after the last row
    for number, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        where = f"{path}:{number}"
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) > 3:
            raise ValueError(f"{where}: {len(fields)} tab-separated fields; expected text<TAB>label ids"
                             "[<TAB>id] (a TSV without a header line)")
        text = _text(fields[0], "text", where)
        if len(fields) == 1:
            if require_labels:
                raise ValueError(f"{where}: no label ids (expected text<TAB>comma-separated label ids[<TAB>id])")
            yield number, text, None, None
            continue
        if label_list is None:
            raise ValueError(f"{path}: a TSV without a header holds label ids (GoEmotions' layout): pass --labels "
                             "FILE naming them, one per line in id order")
        names = []
        for raw in filter(None, (piece.strip() for piece in fields[1].split(","))):
            if not _is_ascii_number(raw):
                raise ValueError(f"{where}: label id {raw!r} is not an integer in ASCII digits 0-9 (the second field "
                                 "holds comma-separated label ids)")
            index = int(raw)
            if not 0 <= index < len(label_list):
                raise ValueError(f"{where}: label id {index} is out of range: the label list has "
                                 f"{len(label_list)} labels (ids 0-{len(label_list) - 1})")
            names.append(label_list[index])
        yield number, text, None, names


class _LabelKinds:
    """Whether a JSON lines file names its labels by strings or by integers, from the first label seen: a
    file that mixes them (`[1, "1"]`, or `[1]` on one line and `["1"]` on another) is refused, as the two
    would silently become the same name "1"."""

    def __init__(self) -> None:
        self.kind: type | None = None
        self.where = ""

    def check(self, piece: Any, where: str) -> None:
        kind = str if isinstance(piece, str) else int
        if self.kind is None:
            self.kind, self.where = kind, where
        elif kind is not self.kind:
            seen = "names (strings)" if self.kind is str else "integers"
            raise ValueError(f"{where}: label {json.dumps(piece)} is {'a string' if kind is str else 'an integer'}, "
                             f"but the file's labels are {seen} (from {self.where}): give every label the same way")


def _label_names(raw: Any, where: str, kinds: _LabelKinds | None = None) -> list[str] | None:
    """The names of a CSV cell / JSON value: a list, or names separated by ';'; None when absent. A JSON
    label is a string or an integer (`kinds` keeps a file to one of the two); a float (`2.0`, `2.5`) is
    refused: it is neither a name nor an id."""
    if raw is None:
        return None
    if isinstance(raw, str):
        pieces = raw.split(LABEL_SEPARATOR)
    elif isinstance(raw, list):
        pieces = raw
    elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
        pieces = [raw]
    else:
        raise ValueError(f"{where}: labels must be a list of names or a string 'a{LABEL_SEPARATOR}b', "
                         f"got {type(raw).__name__}")
    names = []
    for piece in pieces:
        if isinstance(piece, bool) or not isinstance(piece, (str, int, float)):
            raise ValueError(f"{where}: a label must be a name (a string), got {json.dumps(piece)}")
        if isinstance(piece, float):
            raise ValueError(f"{where}: label {json.dumps(piece)} is a floating-point number: a label is a name "
                             "(a string) or an integer")
        name = str(piece).strip()
        if name:
            if kinds is not None:
                kinds.check(piece, where)
            _check_name(name, where)
            names.append(name)
    return names


def _rows_by_name(path: Path, kind: str, require_labels: bool) -> Iterator[tuple]:
    """(line, text, text pair, label names or None) per row of a CSV/TSV with a header, or of JSON lines."""
    kinds = _LabelKinds() if kind == "jsonl" else None  # a CSV cell is always a string
    if kind == "jsonl":
        records = jsonl_records(path, "text, labels")
    else:
        rows = read_delimited_rows(path, "," if kind == "csv" else "\t")
        _, header = next(rows)
        if "text" not in header:
            raise ValueError(f"{path}:1: no 'text' column in the header (found: {names_shown(header)}); expected "
                             f"columns text, optional text_pair, labels (names separated by '{LABEL_SEPARATOR}')")
        records = ((number, dict(zip(header, row))) for number, row in rows)
    for number, record in records:
        where = f"{path}:{number}"
        text = _text(record.get("text"), "text", where)
        pair = record.get("text_pair")
        if pair is not None and not (kind != "jsonl" and pair == ""):
            pair = _text(pair, "text_pair", where)
        else:
            pair = None
        column = next((name for name in LABEL_COLUMNS if name in record), None)
        raw = None if column is None else record[column]
        if raw is None and require_labels:
            what = "no 'labels' column in the header" if kind != "jsonl" else "no 'labels' key"
            raise ValueError(f"{where}: {what} (the names of the row's labels, a list or separated by "
                             f"'{LABEL_SEPARATOR}')")
        yield number, text, pair, _label_names(raw, where, kinds)


def read_multi_label_file(path: str | os.PathLike, *, label_list: Sequence[str] | None = None,
                          require_labels: bool = True,
                          training: bool = False) -> tuple[list[MultiLabelExample], list[str]]:
    """Read a multi-label file (the layouts in the module docstring); returns `(examples, label_list)`.

    `label_list`: the names of the label ids (the `--labels` file, or the training file's list when reading
    dev data, or a model's `id2label`); a name outside it is an error. Without one (a CSV/JSONL training
    file) the list is the sorted set of names found (`sort_labels`). `require_labels=False` reads inputs
    to predict: rows without labels give `labels=None`. `training=True`: a file in which every row has
    exactly one label is refused as single-label data.
    """
    path = Path(path)
    kind = CLASSIFY_EXTENSIONS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"{path}: unknown extension {path.suffix!r}; use .tsv (GoEmotions' layout, or a header "
                         "line), .csv, .jsonl or .json (JSON lines)")
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    if kind == "tsv" and _headerless_tsv(path):
        rows = _rows_by_id(path, label_list, require_labels)
    else:
        rows = _rows_by_name(path, kind, require_labels)
    parsed = list(rows)
    if not parsed:
        raise ValueError(f"{path}: no examples")
    if label_list is None:
        label_list = sort_labels(name for *_, names in parsed for name in names or ())
        if len(label_list) < 2:
            raise ValueError(f"{path}: {len(label_list)} distinct label(s) in the file; a multi-label classifier "
                             "needs two or more")
    index = {name: i for i, name in enumerate(label_list)}
    examples = []
    for number, text, pair, names in parsed:
        ids = None
        if names is not None:
            for name in names:
                if name not in index:
                    raise ValueError(f"{path}:{number}: unknown label {name!r}; the labels are "
                                     f"{names_shown(list(label_list))}")
            ids = tuple(sorted({index[name] for name in names}))
        examples.append(MultiLabelExample(f"{path.stem}-{len(examples)}", text, pair, ids, number))
    labelled = [e for e in examples if e.labels is not None]
    if training and labelled and not any(e.labels for e in labelled):
        raise ValueError(f"{path}: no row has a label (lines {labelled[0].line}-{labelled[-1].line}): there is "
                         "nothing to learn; check the labels column (or field)")
    if training and labelled and all(len(e.labels) == 1 for e in labelled):
        raise ValueError(f"{path}:{labelled[0].line}-{labelled[-1].line}: every row has exactly one label: this is "
                         "single-label data; use `bertforge finetune classify`")
    return examples, list(label_list)
