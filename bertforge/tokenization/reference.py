"""Google's `tokenization.py` (BasicTokenizer + WordpieceTokenizer) in plain Python, with offsets.

This is the readable reference: the fast backend must give the same ids on every text. Each token
carries the [start, end) character span of the original text it came from, which span and tagging
tasks need; the spans are tracked through cleaning, lower-casing and accent stripping.
"""

from __future__ import annotations

import functools
import itertools
import re
import unicodedata
from collections.abc import Sequence
from typing import NamedTuple

Span = tuple[int, int]


def is_whitespace(char: str) -> bool:
    if char in " \t\n\r":
        return True
    return unicodedata.category(char) == "Zs"


def is_control(char: str) -> bool:
    if char in "\t\n\r":
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


def is_punctuation(char: str) -> bool:
    # Every non-letter/number ASCII character counts, "^", "$" and "`" included, though Unicode
    # does not class them as punctuation.
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def is_chinese_char(cp: int) -> bool:
    """CJK Unified Ideographs blocks: written without spaces, so each is a token of its own."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def strip_accents(text: str) -> str:
    """NFD, then without the non-spacing marks (category Mn), as Google's `_run_strip_accents`."""
    text = unicodedata.normalize("NFD", text)
    if text.isascii():
        return text
    patterns = _patterns()
    return (patterns.marks if _has_astral(text) else patterns.marks_bmp).sub("", text)


class _Memo(dict):
    """Per-character normalisation, computed once per distinct character (bounded, so that a text of
    many distinct characters cannot grow it without end)."""

    LIMIT = 1 << 16

    def __init__(self, normalize):
        super().__init__()
        self.normalize = normalize

    def __missing__(self, char: str) -> str:
        if len(self) >= self.LIMIT:
            self.clear()
        value = self[char] = self.normalize(char)
        return value


def _char_class(ranges: list[tuple[int, int]]) -> str:
    """A regex character class body for inclusive code point `ranges`."""
    return "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged


