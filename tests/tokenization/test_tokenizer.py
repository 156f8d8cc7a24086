"""BertTokenizer against Google's tokenization.py, as ported by transformers' BertTokenizerLegacy.

The peer departs from Google's original in two ways, both accounted for where it is compared
(`as_the_peer_sees_it`): it NFC-normalises the text, and it deletes every character of a `C*`
category, where Google deletes only `Cc` and `Cf` (so a private-use or unassigned code point stays
in the word, which then becomes [UNK]). bertforge follows Google; the hand-written cases below pin
Google's behaviour on both points. The peer's WordpieceTokenizer is always built with
max_input_chars_per_word=100 (Google's default is 200), so ours gets 100 wherever ids are compared.

Every line of text in ../shared/data is compared, on the real uncased vocabulary and on a cased one
trained here. Google's tokenization splits at every " " (each space-separated chunk is tokenized on
its own: " " is whitespace, cleaning and case mapping act within a whitespace-separated word, and
NFC cannot compose across a space), so the pure-Python peer and reference backend run once per
distinct chunk (472k chunks, 4 MB, instead of 64 MB of lines), and each line's ids are the
concatenation of its chunks' ids. The fast backend runs on the whole lines, and a fixed subset of
whole lines (every 25th) also runs through the peer and the reference backend without the
chunking, which checks the decomposition itself.
"""

from __future__ import annotations

import json
import logging
import random
import unicodedata
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bertforge.tokenization import SPECIAL_TOKENS, BertTokenizer, load_vocab, train_vocab, truncated_lengths

PEER_MAX_CHARS = 100
BATCH = 20_000


# ---------------------------------------------------------------- the shared data

# task: (text columns of train/dev, text columns of test). CoLA's train/dev have no header row.
GLUE_TEXT_COLUMNS = {
    "CoLA": ([3], [1]),
    "MRPC": ([3, 4], [3, 4]),
    "RTE": ([1, 2], [1, 2]),
    "WNLI": ([1, 2], [1, 2]),
    "STS-B": ([7, 8], [7, 8]),
    "SST-2": ([0], [1]),
}


def split_lines(path: Path) -> list[str]:
    # Only "\n" ends a line: str.splitlines() would also cut at U+2028, U+0085, \x1c..., which
    # occur inside the text.
    return path.read_text(encoding="utf-8-sig").split("\n")


def read_tsv(path: Path, header: bool = True) -> list[list[str]]:
    rows = [line.split("\t") for line in split_lines(path) if line]
    return rows[1:] if header else rows


def glue_texts(data: Path) -> list[str]:
    texts = []
    for task, (columns, test_columns) in GLUE_TEXT_COLUMNS.items():
        for split in ("train", "dev", "test"):
            header = task != "CoLA" or split == "test"
            cols = test_columns if split == "test" else columns
            for row in read_tsv(data / "glue" / task / f"{split}.tsv", header):
                texts += [row[c] for c in cols]
    return texts


def conll_sentences(data: Path) -> list[str]:
    sentences = []
    for split in ("train", "valid"):
        words: list[str] = []
        for line in split_lines(data / "conll2003" / f"{split}.txt") + [""]:
            if not line.strip():
                if words:
                    sentences.append(" ".join(words))
                words = []
            elif not line.startswith("-DOCSTART-"):
                words.append(line.split(" ")[0])
    return sentences


def squad_texts(data: Path) -> list[str]:
    squad = json.loads((data / "squad" / "v2.0" / "dev-v2.0.cs224n-half.json").read_text(encoding="utf-8"))
    texts = []
    for article in squad["data"]:
        for paragraph in article["paragraphs"]:
            texts.append(paragraph["context"])
            texts += [qa["question"] for qa in paragraph["qas"]]
    return texts


def text_lines(paths) -> list[str]:
    return [line for path in sorted(paths) for line in split_lines(path) if line.strip()]


@pytest.fixture(scope="module")
def corpus(shared_data) -> dict[str, list[str]]:
    pretraining = shared_data / "pretraining"
    return {
        "glue": glue_texts(shared_data),
        "conll": conll_sentences(shared_data),
        "squad": squad_texts(shared_data),
        "books": text_lines((pretraining / "books").glob("*.txt")),
        "wiki": text_lines((pretraining / "wiki").glob("*.txt")),
        "wikitext-2": text_lines((pretraining / "wikitext-2").glob("*.txt")),
        "sample_text": text_lines([pretraining / "sample_text.txt"]),
    }


