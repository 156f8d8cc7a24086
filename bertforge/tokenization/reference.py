"""Google's `tokenization.py` (BasicTokenizer + WordpieceTokenizer) in plain Python, with offsets.

This is the readable reference: the fast backend must give the same ids on every text. Each token
carries the [start, end) character span of the original text it came from, which span and tagging
tasks need; the spans are tracked through cleaning, lower-casing and accent stripping.
"""

from __future__ import annotations

import re
import unicodedata

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
    return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")


class BasicTokenizer:
    """Cleanup, CJK splitting, lower-casing and accent stripping, punctuation splitting.

    `strip_accents=None` follows `do_lower_case`, as in Google's and Hugging Face's tokenizers.
    """

    def __init__(self, do_lower_case: bool = True, strip_accents: bool | None = None):
        self.do_lower_case = do_lower_case
        self.strip_accents = do_lower_case if strip_accents is None else strip_accents

    def tokenize(self, text: str) -> list[str]:
        return [token for token, _ in self.tokenize_with_offsets(text)]

    def _normalize(self, word: str) -> str:
        if self.do_lower_case:
            word = word.lower()
        return strip_accents(word) if self.strip_accents else word

    def tokenize_with_offsets(self, text: str, offset: int = 0) -> list[tuple[str, list[Span]]]:
        """Basic tokens, each with one original-text span per character of the token."""
        # Cleanup and CJK padding, remembering where each kept character came from.
        chars: list[tuple[str, int]] = []
        for index, char in enumerate(text):
            cp = ord(char)
            if cp == 0 or cp == 0xFFFD or is_control(char):
                continue
            if is_whitespace(char):
                chars.append((" ", -1))
            elif is_chinese_char(cp):
                chars.extend(((" ", -1), (char, index), (" ", -1)))
            else:
                chars.append((char, index))

        tokens: list[tuple[str, list[Span]]] = []
        for word in _split_whitespace(chars):
            original = "".join(c for c, _ in word)
            normalized = self._normalize(original)
            # Lower-casing and NFD can change the length ("İ".lower() is two characters); aligning
            # character by character holds whenever the per-character lengths add up, and
            # otherwise every character gets the whole word's span.
            pieces = [self._normalize(c) for c, _ in word]
            if sum(map(len, pieces)) == len(normalized):
                spans = [(offset + i, offset + i + 1) for (_, i), piece in zip(word, pieces) for _ in piece]
            else:
                whole = (offset + word[0][1], offset + word[-1][1] + 1)
                spans = [whole] * len(normalized)
            tokens.extend(_split_punctuation(normalized, spans))
        return tokens


def _split_whitespace(chars: list[tuple[str, int]]) -> list[list[tuple[str, int]]]:
    # str.split() semantics, as Google's whitespace_tokenize.
    words, current = [], []
    for char, index in chars:
        if char.isspace():
            if current:
                words.append(current)
                current = []
        else:
            current.append((char, index))
    if current:
        words.append(current)
    return words


def _split_punctuation(word: str, spans: list[Span]) -> list[tuple[str, list[Span]]]:
    out: list[tuple[str, list[Span]]] = []
    start_new = True
    for char, span in zip(word, spans):
        if char.isspace():  # normalisation can, rarely, produce whitespace: Google splits there too
            start_new = True
            continue
        if is_punctuation(char):
            out.append((char, [span]))
            start_new = True
        else:
            if start_new:
                out.append(("", []))
                start_new = False
            token, token_spans = out[-1]
            out[-1] = (token + char, token_spans + [span])
    return out


class WordpieceTokenizer:
    """Greedy longest-match-first WordPiece: "unaffable" -> ["un", "##aff", "##able"]."""

    def __init__(self, vocab: dict[str, int], unk_token: str = "[UNK]", max_input_chars_per_word: int = 200):
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word

    def tokenize_word(self, word: str) -> list[tuple[str, int, int]]:
        """Pieces of one basic token with their [start, end) character range in it."""
        if len(word) > self.max_input_chars_per_word:
            return [(self.unk_token, 0, len(word))]
        pieces = []
        start = 0
        while start < len(word):
            end = len(word)
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
                for word, spans in self.basic.tokenize_with_offsets(part, position):
                    for piece, start, end in self.wordpiece.tokenize_word(word):
                        out.append((piece, (spans[start][0], spans[end - 1][1])))
            position += len(part)
        return out

    def tokenize(self, text: str) -> list[str]:
        return [token for token, _ in self.tokenize_with_offsets(text)]