_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
               (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_ASCII_PUNCTUATION = ((33, 47), (58, 64), (91, 96), (123, 126))


class _Patterns(NamedTuple):
    """The character classes above as regular expressions, so that every pass over a text runs in the
    regex engine, in time linear in the text's length.

    - removed: runs of the characters the cleanup drops (NUL, U+FFFD, controls but tab/newline/CR);
    - words: in cleaned text, one CJK character or a run of neither whitespace nor CJK (Python's
      `\\s` is `str.isspace`, the split of Google's `whitespace_tokenize`);
    - pieces: in a normalised word, one punctuation character or a run of neither whitespace nor
      punctuation (Google's `_run_split_on_punc`; whitespace made by normalisation splits too);
    - marks: runs of the non-spacing marks (category Mn) that accent stripping drops.

    `re` tests the astral (beyond U+FFFF) part of a class range by range for every character, so
    `pieces` and `marks` come twice: for text without astral characters, classes without that part.
    """

    removed: re.Pattern
    words: re.Pattern
    pieces: re.Pattern
    pieces_bmp: re.Pattern
    marks: re.Pattern
    marks_bmp: re.Pattern


_ASTRAL = re.compile("[\U00010000-\U0010FFFF]")


def _has_astral(text: str) -> bool:
    return not text.isascii() and _ASTRAL.search(text) is not None


@functools.cache
def _patterns() -> _Patterns:
    """Built once per process, from the Unicode categories of every code point, run by run."""
    categories = map(unicodedata.category, map(chr, range(0x110000)))
    removed, punctuation, marks = [(0, 0), (0xFFFD, 0xFFFD)], list(_ASCII_PUNCTUATION), []
    last = -1
    for kind, run in itertools.groupby(categories):
        first, last = last + 1, last + len(list(run))
        if kind in ("Cc", "Cf"):
            removed.append((first, last))
        elif kind[0] == "P":
            punctuation.append((first, last))
        elif kind == "Mn":
            marks.append((first, last))
    removed = [r for a, b in _merge(removed) for r in _without(a, b, "\t\n\r")]
    # Google tests whitespace before punctuation; no character is both, but keep that order anyway.
    punctuation = [r for a, b in _merge(punctuation)
                   for r in _without(a, b, "".join(c for c in map(chr, range(a, b + 1)) if c.isspace()))]
    marks = _merge(marks)

    def bmp(ranges):
        return [(a, min(b, 0xFFFF)) for a, b in ranges if a <= 0xFFFF]

    cjk = _char_class(list(_CJK_RANGES))
    punct, punct_bmp = _char_class(punctuation), _char_class(bmp(punctuation))
    return _Patterns(
        removed=re.compile(f"[{_char_class(removed)}]+"), words=re.compile(f"[{cjk}]|[^\\s{cjk}]+"),
        pieces=re.compile(f"[{punct}]|[^\\s{punct}]+"), pieces_bmp=re.compile(f"[{punct_bmp}]|[^\\s{punct_bmp}]+"),
        marks=re.compile(f"[{_char_class(marks)}]+"), marks_bmp=re.compile(f"[{_char_class(bmp(marks))}]+"))


def _without(a: int, b: int, chars: str) -> list[tuple[int, int]]:
    """The range [a, b] less the code points of `chars`."""
    out, start = [], a
    for cp in sorted(ord(c) for c in chars if a <= ord(c) <= b):
        if start <= cp - 1:
            out.append((start, cp - 1))
        start = cp + 1
    if start <= b:
        out.append((start, b))
    return out


class CharSpans(Sequence[Span]):
    """The original-text span of each character of a basic token, computed on demand (a token can be
    a million characters long): (p, p + 1) for the position p a character came from, or the whole
    word's span for every character when normalisation changed the word's length unevenly."""

    __slots__ = ("positions", "start", "length", "whole")

    def __init__(self, positions: Sequence[int] | None, start: int, length: int, whole: Span | None = None):
        self.positions, self.start, self.length, self.whole = positions, start, length, whole

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self.length))]
        if k < 0:
            k += self.length
        if not 0 <= k < self.length:
            raise IndexError(k)
        if self.whole is not None:
            return self.whole
        p = self.positions[self.start + k]
        return (p, p + 1)


class BasicTokenizer:
    """Cleanup, CJK splitting, lower-casing and accent stripping, punctuation splitting.

    `strip_accents=None` follows `do_lower_case`, as in Google's and Hugging Face's tokenizers. Every
    step runs in time linear in the text's length (a text of a million characters without a space is
    one word, which WordPiece turns into [UNK]).
    """

    def __init__(self, do_lower_case: bool = True, strip_accents: bool | None = None):
        self.do_lower_case = do_lower_case
        self.strip_accents = do_lower_case if strip_accents is None else strip_accents
        self._char_memo = _Memo(self._normalize)

    def tokenize(self, text: str) -> list[str]:
        return [token for token, _ in self.tokens_with_spans(text)]

    def _normalize(self, word: str) -> str:
        if self.do_lower_case:
            word = word.lower()
        return strip_accents(word) if self.strip_accents else word

    def tokenize_with_offsets(self, text: str, offset: int = 0) -> list[tuple[str, list[Span]]]:
        """Basic tokens, each with one original-text span per character of the token."""
        return [(token, list(spans)) for token, spans in self.tokens_with_spans(text, offset)]

    def tokens_with_spans(self, text: str, offset: int = 0) -> list[tuple[str, CharSpans]]:
        """Basic tokens, each with its characters' original-text spans (shifted by `offset`)."""
        patterns = _patterns()
        removed, words = patterns.removed, patterns.words
        # Cleanup: the position in `text` of each kept character (a range when nothing is dropped).
        positions: Sequence[int]
        if removed.search(text) is None:
            cleaned, positions = text, range(offset, offset + len(text))
        else:
            kept: list[int] = []
            last = 0
            for match in removed.finditer(text):
                kept.extend(range(offset + last, offset + match.start()))
                last = match.end()
            kept.extend(range(offset + last, offset + len(text)))
            cleaned, positions = removed.sub("", text), kept

        tokens: list[tuple[str, CharSpans]] = []
        for word_match in words.finditer(cleaned):
            word = word_match.group()
            a, b = word_match.span()
            normalized = self._normalize(word)
            # Lower-casing and NFD can change the length ("İ".lower() is two characters); aligning
            # character by character holds whenever the per-character lengths add up, and
            # otherwise every character gets the whole word's span.
            whole = None
            if word.isascii():  # one character in, one out
                char_positions, base = positions, a
            else:
                lengths = list(map(len, map(self._char_memo.__getitem__, word)))
                if sum(lengths) != len(normalized):
                    char_positions, base = None, 0
                    whole = (positions[a], positions[b - 1] + 1)
                elif lengths.count(1) == len(lengths):
                    char_positions, base = positions, a
                else:
                    char_positions = list(itertools.chain.from_iterable(map(itertools.repeat, positions[a:b], lengths)))
                    base = 0
            pieces = patterns.pieces if _has_astral(normalized) else patterns.pieces_bmp
            for piece in pieces.finditer(normalized):
                s, e = piece.span()
                tokens.append((piece.group(), CharSpans(char_positions, base + s, e - s, whole)))
        return tokens


