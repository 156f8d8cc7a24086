"""Every Unicode code point through both backends: this guards bertforge/tokenization/_divergent.py.

For each code point (surrogates excepted) the probe text of scripts/sweep_tokenizer_backends.py,
which generates the table, goes through:

* `BertTokenizer(backend="fast")`, i.e. the `tokenizers` library WITH the routing of text holding a
  divergent code point to the reference path, and the reference backend: the ids must be equal;
* for the probes that the table does not route, the Rust normaliser + pre-tokeniser and the
  reference BasicTokenizer: the words must be equal. This part does not depend on the vocabulary.
  Comparing ids alone misses a divergence hidden by the vocabulary: when Rust lower-cases a
  character that this Python's Unicode tables leave alone, both sides give [UNK] with this
  vocabulary, but not with one that holds the character (U+1C89, U+A7CB..., Unicode 16 letters).

Ids for the uncased and cased settings (the two the table is generated for); words also for the
two `strip_accents` overrides. Slow (about 2 minutes in all here): deselect with `-k "not sweep"`.
After upgrading `tokenizers` or Python, rerun the script.
"""

from __future__ import annotations

import bisect
import importlib.util
from pathlib import Path

import pytest

from bertforge.tokenization import BertTokenizer
from bertforge.tokenization._divergent import DIVERGENT_RANGES

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sweep_tokenizer_backends.py"
CODE_POINTS = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
BATCH = 50_000
SETTINGS = {  # do_lower_case, strip_accents, compare ids too
    "uncased": (True, None, True),
    "cased": (False, None, True),
    "lower-keep-accents": (True, False, False),
    "cased-strip-accents": (False, True, False),
}


def load_probe_text():
    """The probe of the script that generates the table, so that both sweep the same texts."""
    spec = importlib.util.spec_from_file_location("sweep_tokenizer_backends", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.probe_text


@pytest.fixture(scope="module")
def probes() -> list[str]:
    probe_text = load_probe_text()
    return [probe_text(cp) for cp in CODE_POINTS]


_STARTS = [a for a, _ in DIVERGENT_RANGES]


def in_table(char: str) -> bool:
    i = bisect.bisect_right(_STARTS, ord(char)) - 1
    return i >= 0 and ord(char) <= DIVERGENT_RANGES[i][1]


def test_table_is_sorted_and_leaves_ascii_alone():
    flat = [x for pair in DIVERGENT_RANGES for x in pair]
    assert flat == sorted(flat) and all(a <= b for a, b in DIVERGENT_RANGES)
    assert DIVERGENT_RANGES[0][0] > 0x7F  # BertTokenizer skips the table lookup for ASCII text
    assert in_table("\u03a3") and in_table("\ue000") and not in_table("a") and not in_table("\u00e9")


@pytest.mark.parametrize("setting", SETTINGS)
def test_sweep_every_code_point(setting, probes, uncased_vocab):
    lower, strip, check_ids = SETTINGS[setting]
    fast = BertTokenizer(uncased_vocab, do_lower_case=lower, strip_accents=strip)
    reference = BertTokenizer(uncased_vocab, do_lower_case=lower, strip_accents=strip, backend="reference")
    basic, wordpiece, vocab = reference.reference.basic, reference.reference.wordpiece, reference.vocab
    normalizer, pre_tokenizer = fast.fast.normalizer, fast.fast.pre_tokenizer

    id_mismatches, word_mismatches = [], []
    for start in range(0, len(probes), BATCH):
        batch = probes[start:start + BATCH]
        rows = fast.encode_batch(batch, truncation=False, padding=False) if check_ids else [None] * len(batch)
        for k, (text, row) in enumerate(zip(batch, rows)):
            words = basic.tokenize(text)
            if check_ids:
                # A probe never holds a special token, so this is the reference backend's tokenize().
                expected = [vocab[piece] for word in words for piece, _, _ in wordpiece.tokenize_word(word)]
                if (start + k) % 997 == 0:
                    assert reference.convert_tokens_to_ids(reference.tokenize(text)) == expected
                if row["input_ids"][1:-1] != expected:
                    id_mismatches.append((hex(CODE_POINTS[start + k]), text, fast.convert_ids_to_tokens(
                        row["input_ids"][1:-1]), fast.convert_ids_to_tokens(expected)))
            if not any(in_table(c) for c in text):
                rust_words = [word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]
                if rust_words != words:
                    word_mismatches.append((hex(CODE_POINTS[start + k]), text, rust_words, words))

    advice = "rerun scripts/sweep_tokenizer_backends.py (and add these code points to its comparison)"
    assert not id_mismatches, f"{len(id_mismatches)} code points give other ids; {advice}: {id_mismatches[:20]}"
    assert not word_mismatches, (f"{len(word_mismatches)} code points outside the table split or normalise "
                                 f"differently; {advice}: {word_mismatches[:20]}")


def test_letters_newer_than_pythons_unicode(tmp_path):
    """U+1C89 and U+A7CB are Unicode 16 capitals: the Rust normaliser lower-cases them (to U+1C8A,
    U+0264), this Python's unicodedata does not know them. With a vocabulary holding the lower-case
    forms, the two backends split the difference unless the table routes such text."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "##b", "\u1c8a", "\u0264",
                                "##\u1c8a", "##\u0264"]) + "\n", encoding="utf-8")
    fast, reference = BertTokenizer(vocab), BertTokenizer(vocab, backend="reference")
    texts = ["\u1c89", "a\u1c89b", "\ua7cb", "\u1c8a \ua7cb\u0264", "ab"]
    for text in texts:
        assert fast.tokenize(text) == reference.tokenize(text), text
        assert fast.tokenize_with_offsets(text) == reference.tokenize_with_offsets(text), text
    assert fast.encode_batch(texts) == reference.encode_batch(texts)  # the batched path routes too
