"""The data readers under random (seeded) corruption of the real files in ../shared/data (and the SWAG
fixture): truncated lines, dropped or duplicated columns, bytes that are not UTF-8, broken JSON, values
of the wrong type, empty files... Every case must end in a correct parse or in the project's error, a
one-line ValueError naming the file, never in another exception or a traceback. Only the first few
hundred lines of each file are used, so the whole test takes seconds."""

from __future__ import annotations

import copy
import csv
import io
import json
import random
from pathlib import Path

import pytest

from bertforge.tasks.multiple_choice import read_swag_file
from bertforge.tasks.classify_reader import read_classify_file
from bertforge.tasks.glue_data import read_glue_examples
from bertforge.tasks.squad_data import read_squad_file
from bertforge.tasks.conll import read_conll

SWAG = Path(__file__).resolve().parents[1] / "fixtures" / "swag" / "val.csv"
CASES_PER_FORMAT = 60
LINES = 300


def _head(path: Path, lines: int = LINES) -> bytes:
    with open(path, "rb") as handle:
        return b"".join(handle.readline() for _ in range(lines))


def _sources(shared: Path) -> dict[str, bytes]:
    """The clean first lines of each format (CSV and JSONL are SST-2's rows in those layouts)."""
    sst2 = _head(shared / "glue" / "SST-2" / "train.tsv").decode("utf-8").splitlines()[1:]
    rows = [line.rsplit("\t", 1) for line in sst2]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["text", "label"])
    writer.writerows(rows)
    squad = json.loads((shared / "squad" / "v1.1" / "train-v1.1.first11.json").read_text(encoding="utf-8"))
    squad["data"] = squad["data"][:1]
    squad["data"][0]["paragraphs"] = squad["data"][0]["paragraphs"][:6]
    return {
        "glue": _head(shared / "glue" / "SST-2" / "train.tsv"),
        "stsb": _head(shared / "glue" / "STS-B" / "dev.tsv"),
        "csv": buffer.getvalue().encode("utf-8"),
        "jsonl": "".join(json.dumps({"text": t, "label": int(l)}) + "\n" for t, l in rows).encode("utf-8"),
        "conll": _head(shared / "conll2003" / "train.txt"),
        "squad": json.dumps(squad, indent=1).encode("utf-8"),
        "swag": _head(SWAG, 120),
    }


DELIMITERS = {"glue": b"\t", "stsb": b"\t", "csv": b",", "jsonl": b",", "conll": b" ", "squad": b",", "swag": b","}


def _corrupt_lines(data: bytes, delimiter: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One random byte-level corruption of a file: (what was done, the corrupted bytes)."""
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    kind = rng.choice(["truncate", "drop column", "duplicate column", "invalid bytes", "empty file", "header only",
                       "join lines", "stray quote", "blank line", "garbage cell", "nul byte", "crlf and bom",
                       "duplicate line", "drop line", "cut byte"])
    if kind == "truncate":  # the file ends mid-line
        return kind, data[:rng.randrange(len(data))]
    if kind in ("drop column", "duplicate column", "garbage cell"):
        cells = lines[i].split(delimiter)
        j = rng.randrange(len(cells))
        if kind == "drop column":
            del cells[j]
        elif kind == "duplicate column":
            cells.insert(j, cells[j])
        else:
            cells[j] = rng.choice([b"", b"-1", b"nan", b"1e999", b"\"", b"{", b"B-", b"xyz", b"\xc3", b"null"])
        lines[i] = delimiter.join(cells)
    elif kind == "invalid bytes":
        position = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:position] + rng.choice([b"\xe9", b"\xff\xfe", b"\xc3", b"\xed\xa0\x80"]) + \
            lines[i][position:]
    elif kind == "empty file":
        return kind, b""
    elif kind == "header only":
        return kind, lines[0] + b"\n"
    elif kind == "join lines" and i + 1 < len(lines):
        lines[i:i + 2] = [lines[i] + lines[i + 1]]
    elif kind == "stray quote":
        position = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:position] + b'"' + lines[i][position:]
    elif kind == "blank line":
        lines.insert(i, b"")
    elif kind == "nul byte":
        lines[i] = lines[i] + b"\x00"
    elif kind == "crlf and bom":
        return kind, b"\xef\xbb\xbf" + data.replace(b"\n", b"\r\n")
    elif kind == "duplicate line":
        lines.insert(i, lines[i])
    elif kind == "drop line":
        del lines[i]
    elif kind == "cut byte" and lines[i]:
        position = rng.randrange(len(lines[i]))
        lines[i] = lines[i][:position] + lines[i][position + 1:]
    return f"{kind} at line {i + 1}", b"\n".join(lines)


WRONG_VALUES = [None, 0, -3, 1.5, True, "", "x", [], {}, [1, 2], {"text": 1}]


def _corrupt_json(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """A structural corruption of a SQuAD file: a value of the wrong type, or a key removed."""
    root = json.loads(data)
    node, path = root, []
    while isinstance(node, (dict, list)) and node and (not path or rng.random() < 0.8):
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append(key)
        node = node[key]
    if not path:
        return "root replaced", json.dumps(rng.choice(WRONG_VALUES)).encode()
    corrupted = copy.deepcopy(root)
    target = corrupted
    for key in path[:-1]:
        target = target[key]
    if rng.random() < 0.3 and isinstance(target, dict):
        del target[path[-1]]
        return f"removed {path}", json.dumps(corrupted).encode()
    target[path[-1]] = rng.choice(WRONG_VALUES)
    return f"wrong type at {path}", json.dumps(corrupted).encode()


def _read(kind: str, path: Path):
    if kind == "glue":
        return read_glue_examples("sst2", path.parent.parent, "train")
    if kind == "stsb":
        return read_glue_examples("stsb", path.parent.parent, "dev")
    if kind in ("csv", "jsonl"):
        return read_classify_file(path)[0]
    if kind == "conll":
        return read_conll(path)
    if kind == "squad":
        return read_squad_file(path).examples
    return read_swag_file(path)


FILE_NAMES = {"glue": "SST-2/train.tsv", "stsb": "STS-B/dev.tsv", "csv": "data.csv", "jsonl": "data.jsonl",
              "conll": "train.txt", "squad": "train.json", "swag": "val.csv"}


@pytest.mark.parametrize("kind", sorted(FILE_NAMES))
def test_corrupted_files_parse_or_fail_with_one_line_naming_the_file(kind, shared_data, tmp_path):
    clean = _sources(shared_data)[kind]
    path = tmp_path / "glue" / FILE_NAMES[kind]
    path.parent.mkdir(parents=True)
    path.write_bytes(clean)
    assert _read(kind, path), "the clean file must parse"
    rng = random.Random(f"fuzz-{kind}")
    outcomes = {"parsed": 0, "error": 0}
    for case in range(CASES_PER_FORMAT):
        if kind == "squad" and case % 2:
            what, data = _corrupt_json(clean, rng)
        else:
            what, data = _corrupt_lines(clean, DELIMITERS[kind], rng)
        path.write_bytes(data)
        try:
            examples = _read(kind, path)
        except ValueError as error:
            message = str(error)
            assert str(path) in message and "\n" not in message, f"case {case} ({what}): {message!r}"
            outcomes["error"] += 1
        except Exception as error:  # noqa: BLE001 - the point of the test
            pytest.fail(f"case {case} ({what}): {type(error).__name__}: {error}")
        else:
            assert examples, f"case {case} ({what}): parsed to nothing without an error"
            outcomes["parsed"] += 1
    assert outcomes["error"] > 0  # the corruptions do bite