def test_corpus_is_complete(corpus):
    # Row counts from PROVENANCE.md: GLUE train+dev+test texts, CoNLL train+valid sentences.
    sizes = {source: len(lines) for source, lines in corpus.items()}
    assert sizes["conll"] == 14041 + 3250
    glue_rows = {"CoLA": 8551 + 1043 + 1063, "SST-2": 67349 + 872 + 1821}
    glue_pair_rows = {"MRPC": 3668 + 408 + 1725, "RTE": 2490 + 277 + 3000, "WNLI": 635 + 71 + 146,
                      "STS-B": 5749 + 1500 + 1379}
    assert sizes["glue"] == sum(glue_rows.values()) + 2 * sum(glue_pair_rows.values())
    assert sizes["squad"] > 6078 and sizes["books"] > 250_000 and sizes["wiki"] > 50_000
    assert sizes["sample_text"] > 20


# ---------------------------------------------------------------- tokenizers

def make_peer(vocab: Path, do_lower_case: bool, **kwargs):
    legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
    return legacy.BertTokenizerLegacy(str(vocab), do_lower_case=do_lower_case, **kwargs)


def peer_ids(peer, text: str) -> list[int]:
    return peer.convert_tokens_to_ids(peer.tokenize(text))


def as_the_peer_sees_it(text: str) -> str:
    """The text on which Google's algorithm gives the peer's tokens (see the module docstring)."""
    if text.isascii():
        return text
    kept = "".join(c for c in text if unicodedata.category(c) not in ("Co", "Cn", "Cs"))
    return unicodedata.normalize("NFC", kept)


@pytest.fixture(scope="session")
def cased_vocab(shared_data, tmp_path_factory) -> Path:
    books = shared_data / "pretraining" / "books"
    path = tmp_path_factory.mktemp("cased_vocab") / "vocab.txt"
    train_vocab([books / "Austen_Pride_1813.txt", books / "Doyle_SherlockHolmes_1892.txt"],
                vocab_size=8000, lowercase=False, output=path, show_progress=False)
    return path


@pytest.fixture(scope="module", params=["uncased", "cased"])
def setting(request, uncased_vocab, cased_vocab) -> SimpleNamespace:
    """Both backends (max_input_chars_per_word as the peer's) and the peer, on one vocabulary."""
    vocab, lower = (uncased_vocab, True) if request.param == "uncased" else (cased_vocab, False)
    return SimpleNamespace(
        name=request.param, vocab=vocab, lower=lower,
        fast=BertTokenizer(vocab, do_lower_case=lower, max_input_chars_per_word=PEER_MAX_CHARS),
        reference=BertTokenizer(vocab, do_lower_case=lower, max_input_chars_per_word=PEER_MAX_CHARS,
                                backend="reference"),
        peer=make_peer(vocab, lower))


@pytest.fixture(scope="module")
def uncased(uncased_vocab) -> SimpleNamespace:
    """The real uncased vocabulary with bertforge's defaults (max_input_chars_per_word=200)."""
    return SimpleNamespace(fast=BertTokenizer(uncased_vocab),
                           reference=BertTokenizer(uncased_vocab, backend="reference"),
                           peer=make_peer(uncased_vocab, True))


def fast_ids(tokenizer: BertTokenizer, lines: list[str]):
    """Ids without [CLS]/[SEP], from batched encode_batch calls, one row at a time."""
    for start in range(0, len(lines), BATCH):
        for row in tokenizer.encode_batch(lines[start:start + BATCH], truncation=False, padding=False):
            yield row["input_ids"][1:-1]


def describe(mismatches: list, limit: int = 10) -> str:
    return f"{len(mismatches)} mismatches, first {min(limit, len(mismatches))}:\n" + "\n".join(
        repr(m)[:600] for m in mismatches[:limit])


# ---------------------------------------------------------------- parity on the shared data

def test_every_line_matches_peer(setting, corpus):
    lines = [line for source in corpus.values() for line in source]
    chunks = set()
    for line in lines:
        chunks.update(line.split(" "))

    # The peer and the reference backend on every distinct chunk.
    reference_ids: dict[str, list[int]] = {}
    chunk_mismatches = []
    for chunk in chunks:
        ours = setting.reference.convert_tokens_to_ids(setting.reference.tokenize(chunk))
        reference_ids[chunk] = ours
        seen = as_the_peer_sees_it(chunk)
        if seen != chunk:  # NFC / C* deletion: the peer equals Google on the text it actually sees
            ours = setting.reference.convert_tokens_to_ids(setting.reference.tokenize(seen))
        theirs = peer_ids(setting.peer, chunk)
        if ours != theirs:
            chunk_mismatches.append((chunk, setting.reference.tokenize(chunk), setting.peer.tokenize(chunk)))
    assert not chunk_mismatches, describe(chunk_mismatches)

    # The fast backend on every whole line, against the concatenated chunks.
    line_mismatches = []
    for line, ids in zip(lines, fast_ids(setting.fast, lines)):
        expected = [i for chunk in line.split(" ") for i in reference_ids[chunk]]
        if ids != expected:
            line_mismatches.append((line, setting.fast.convert_ids_to_tokens(ids),
                                    setting.fast.convert_ids_to_tokens(expected)))
    assert not line_mismatches, describe(line_mismatches)


