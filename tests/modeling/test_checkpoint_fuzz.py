"""The checkpoint readers under random (seeded) corruption, as tests/tasks/test_reader_fuzz.py does for the
data readers: `config.json`, `tokenizer_config.json` and `vocab.txt` of a small valid checkpoint get a
value of the wrong type, a key removed, bytes cut or made invalid, lines dropped, repeated or joined...
Every case must load or end in the project's error, one ValueError line naming the file, never another
exception, and each in bounded time."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import pytest
import torch

from bertforge.modeling import BertConfig, BertForSequenceClassification, BertModel
from bertforge.modeling.pretrained import check_pretrained
from bertforge.tokenization import BertTokenizer

CASES = 80
WORDS = "the a is was of and to in who what good bad film paris france ##s ##ed ##ing".split()
WRONG_VALUES = [None, 0, -3, 1.5, 64.0, True, False, "", "x", "512", "1e-12", [], {}, [1, 2], {"0": "a", "2": "b"},
                math.nan, math.inf, -math.inf, 10**30, 2**31, "gelu", 1e-300]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> dict[str, bytes]:
    """The three files of a valid tiny classifier checkpoint (2 layers), and its weights."""
    directory = tmp_path_factory.mktemp("fuzz_source")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","] + WORDS
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    BertTokenizer(directory / "vocab.txt", do_lower_case=True).save_pretrained(directory)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, id2label={0: "neg", 1: "pos"})
    BertForSequenceClassification(config).save_pretrained(directory)
    return {name: (directory / name).read_bytes()
            for name in ("config.json", "tokenizer_config.json", "vocab.txt", "model.safetensors")}


def _corrupt_json(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """A value of the wrong type (at the top or one level down), a key removed or added, or a byte-level cut."""
    values = json.loads(data)
    kind = rng.choice(["wrong value", "wrong value", "wrong value", "drop key", "nested value", "root",
                       "truncate", "invalid bytes", "nul byte", "bom", "cut byte"])
    key = rng.choice(sorted(values))
    if kind == "wrong value":
        values[key] = rng.choice(WRONG_VALUES)
        return f"{key} = {values[key]!r}", json.dumps(values).encode()
    if kind == "drop key":
        del values[key]
        return f"without {key}", json.dumps(values).encode()
    if kind == "nested value":
        values[key] = {rng.choice(["0", "1", "x", "-1"]): rng.choice(WRONG_VALUES)}
        return f"{key} = {values[key]!r}", json.dumps(values).encode()
    if kind == "root":
        return kind, json.dumps(rng.choice(WRONG_VALUES)).encode()
    if kind == "truncate":
        return kind, data[:rng.randrange(len(data))]
    position = rng.randrange(len(data))
    if kind == "invalid bytes":
        return kind, data[:position] + rng.choice([b"\xe9", b"\xff\xfe", b"\xc3", b"\xed\xa0\x80"]) + data[position:]
    if kind == "nul byte":
        return kind, data[:position] + b"\x00" + data[position:]
    if kind == "bom":
        return kind, b"\xef\xbb\xbf" + data
    return kind, data[:position] + data[position + 1:]


def _corrupt_lines(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    kind = rng.choice(["truncate", "invalid bytes", "empty file", "join lines", "blank line", "two blank lines",
                       "nul byte", "crlf and bom", "crlf", "duplicate line", "drop line", "cut byte", "many lines",
                       "swap lines"])
    if kind == "truncate":
        return kind, data[:rng.randrange(len(data))]
    if kind == "empty file":
        return kind, b""
    if kind == "crlf and bom":
        return kind, b"\xef\xbb\xbf" + data.replace(b"\n", b"\r\n")
    if kind == "crlf":
        return kind, data.replace(b"\n", b"\r\n")
    if kind == "many lines":  # more tokens than the embeddings have rows
        return kind, data + b"".join(b"new%d\n" % n for n in range(rng.choice([1, 50, 200])))
    if kind == "invalid bytes":
        lines[i] = lines[i] + rng.choice([b"\xe9", b"\xff\xfe", b"\xc3", b"\xed\xa0\x80"])
    elif kind == "join lines" and i + 1 < len(lines):
        lines[i:i + 2] = [lines[i] + lines[i + 1]]
    elif kind == "blank line":
        lines.insert(i, b"")
    elif kind == "two blank lines":
        lines[i:i] = [b"", b""]
    elif kind == "nul byte":
        lines[i] = lines[i] + b"\x00"
    elif kind == "duplicate line":
        lines.insert(i, lines[i])
    elif kind == "drop line":
        del lines[i]
    elif kind == "swap lines":
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif kind == "cut byte" and lines[i]:
        position = rng.randrange(len(lines[i]))
        lines[i] = lines[i][:position] + lines[i][position + 1:]
    return f"{kind} at line {i + 1}", b"\n".join(lines)


def _load_all(directory: Path) -> None:
    """What a command does with a checkpoint: the up-front check, the tokenizer, the model (two classes)."""
    check_pretrained(directory)
    BertTokenizer.from_pretrained(directory)
    BertModel.from_pretrained(directory)
    BertForSequenceClassification.from_pretrained(directory)


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "vocab.txt"])
def test_corrupted_checkpoint_files_load_or_fail_in_one_line(checkpoint, name, tmp_path):
    rng = random.Random(f"checkpoint-fuzz-{name}")
    corrupt = _corrupt_lines if name == "vocab.txt" else _corrupt_json
    outcomes = {"loaded": 0, "refused": 0}
    for case in range(CASES):
        directory = tmp_path / f"case{case}"
        directory.mkdir()
        for file, data in checkpoint.items():
            (directory / file).write_bytes(data)
        what, data = corrupt(checkpoint[name], rng)
        (directory / name).write_bytes(data)
        start = time.perf_counter()
        try:
            _load_all(directory)
            outcomes["loaded"] += 1
        except ValueError as error:
            message = str(error)
            assert "\n" not in message and len(message) < 1000, f"{name}, {what}: {message!r}"
            assert str(directory) in message, f"{name}, {what}: the error does not name the file: {message}"
            outcomes["refused"] += 1
        except Exception as error:  # anything else is a bug: say which corruption caused it
            pytest.fail(f"{name}, {what}: {type(error).__name__}: {error}")
        assert time.perf_counter() - start < 5, f"{name}, {what}: too slow"
    # Both outcomes occur: the corruptions are neither all harmless nor all fatal.
    assert outcomes["loaded"] and outcomes["refused"], outcomes
