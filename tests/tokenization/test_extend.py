"""`vocab --extend`: a domain's words in the [unusedN] slots of all-MiniLM-L6-v2's vocabulary (bert-base-uncased's).

The domain is Alice in Wonderland (144 kB): the counts the report gives are recomputed here with the
tokenizer itself, line by line, and the model gives bit-identical outputs through the extended
vocabulary on every text whose words do not start with a new word.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from bertforge import BertModel
from bertforge.cli import main
from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer, load_vocab
from bertforge.tokenization.extend import UNUSED, basic_words, extend_vocab, report_path, unused_slots
from bertforge.tokenization.reference import BasicTokenizer


@pytest.fixture(scope="module")
def book(shared_data) -> Path:
    return shared_data / "pretraining" / "books" / "Carroll_Alice_1865.txt"


@pytest.fixture(scope="module")
def lines(book) -> list[str]:
    return book.read_text(encoding="utf-8").split("\n")


@pytest.fixture(scope="module")
def extended(minilm_dir, lines, tmp_path_factory) -> tuple[dict, Path]:
    """MiniLM's vocabulary extended with Alice's words: the report and a model directory using it
    (MiniLM's own weights and tokenizer settings, linked)."""
    directory = tmp_path_factory.mktemp("extended")
    for name in ("config.json", "model.safetensors", "tokenizer_config.json"):
        (directory / name).symlink_to(minilm_dir / name)
    report = extend_vocab(minilm_dir, lines, directory / "vocab.txt")
    return report, directory


@pytest.fixture(scope="module")
def original_tokenizer(minilm_dir) -> BertTokenizer:
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def extended_tokenizer(extended) -> BertTokenizer:
    return BertTokenizer.from_pretrained(extended[1])


def test_alice_known_answer(extended, lines, original_tokenizer, extended_tokenizer):
    report, directory = extended
    assert report["unused_slots"] == 994  # bert-base-uncased's
    # Alice holds 36 words seen twice or more that bert-base-uncased splits into 3 or more pieces.
    assert report["new_words"] == 36 and report["unused_slots_left"] == 994 - 36
    top = report["added"][:2]
    assert [(a["token"], a["id"], a["replaced"], a["pieces_before"]) for a in top] == [
        ("gryphon", 1, "[unused0]", 3), ("caterpillar", 2, "[unused1]", 3)]
    text = "\n".join(lines).lower()
    for added in top:  # the counts are the word's occurrences in the text (also in "gryphon's")
        assert added["count"] == len(re.findall(rf"(?<![a-z0-9]){added['token']}(?![a-z0-9])", text))
    assert original_tokenizer.tokenize("The Gryphon") == ["the", "gr", "##yp", "##hon"]
    assert extended_tokenizer.tokenize("The Gryphon's") == ["the", "gryphon", "'", "s"]

    # The report's figures are what the tokenizers themselves give, line by line.
    basic = BasicTokenizer(do_lower_case=True)
    assert report["words"] == sum(len(basic.tokenize(line)) for line in lines) == 35_599
    assert report["before"]["tokens"] == sum(len(original_tokenizer.tokenize(line)) for line in lines)
    assert report["after"]["tokens"] == sum(len(extended_tokenizer.tokenize(line)) for line in lines)
    assert report["after"]["tokens"] < report["before"]["tokens"]
    assert report["before"]["tokens_per_word"] == report["before"]["tokens"] / report["words"]
    assert report["new_word_occurrences"] == sum(a["count"] for a in report["added"])
    # Each new word's occurrences were 3+ tokens and are now one; so the single-token count grows by them.
    assert (report["after"]["single_token_words"] - report["before"]["single_token_words"]
            == report["new_word_occurrences"])
    assert json.loads(report_path(directory / "vocab.txt").read_text(encoding="utf-8")) == report


def test_existing_ids_unchanged(minilm_dir, extended):
    report, directory = extended
    old, new = load_vocab(minilm_dir / "vocab.txt"), load_vocab(directory / "vocab.txt")
    assert len(new) == len(old) == 30_522
    added = {a["token"]: a["id"] for a in report["added"]}
    # The filled slots are the first [unusedN] ids; every other token, [unusedN] left included, keeps its id.
    assert sorted(added.values()) == unused_slots(old)[:len(added)]
    kept = {token: i for token, i in old.items() if i not in set(added.values())}
    assert all(new[token] == i for token, i in kept.items())
    assert {token: new[token] for token in added} == added
    assert len(unused_slots(new)) == 994 - len(added)
    assert (directory / "vocab.txt").read_text(encoding="utf-8").count("\n") == 30_522


@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_new_words_are_single_tokens(extended, original_tokenizer, backend):
    report, directory = extended
    tokenizer = BertTokenizer.from_pretrained(directory, backend=backend)
    for added in report["added"]:
        word = added["token"]
        assert len(original_tokenizer.tokenize(word)) == added["pieces_before"] >= 3
        # As written in the text: capitalised, after punctuation, in a sentence.
        assert tokenizer.tokenize(f"{word.capitalize()}!") == [word, "!"]
        ids = tokenizer.encode(f"said the {word.upper()}.")["input_ids"]
        assert ids[3] == added["id"] and len(ids) == 6


@torch.inference_mode()
def test_same_outputs_on_text_without_new_words(extended, lines, minilm_dir, original_tokenizer, extended_tokenizer):
    """MiniLM through the extended vocabulary gives bit-identical outputs on text without a new word."""
    report, directory = extended
    new = tuple(a["token"] for a in report["added"])
    plain, with_new = [], []
    for line in filter(str.strip, lines):
        # A word that starts with a new word can change too ("gryphons": "gryphon ##s").
        (with_new if any(w.startswith(new) for w in basic_words(original_tokenizer, line)) else plain).append(line)
    assert len(plain) > 700 and len(with_new) > 100, (len(plain), len(with_new))
    assert all(original_tokenizer.tokenize(line) == extended_tokenizer.tokenize(line) for line in plain)
    assert all(original_tokenizer.tokenize(line) != extended_tokenizer.tokenize(line) for line in with_new)

    model = BertModel.from_pretrained(directory).eval()  # the same weights: the directory links MiniLM's
    for texts, same in ((plain[:32], True), (with_new[:8], False)):
        a = original_tokenizer.encode_batch(texts, max_length=64, return_tensors="pt")
        b = extended_tokenizer.encode_batch(texts, max_length=64, return_tensors="pt")
        out_a, out_b = model(**a), model(**b)
        assert torch.equal(a["input_ids"], b["input_ids"]) is same
        assert torch.equal(out_a.last_hidden_state, out_b.last_hidden_state) is same
        assert torch.equal(out_a.pooler_output, out_b.pooler_output) is same


def test_words_normalised_as_the_models_tokenizer(minilm_dir, tmp_path):
    """Lower-casing and accent stripping follow the model's tokenizer_config.json."""
    text = ["Zyxvéllo, ZYXVÉLLO and zyxvello."]
    report = extend_vocab(minilm_dir, text, tmp_path / "stripped.txt")
    assert [(a["token"], a["count"]) for a in report["added"]] == [("zyxvello", 3)]
    stripped = BertTokenizer(tmp_path / "stripped.txt")
    assert stripped.tokenize(text[0]) == ["zyxvello", ",", "zyxvello", "and", "zyxvello", "."]

    keep = tmp_path / "keep"  # lower-cased, accents kept
    keep.mkdir()
    shutil.copy(minilm_dir / "vocab.txt", keep / "vocab.txt")
    (keep / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "strip_accents": False}))
    report = extend_vocab(keep, text, tmp_path / "accents.txt", min_count=1)
    # "zyxvéllo" is now a word of its own (twice), which WordPiece cannot spell with this vocabulary (it has
    # no accented letter): one [UNK], nothing saved, not added. "zyxvello" is left, seen once.
    assert [(a["token"], a["count"]) for a in report["added"]] == [("zyxvello", 1)]
    assert report["strip_accents"] is False and report["distinct_words"] == 5