def test_whole_lines_match_peer(setting, corpus):
    """No chunking: every 25th line of every source through all three tokenizers."""
    lines = [line for source in corpus.values() for line in source[::25]]
    assert len(lines) > 19_000
    mismatches = []
    for line, ids in zip(lines, fast_ids(setting.fast, lines)):
        reference = setting.reference.convert_tokens_to_ids(setting.reference.tokenize(line))
        seen = as_the_peer_sees_it(line)
        google_on_peer_text = reference if seen == line else setting.reference.convert_tokens_to_ids(
            setting.reference.tokenize(seen))
        if ids != reference or google_on_peer_text != peer_ids(setting.peer, line):
            mismatches.append((line, ids, reference, peer_ids(setting.peer, line)))
    assert not mismatches, describe(mismatches)


# ---------------------------------------------------------------- offsets

def google_normalise(span: str, lower: bool = True) -> str:
    """Google's cleaning, lower-casing and accent stripping of a piece of the original text."""
    kept = "".join(c for c in span if not (c == "\x00" or c == "\ufffd" or c.isspace()
                                           or (unicodedata.category(c) in ("Cc", "Cf") and c not in "\t\n\r")))
    if not lower:
        return kept
    return "".join(c for c in unicodedata.normalize("NFD", kept.lower()) if unicodedata.category(c) != "Mn")


def test_offsets_agree_and_cover_their_token(uncased, corpus):
    texts = corpus["glue"] + corpus["squad"]
    fast, reference = uncased.fast, uncased.reference
    by_chunk: dict[str, tuple[list[int], list[tuple[int, int]]]] = {}

    def reference_offsets(text):  # by chunk, shifted to the chunk's place in the text
        ids, offsets, position = [], [], 0
        for chunk in text.split(" "):
            if chunk not in by_chunk:
                by_chunk[chunk] = reference.tokenize_with_offsets(chunk)
            chunk_ids, chunk_offsets = by_chunk[chunk]
            ids += chunk_ids
            offsets += [(start + position, end + position) for start, end in chunk_offsets]
            position += len(chunk) + 1
        return ids, offsets

    disagreements, uncovered, checked = [], [], 0
    for start in range(0, len(texts), BATCH):
        batch = texts[start:start + BATCH]
        rows = fast.encode_batch(batch, truncation=False, padding=False, return_offsets=True)
        for k, (text, row) in enumerate(zip(batch, rows)):
            ids, offsets = row["input_ids"][1:-1], [tuple(span) for span in row["offsets"][1:-1]]
            if (ids, offsets) != reference_offsets(text):
                disagreements.append((text, ids, offsets, reference_offsets(text)))
            if (start + k) % 16 == 0 and (ids, offsets) != reference.tokenize_with_offsets(text):  # unchunked
                disagreements.append((text, ids, offsets, reference.tokenize_with_offsets(text)))
            for token, (s, e) in zip(fast.convert_ids_to_tokens(ids), offsets):
                if token == "[UNK]":
                    continue
                checked += 1
                if google_normalise(text[s:e]) != token.removeprefix("##"):
                    uncovered.append((token, text[s:e], text))
    assert not disagreements, describe(disagreements)
    assert not uncovered, describe(uncovered)
    assert checked > 2_000_000


def test_offsets_of_hand_written_text(uncased):
    text = "Héllo,  [MASK] İstanbul\u200b! 中文"
    for tokenizer in (uncased.fast, uncased.reference):
        ids, offsets = tokenizer.tokenize_with_offsets(text)
        pieces = [(token, text[s:e]) for token, (s, e) in zip(tokenizer.convert_ids_to_tokens(ids), offsets)]
        # The zero-width space is dropped by the cleaning, so "!" starts right after it.
        assert pieces == [("hello", "Héllo"), (",", ","), ("[MASK]", "[MASK]"), ("istanbul", "İstanbul"),
                          ("!", "!"), ("中", "中"), ("文", "文")]
    row = uncased.fast.encode(text, "a b", return_offsets=True)
    assert row["offsets"][0] == (0, 0) and row["offsets"][-1] == (0, 0)
    assert row["offsets"][-3:-1] == [(0, 1), (2, 3)]  # offsets into the second text


# ---------------------------------------------------------------- hand-written cases