class WordpieceTokenizer:
    """Greedy longest-match-first WordPiece: "unaffable" -> ["un", "##aff", "##able"]."""

    def __init__(self, vocab: dict[str, int], unk_token: str = "[UNK]", max_input_chars_per_word: int = 200):
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word
        # No piece longer than the longest entry can match: the greedy search starts there, so a word
        # costs its length times this, not its length squared (same pieces as Google's loop).
        self.longest_piece = max(map(len, vocab), default=0)

    def tokenize_word(self, word: str) -> list[tuple[str, int, int]]:
        """Pieces of one basic token with their [start, end) character range in it."""
        if len(word) > self.max_input_chars_per_word:
            return [(self.unk_token, 0, len(word))]
        pieces = []
        start = 0
        while start < len(word):
            end = min(len(word), start + self.longest_piece)
            while start < end:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            else:  # no prefix of the rest is in the vocabulary: the whole word is unknown
                return [(self.unk_token, 0, len(word))]
            pieces.append((piece, start, end))
            start = end
        return pieces


class ReferenceTokenizer:
    """BasicTokenizer + WordpieceTokenizer, with the special tokens written in the text kept whole."""

    def __init__(self, vocab: dict[str, int], do_lower_case: bool = True, strip_accents: bool | None = None,
                 max_input_chars_per_word: int = 200, special_tokens: tuple[str, ...] = ()):
        self.basic = BasicTokenizer(do_lower_case, strip_accents)
        self.wordpiece = WordpieceTokenizer(vocab, "[UNK]", max_input_chars_per_word)
        self.special_pattern = (re.compile("(" + "|".join(map(re.escape, special_tokens)) + ")")
                                if special_tokens else None)

    def tokenize_with_offsets(self, text: str) -> list[tuple[str, Span]]:
        parts = self.special_pattern.split(text) if self.special_pattern else [text]
        out: list[tuple[str, Span]] = []
        position = 0
        for i, part in enumerate(parts):
            if i % 2:  # a special token written in the text
                out.append((part, (position, position + len(part))))
            else:
                for word, spans in self.basic.tokens_with_spans(part, position):
                    for piece, start, end in self.wordpiece.tokenize_word(word):
                        out.append((piece, (spans[start][0], spans[end - 1][1])))
            position += len(part)
        return out

    def tokenize(self, text: str) -> list[str]:
        return [token for token, _ in self.tokenize_with_offsets(text)]