def test_errors(minilm_dir, lines, tmp_path, capsys):
    output = tmp_path / "vocab.txt"
    with pytest.raises(ValueError) as error:
        extend_vocab(minilm_dir, lines, output, max_new=995)
    assert str(error.value) == (f"max_new (--max-new) 995: {minilm_dir / 'vocab.txt'} has 994 [unusedN] slots, "
                                "so from 1 to 994 new words fit")

    full = tmp_path / "full.txt"  # no [unusedN] entry at all
    full.write_text("".join(t + "\n" for t in SPECIAL_TOKENS + ("the", "a", "##s")), encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{full}: no [unusedN] entries left to hold new words")):
        extend_vocab(full, lines, output)

    copy = tmp_path / "mine.txt"
    shutil.copy(minilm_dir / "vocab.txt", copy)
    with pytest.raises(ValueError, match="is the vocabulary being extended"):
        extend_vocab(copy, lines, copy)
    assert copy.read_bytes() == (minilm_dir / "vocab.txt").read_bytes()

    with pytest.raises(ValueError, match="nothing to add"):
        extend_vocab(minilm_dir, ["the cat sat on the mat"], output)

    # The CLI: one line naming the flag, before the input (here not text at all) is read; nothing written.
    assert main(["vocab", "--extend", str(minilm_dir), "--input", __file__, "--output", str(output),
                 "--max-new", "2000"]) == 2
    assert capsys.readouterr().err == (f"bertforge vocab: error: max_new (--max-new) 2000: {minilm_dir / 'vocab.txt'} "
                                       "has 994 [unusedN] slots, so from 1 to 994 new words fit\n")
    assert main(["vocab", "--extend", str(tmp_path / "nowhere"), "--input", __file__, "--output", str(output)]) == 2
    assert capsys.readouterr().err == f"bertforge vocab: error: vocabulary or model directory not found: " \
                                      f"{tmp_path / 'nowhere'}\n"
    assert not output.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left behind


def test_cli(minilm_dir, book, extended, tmp_path, capsys):
    output = tmp_path / "vocab.txt"
    assert main(["vocab", "--extend", str(minilm_dir), "--input", str(book), "--output", str(output),
                 "--max-new", "5"]) == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "vocab.extend.json").read_text(encoding="utf-8"))
    assert printed == (f"wrote {output}: 5 new words in [unusedN] slots (989 left); "
                       f"{report['new_word_occurrences']:,} of 35,599 word occurrences "
                       f"({100 * report['new_word_share']:.2f}%) become single tokens; tokens per word "
                       f"{report['before']['tokens_per_word']:.4f} -> {report['after']['tokens_per_word']:.4f}; "
                       f"report {tmp_path / 'vocab.extend.json'}\n")
    # The CLI reads the book as prepare-pretraining does (sentences of paragraphs): the same words.
    assert report["added"] == extended[0]["added"][:5] and report["inputs"] == [str(book)]
    assert sum(1 for token in load_vocab(output) if UNUSED.fullmatch(token)) == 989