SIGMA_FINAL = "\u03c2"
UNCASED_CASES = {
    # Each CJK ideograph is a word of its own; 字 and 符 are not in the vocabulary.
    "cjk": ("中文字符 mixed", ["中", "文", "[UNK]", "[UNK]", "mixed"]),
    # Lower-cased, then NFD and combining marks (Mn) removed.
    "accents": ("H\u00e9llo \u00dcrban na\u00efve", ["hello", "urban", "naive"]),
    "decomposed accents": ("e\u0301clair", ["ec", "##lai", "##r"]),
    # NUL, U+200B (Cf) and BEL (Cc) are deleted, joining the word; "abcd" is not in the vocabulary.
    "control": ("a\x00b\u200bc\x07d", ["abc", "##d"]),
    "replacement char": ("x\ufffdy z", ["x", "##y", "z"]),
    "tabs and newlines": ("a\tb\nc\r\nd", ["a", "b", "c", "d"]),
    # Zs spaces become " "; U+2028/U+2029 are kept by the cleaning but str.split() splits there.
    "unicode spaces": ("\u3000x\u00a0y\u2028z\u2029", ["x", "y", "z"]),
    # Symbols (So) are not punctuation; U+FE0F after the heart is Mn and is stripped.
    "emoji": ("I \u2764\ufe0f \U0001f917 emoji \U0001f600!",
              ["i", "[UNK]", "[UNK]", "em", "##oj", "##i", "[UNK]", "!"]),
    "mask": ("the [MASK] sat", ["the", "[MASK]", "sat"]),
    "mask without spaces": ("the[MASK]sat", ["the", "[MASK]", "sat"]),
    "lower-case mask is text": ("[mask]", ["[", "mask", "]"]),
    # Every non-alphanumeric ASCII character is punctuation, though ^ $ ` are not Unicode P*.
    "ascii punctuation": ("^$`", ["^", "$", "`"]),
    "punctuation inside words": ("a^b$c`d don't stop-believing...",
                                 ["a", "^", "b", "$", "c", "`", "d", "don", "'", "t", "stop", "-", "believing",
                                  ".", ".", "."]),
    "long punctuation run": ("!" * 300, ["!"] * 300),
    # Python's str.lower() gives the final sigma at the end of a word.
    "final sigma": ("\u039f\u0394\u039f\u03a3", ["\u03bf", "##\u03b4", "##\u03bf" + SIGMA_FINAL]),
    "final sigma twice": ("\u039f\u0394\u039f\u03a3 \u039f\u0394\u039f\u03a3.",
                          ["\u03bf", "##\u03b4", "##\u03bf" + SIGMA_FINAL] * 2 + ["."]),
    # "İ".lower() is "i" + U+0307 (Mn), which the accent stripping removes.
    "dotted capital i": ("\u0130stanbul", ["istanbul"]),
    # NFD does not decompose compatibility ligatures.
    "ligature": ("\ufb01ne", ["\ufb01", "##ne"]),
    # Greedy longest match first (not Google's docstring example "un ##aff ##able").
    "greedy": ("unaffable", ["una", "##ffa", "##ble"]),
    "empty": ("", []),
    "whitespace only": ("  \t\n\r \u3000 ", []),
}


@pytest.mark.parametrize("case", UNCASED_CASES)
def test_hand_written_uncased(uncased, case):
    text, expected = UNCASED_CASES[case]
    assert uncased.fast.tokenize(text) == expected
    assert uncased.reference.tokenize(text) == expected
    assert uncased.peer.tokenize(text) == expected
    ids = uncased.fast.convert_tokens_to_ids(expected)
    assert uncased.fast.encode(text)["input_ids"] == [101, *ids, 102]
    assert uncased.reference.encode(text)["input_ids"] == [101, *ids, 102]


def test_empty_and_blank_text_encode_to_cls_sep(uncased):
    for text in ("", "   \n\t"):
        for tokenizer in (uncased.fast, uncased.reference):
            assert tokenizer.tokenize(text) == []
            assert tokenizer.encode(text) == {"input_ids": [101, 102], "token_type_ids": [0, 0],
                                              "attention_mask": [1, 1]}
            assert tokenizer.encode(text, "")["input_ids"] == [101, 102, 102]
            assert tokenizer.encode(text, "")["token_type_ids"] == [0, 0, 1]


