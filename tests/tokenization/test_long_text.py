"""Tokenization in time linear in the text's length, on both backends, and lone surrogates.

A megabyte without a space used to take the reference path (which the fast backend takes for any
text holding a character of the divergence table, such as σ) longer than ten minutes: the
punctuation split rebuilt each token per character. The bounds here are a few times what a loaded
two-core machine takes, and far below what the quadratic code took.
"""

from __future__ import annotations

import contextlib
import signal
import time

import pytest

from bertforge.tokenization import BertTokenizer

MEGABYTE = 1_000_000
BOUND_S = 5.0


@contextlib.contextmanager
def time_bound(seconds: float, what: str):
    """Fail (not hang) when the block uses more than `seconds` of this process's CPU time (SIGPROF
    interrupts pure Python). CPU time, not wall time: other processes on a busy machine do not count."""
    def expire(signum, frame):
        raise TimeoutError(f"{what} took longer than {seconds:g} s of CPU time")

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    start = time.process_time()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
    assert time.process_time() - start < seconds, what


@pytest.fixture(scope="module")
def backends(uncased_vocab) -> dict[str, BertTokenizer]:
    tokenizers = {backend: BertTokenizer(uncased_vocab, backend=backend) for backend in ("fast", "reference")}
    for tokenizer in tokenizers.values():
        tokenizer.tokenize("warm σ é")  # the reference path builds its character tables once per process
    return tokenizers


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs SIGPROF")
@pytest.mark.parametrize("backend", ["fast", "reference"])
def test_a_megabyte_without_spaces(backends, backend):
    tokenizer = backends[backend]
    n = MEGABYTE
    m = 3 * (n // 3)
    cases = {  # text -> (tokens, offsets)
        "a" * n: (["[UNK]"], [(0, n)]),
        "a" * n + " σ": (["[UNK]", "σ"], [(0, n), (n + 1, n + 2)]),  # σ: the reference path on "fast" too
        "a" * (n // 2) + "σ" + "a" * (n // 2): (["[UNK]"], [(0, n + 1)]),
        "x " + "Ab1" * (n // 3) + ".y": (["x", "[UNK]", ".", "y"], [(0, 1), (2, m + 2), (m + 2, m + 3), (m + 3, m + 4)]),
    }
    for text, (tokens, offsets) in cases.items():
        what = f"{backend}: {len(text):,} characters, {tokens}"
        with time_bound(BOUND_S, what):
            assert tokenizer.tokenize(text) == tokens, what
            ids, spans = tokenizer.tokenize_with_offsets(text)
            assert [tuple(s) for s in spans] == offsets and tokenizer.convert_ids_to_tokens(ids) == tokens, what
            row = tokenizer.encode(text, max_length=16)
            assert tokenizer.convert_ids_to_tokens(row["input_ids"]) == ["[CLS]", *tokens, "[SEP]"], what


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs SIGPROF")
def test_long_words_under_a_raised_limit(uncased_vocab):
    """With max_input_chars_per_word raised, WordPiece's greedy search starts at the longest
    vocabulary entry, not at the end of the word: a 40,000-character word in linear time."""
    k = 20_000
    word = "ab" * k
    for backend in ("fast", "reference"):
        tokenizer = BertTokenizer(uncased_vocab, max_input_chars_per_word=10 * MEGABYTE, backend=backend)
        text = word + " σ" if backend == "fast" else word  # the fast backend on the reference path
        with time_bound(BOUND_S, f"{backend}: one word of {len(word):,} characters"):
            tokens = tokenizer.tokenize(text)
        assert tokens[:k] == ["aba"] + ["##ba"] * (k - 2) + ["##b"]


def test_shortened_runs_keep_ids_and_offsets(uncased_vocab):
    """The fast path cuts runs of ASCII letters and digits longer than a word may be; ids and
    offsets stay those of the reference path, around, between and right at the limit."""
    texts = ["x " + "a" * 300 + " y", "a" * 202, "a" * 201, "a" * 200, "q" * 203 + "é" + "b" * 500 + ".y z",
             "Héllo " + "A1" * 400 + "[MASK]" + "b" * 250 + "," + "c" * 205 + " end", "中" + "z" * 1000 + "中",
             "[SEP]" + "MASK" * 60 + "]", "ok " * 50]
    for limit in (200, 100):
        fast = BertTokenizer(uncased_vocab, max_input_chars_per_word=limit)
        reference = BertTokenizer(uncased_vocab, max_input_chars_per_word=limit, backend="reference")
        for text in texts:
            assert fast.tokenize(text) == reference.tokenize(text), text
            assert fast.tokenize_with_offsets(text) == reference.tokenize_with_offsets(text), text
        assert (fast.encode_batch(texts, return_offsets=True, truncation=False)
                == reference.encode_batch(texts, return_offsets=True, truncation=False))
        assert fast.encode_batch(texts, truncation=False) == reference.encode_batch(texts, truncation=False)


def test_lone_surrogates_follow_google(backends):
    """A lone surrogate (from a JSON escape such as "\\ud800" or a bad decode) cannot be encoded for
    the Rust library, which raised TypeError. Google's tokenization.py passes a str through
    convert_to_unicode unchanged and gives the surrogate no class (not whitespace, control or
    punctuation), so the word holding it is [UNK]: both backends do that."""
    text = "a \ud800b c\udfff. d"
    expected = ["a", "[UNK]", "[UNK]", ".", "d"]  # "c\udfff" is one word, "." splits off
    for tokenizer in backends.values():
        assert tokenizer.tokenize(text) == expected
        ids, offsets = tokenizer.tokenize_with_offsets(text)
        assert [text[s:e] for s, e in offsets] == ["a", "\ud800b", "c\udfff", ".", "d"]
    assert backends["fast"].encode_batch([text, "fine"]) == backends["reference"].encode_batch([text, "fine"])