def test_over_long_words(uncased, uncased_vocab):
    word_200 = "ab" * 100
    pieces_200 = ["aba"] + ["##ba"] * 98 + ["##b"]
    google_peer = make_peer(uncased_vocab, True)
    google_peer.wordpiece_tokenizer.max_input_chars_per_word = 200  # Google's default
    for tokenizer in (uncased.fast, uncased.reference):
        assert tokenizer.tokenize(word_200) == pieces_200 == google_peer.tokenize(word_200)
        assert tokenizer.tokenize(word_200 + "a") == ["[UNK]"] == google_peer.tokenize(word_200 + "a")
        assert tokenizer.tokenize(f"x {word_200}a y") == ["x", "[UNK]", "y"]
        assert tokenizer.tokenize("!" * 250) == ["!"] * 250  # punctuation splits before the length test

    word_100, pieces_100 = "ab" * 50, ["aba"] + ["##ba"] * 48 + ["##b"]
    for backend in ("fast", "reference"):
        tokenizer = BertTokenizer(uncased_vocab, max_input_chars_per_word=100, backend=backend)
        assert tokenizer.tokenize(word_100) == pieces_100 == uncased.peer.tokenize(word_100)
        assert tokenizer.tokenize(word_100 + "a") == ["[UNK]"] == uncased.peer.tokenize(word_100 + "a")
        # The limit counts the characters of the normalised word: "Á" becomes the one character "a".
        assert tokenizer.tokenize("\u00c1" + word_100[1:]) == pieces_100


@pytest.fixture(scope="module")
def mini_vocab(tmp_path_factory) -> Path:
    """A tiny cased vocabulary with accented, precomposed (NFC) words."""
    path = tmp_path_factory.mktemp("mini_vocab") / "vocab.txt"
    words = ["H\u00e9llo", "Hello", "h\u00e9llo", "hello", "\u00dcrban", "urban", "na", "##\u00efve", "##ive",
             "\u00e9clair", "eclair", "\u03ba\u03cd\u03c1\u03b9\u03bf\u03c2", "\u03ba\u03c5\u03c1\u03b9\u03bf\u03c2",
             "ab", "a", "b"]
    path.write_text("\n".join([*SPECIAL_TOKENS, *words]) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("lower, strip, expected", [
    (False, None, ["H\u00e9llo", "\u00dcrban", "na", "##\u00efve"]),   # cased: accents kept
    (True, None, ["hello", "urban", "na", "##ive"]),                   # uncased: stripped
    (True, False, ["h\u00e9llo", "[UNK]", "na", "##\u00efve"]),         # lower-cased, accents kept
    (False, True, ["Hello", "[UNK]", "na", "##ive"]),                  # accents stripped, case kept
])
def test_accents(mini_vocab, lower, strip, expected):
    text = "H\u00e9llo \u00dcrban na\u00efve"
    peer = make_peer(mini_vocab, lower, strip_accents=strip)
    assert peer.tokenize(text) == expected
    for backend in ("fast", "reference"):
        tokenizer = BertTokenizer(mini_vocab, do_lower_case=lower, strip_accents=strip, backend=backend)
        assert tokenizer.tokenize(text) == expected


def test_nfc_is_the_peers_not_googles(mini_vocab):
    """The peer NFC-normalises; Google does not, so text in another normal form can differ (cased).

    STS-B dev holds "κύριος" with U+1F7B (upsilon with oxia), whose NFC form is U+03CD.
    """
    peer = make_peer(mini_vocab, False)
    for backend in ("fast", "reference"):
        ours = BertTokenizer(mini_vocab, do_lower_case=False, backend=backend)
        for raw, nfc in [("\u03ba\u1f7b\u03c1\u03b9\u03bf\u03c2", "\u03ba\u03cd\u03c1\u03b9\u03bf\u03c2"),
                         ("e\u0301clair", "\u00e9clair")]:
            assert unicodedata.normalize("NFC", raw) == nfc
            assert ours.tokenize(raw) == ["[UNK]"]      # Google: the word is not in the vocabulary
            assert ours.tokenize(nfc) == [nfc] == peer.tokenize(raw)
        # Uncased, the accent stripping makes both forms equal.
        uncased = BertTokenizer(mini_vocab, do_lower_case=True, backend=backend)
        assert uncased.tokenize("\u03ba\u1f7b\u03c1\u03b9\u03bf\u03c2") == ["\u03ba\u03c5\u03c1\u03b9\u03bf\u03c2"]
        assert uncased.tokenize("e\u0301clair") == ["eclair"] == make_peer(mini_vocab, True).tokenize("e\u0301clair")


def test_private_use_characters_stay_in_the_word(mini_vocab, uncased):
    """Google deletes only Cc/Cf characters: a private-use one (Co) stays and the word is [UNK].

    The peer (and the Rust normaliser) delete every C* character; bertforge's fast backend sends
    such text to the reference path.
    """
    text = "a\ue000b ab"
    peer = make_peer(mini_vocab, False)
    assert peer.tokenize(text) == ["ab", "ab"]
    for backend in ("fast", "reference"):
        assert BertTokenizer(mini_vocab, do_lower_case=False, backend=backend).tokenize(text) == ["[UNK]", "ab"]
    assert uncased.fast.tokenize("a\ue000b") == uncased.reference.tokenize("a\ue000b") == ["[UNK]"]
    assert uncased.fast.tokenize("a\U000e0080b") == ["[UNK]"]  # unassigned (Cn)


def test_final_sigma_backends_agree(uncased):
    for text in ["\u039f\u0394\u039f\u03a3", "\u03a3\u039f\u03a3", "\u039f\u03a3\u039f", "A\u03a3.", "\u03a3"]:
        assert uncased.fast.tokenize(text) == uncased.reference.tokenize(text) == uncased.peer.tokenize(text)
        assert uncased.fast.tokenize_with_offsets(text) == uncased.reference.tokenize_with_offsets(text)


def test_decode(uncased):
    encoded = uncased.fast.encode("The unaffable cat.", "Hi")
    assert uncased.fast.decode(encoded["input_ids"]) == "the unaffable cat . hi"
    assert uncased.fast.decode(encoded["input_ids"], skip_special_tokens=False) == \
        "[CLS] the unaffable cat . [SEP] hi [SEP]"


# ---------------------------------------------------------------- truncation

def google_truncate_seq_pair(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """run_classifier.py's _truncate_seq_pair, on lengths: pop from the longer one, B on ties."""
    while len_a + len_b > max_num_tokens:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


def test_longest_first_is_googles_loop():
    rng = random.Random(0)
    combos = [(a, b, m) for a in range(0, 24) for b in range(0, 24) for m in range(3, 50)]
    combos += [(rng.randrange(0, 700), rng.randrange(0, 700), rng.randrange(3, 600)) for _ in range(20_000)]
    for len_a, len_b, max_length in combos:
        expected = google_truncate_seq_pair(len_a, len_b, max_length - 3)
        assert truncated_lengths(len_a, len_b, max_length, "longest_first") == expected, (len_a, len_b, max_length)
        assert truncated_lengths(len_a, len_b, max_length, True) == expected
        # A single text keeps its first max_length - 2 tokens.
        assert truncated_lengths(len_a, None, max_length, "longest_first") == (min(len_a, max_length - 2), 0)


def test_encode_truncates_pairs_as_google(uncased):
    rng = random.Random(1)
    combos = [(rng.randrange(0, 60), rng.randrange(0, 60), rng.randrange(3, 80)) for _ in range(400)]
    texts = [" ".join(["the"] * a) for a, _, _ in combos]
    pairs = [" ".join(["cat"] * b) for _, b, _ in combos]
    the, cat = uncased.fast.convert_tokens_to_ids(["the", "cat"])
    for (len_a, len_b, max_length), text, pair in zip(combos, texts, pairs):
        keep_a, keep_b = google_truncate_seq_pair(len_a, len_b, max_length - 3)
        expected = [101, *[the] * keep_a, 102, *[cat] * keep_b, 102]
        for tokenizer in (uncased.fast, uncased.reference):
            row = tokenizer.encode(text, pair, max_length=max_length)
            assert row["input_ids"] == expected
            assert row["token_type_ids"] == [0] * (keep_a + 2) + [1] * (keep_b + 1)


def test_only_first_and_only_second():
    assert truncated_lengths(10, 5, 12, "only_first") == (4, 5)
    assert truncated_lengths(5, 10, 12, "only_second") == (5, 4)
    assert truncated_lengths(10, None, 8, "only_first") == (6, 0)
    assert truncated_lengths(3, 4, 12, "only_second") == (3, 4)  # fits: nothing to cut
    assert truncated_lengths(30, 40, 12, False) == (30, 40)
    with pytest.raises(ValueError, match=r"example 7: the second text alone \(20 tokens\)"):
        truncated_lengths(10, 20, 12, "only_first", 7)
    with pytest.raises(ValueError, match=r"example 3: cannot fit the first text \(20 tokens\)"):
        truncated_lengths(20, 5, 12, "only_second", 3)
    with pytest.raises(ValueError, match="only the second"):
        truncated_lengths(20, None, 12, "only_second")
    with pytest.raises(ValueError, match="leaves no room"):
        truncated_lengths(5, 5, 2, "longest_first")
    with pytest.raises(ValueError, match="truncation must be"):
        truncated_lengths(50, 5, 12, "longest")


def test_only_first_and_only_second_through_encode_batch(uncased):
    tokenizer = uncased.fast
    a, b = "one two three four five six", "seven eight nine"
    row = tokenizer.encode(a, b, max_length=8, truncation="only_first")
    assert tokenizer.convert_ids_to_tokens(row["input_ids"]) == \
        ["[CLS]", "one", "two", "[SEP]", "seven", "eight", "nine", "[SEP]"]
    row = tokenizer.encode(b, a, max_length=8, truncation="only_second")
    assert tokenizer.convert_ids_to_tokens(row["input_ids"]) == \
        ["[CLS]", "seven", "eight", "nine", "[SEP]", "one", "two", "[SEP]"]
    with pytest.raises(ValueError, match="example 1"):
        tokenizer.encode_batch(["x", "x"], ["y", a], max_length=5, truncation="only_first")
    with pytest.raises(ValueError, match="example 1"):
        tokenizer.encode_batch(["x", a], ["y", "y"], max_length=5, truncation="only_second")
    rows = tokenizer.encode_batch([a], max_length=4, truncation=False, padding=False)
    assert len(rows[0]["input_ids"]) == 8  # no truncation: longer than max_length


def test_encode_batch_padding_and_tensors(uncased):
    tokenizer = uncased.fast
    texts, pairs = ["a b c d e", "a", "a b"], ["x", "x y z", ""]
    rows = tokenizer.encode_batch(texts, pairs)
    lengths = [1 + 5 + 1 + 1 + 1, 1 + 1 + 1 + 3 + 1, 1 + 2 + 1 + 0 + 1]
    assert {len(r["input_ids"]) for r in rows} == {max(lengths)}
    for row, n, (a, b) in zip(rows, lengths, [(5, 1), (1, 3), (2, 0)]):
        pad = max(lengths) - n
        assert row["attention_mask"] == [1] * n + [0] * pad
        assert row["token_type_ids"] == [0] * (a + 2) + [1] * (b + 1) + [0] * pad
        assert row["input_ids"][n:] == [0] * pad and row["input_ids"][0] == 101

    unpadded = tokenizer.encode_batch(texts, pairs, padding=False)
    assert [len(r["input_ids"]) for r in unpadded] == lengths
    with pytest.raises(ValueError, match="one length"):
        tokenizer.encode_batch(texts, pairs, padding=False, return_tensors="pt")
    with pytest.raises(ValueError, match="one length"):  # untruncated rows overflow max_length padding
        tokenizer.encode_batch(["a " * 20, "a " * 30], max_length=8, truncation=False, padding="max_length",
                               return_tensors="pt")

    batch = tokenizer.encode_batch(texts, pairs, max_length=16, padding="max_length", return_tensors="pt",
                                   return_offsets=True)
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "offsets"}
    assert batch["input_ids"].shape == batch["token_type_ids"].shape == batch["attention_mask"].shape == (3, 16)
    assert batch["offsets"].shape == (3, 16, 2)
    assert all(t.dtype == torch.long for t in batch.values())
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert torch.equal(batch["input_ids"][:, :max(lengths)],
                       torch.tensor([r["input_ids"] for r in rows]))

    single = tokenizer.encode_batch(["a b c", "a"], return_tensors="pt")
    assert single["input_ids"].tolist() == [[101, 1037, 1038, 1039, 102], [101, 1037, 102, 0, 0]]
    assert single["token_type_ids"].tolist() == [[0] * 5] * 2
    empty = tokenizer.encode_batch([], return_tensors="pt")
    assert empty["input_ids"].shape == (0, 0)
    with pytest.raises(ValueError, match="2 texts but 1 text_pairs"):
        tokenizer.encode_batch(["a", "b"], ["c"])


@pytest.fixture(scope="module")
def mrpc_pairs(shared_data) -> list[tuple[str, str]]:
    rows = read_tsv(shared_data / "glue" / "MRPC" / "dev.tsv")
    return [(row[3], row[4]) for row in rows]


def test_pairs_match_peer(uncased_vocab, mrpc_pairs):
    """MRPC dev with max_length=32: every pair is truncated (longest_first), as by the peer."""
    peer = make_peer(uncased_vocab, True)
    transformers_logger = logging.getLogger("transformers")
    level = transformers_logger.level
    transformers_logger.setLevel(logging.ERROR)  # the peer's notice on each truncated pair
    try:
        _compare_pairs_with_peer(peer, uncased_vocab, mrpc_pairs)
    finally:
        transformers_logger.setLevel(level)


def _compare_pairs_with_peer(peer, uncased_vocab, mrpc_pairs):
    ours = BertTokenizer(uncased_vocab, max_input_chars_per_word=PEER_MAX_CHARS)
    truncated = 0
    for a, b in mrpc_pairs:
        expected = peer(a, b, truncation=True, max_length=32, return_token_type_ids=True)
        row = ours.encode(a, b, max_length=32)
        assert row["input_ids"] == expected["input_ids"], (a, b)
        assert row["token_type_ids"] == expected["token_type_ids"]
        assert row["attention_mask"] == expected["attention_mask"]
        truncated += len(peer.tokenize(a)) + len(peer.tokenize(b)) > 29
    assert truncated > 350

    texts, pairs = [a for a, _ in mrpc_pairs], [b for _, b in mrpc_pairs]
    expected = peer(texts, pairs, truncation=True, max_length=32, padding="longest", return_token_type_ids=True)
    batch = ours.encode_batch(texts, pairs, max_length=32, padding="longest", return_tensors="pt")
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert batch[key].tolist() == expected[key]


# ---------------------------------------------------------------- errors

def test_missing_vocab_file(tmp_path):
    missing = tmp_path / "nowhere" / "vocab.txt"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        BertTokenizer(missing)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        BertTokenizer.from_pretrained(tmp_path / "nowhere")


def test_vocab_without_mask(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[MASK\]") as error:
        BertTokenizer(path)
    assert str(path) in str(error.value)
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        load_vocab(path)


def test_case_mismatch_is_logged(mini_vocab, uncased_vocab, caplog):
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        BertTokenizer(mini_vocab, do_lower_case=True)
    assert any("looks cased" in r.getMessage() and str(mini_vocab) in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        BertTokenizer(uncased_vocab, do_lower_case=False)
    assert any("looks uncased" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        guessed = BertTokenizer(mini_vocab, do_lower_case=None)
        BertTokenizer(uncased_vocab)
    assert guessed.do_lower_case is False
    assert not caplog.records


def test_non_str_input_names_the_index(uncased):
    with pytest.raises(TypeError, match=r"texts\[2\] is int"):
        uncased.fast.encode_batch(["a", "b", 3])
    with pytest.raises(TypeError, match=r"text_pairs\[1\] is NoneType"):
        uncased.fast.encode_batch(["a", "b"], ["c", None])
    with pytest.raises(TypeError, match=r"texts\[0\] is bytes"):
        uncased.reference.encode_batch([b"a"])
    with pytest.raises(TypeError, match="not one str"):
        uncased.fast.encode_batch("a single string")
    with pytest.raises(ValueError, match="backend"):
        BertTokenizer(uncased.fast.vocab_file, backend="rust")


# ---------------------------------------------------------------- saving and loading

def test_save_and_load_round_trip(cased_vocab, tmp_path):
    original = BertTokenizer(cased_vocab, do_lower_case=False, strip_accents=True, max_input_chars_per_word=50,
                             model_max_length=128)
    original.save_pretrained(tmp_path / "saved")
    loaded = BertTokenizer.from_pretrained(tmp_path / "saved")
    for key in ("do_lower_case", "strip_accents", "max_input_chars_per_word", "model_max_length", "vocab"):
        assert getattr(loaded, key) == getattr(original, key), key
    text = "\u00c9lise met Holmes at Baker Street. " + "x" * 60  # a word over the 50-character limit
    assert loaded.tokenize(text) == original.tokenize(text)
    tokens = original.tokenize(text)
    assert tokens[0].startswith("E") and tokens[-1] == "[UNK]"  # accent stripped, case kept; over-long word
    long_text = " ".join([text] * 20)
    assert loaded.encode(long_text)["input_ids"] == original.encode(long_text)["input_ids"]
    assert len(loaded.encode(long_text)["input_ids"]) == 128
    override = BertTokenizer.from_pretrained(tmp_path / "saved", model_max_length=64, backend="reference")
    assert override.model_max_length == 64 and override.backend == "reference" and override.strip_accents is True

    # A directory with only vocab.txt: the case is guessed from the vocabulary.
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "vocab.txt").write_bytes(cased_vocab.read_bytes())
    assert BertTokenizer.from_pretrained(tmp_path / "bare").do_lower_case is False


def test_packaged_checkpoint_settings(minilm_dir):
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    assert (tokenizer.do_lower_case, tokenizer.strip_accents, tokenizer.model_max_length) == (True, None, 512)
    assert len(tokenizer) == 30522
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id,
            tokenizer.mask_token_id) == (0, 100, 101, 102, 103)


@pytest.mark.parametrize("which", ["uncased", "cased"])
def test_saved_directory_loads_in_peer(which, uncased_vocab, cased_vocab, mrpc_pairs, corpus, tmp_path):
    transformers = pytest.importorskip("transformers")
    vocab, lower = (uncased_vocab, True) if which == "uncased" else (cased_vocab, False)
    ours = BertTokenizer(vocab, do_lower_case=lower, model_max_length=256)
    ours.save_pretrained(tmp_path)
    texts = [a for a, _ in mrpc_pairs] + corpus["squad"][:300] + ["H\u00e9llo W\u00f6rld, the [MASK] sat."]
    for loader in (transformers.BertTokenizerFast, transformers.AutoTokenizer):
        peer = loader.from_pretrained(tmp_path)
        assert peer.do_lower_case is lower and peer.model_max_length == 256
        assert peer(texts, truncation=True)["input_ids"] == [r["input_ids"] for r in ours.encode_batch(
            texts, padding=False)]
