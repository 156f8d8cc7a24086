"""BertTokenizer: Google's WordPiece tokenization and BERT's input format, on two backends.

`backend="fast"` (the default) runs on the `tokenizers` library; `backend="reference"` is the plain
Python port of Google's `tokenization.py`. Both give identical ids: the few characters on which the
Rust normaliser differs from Google's definitions send their text to the reference path.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import re
from pathlib import Path
from typing import Literal, Sequence

import torch
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

from .._files import check_finished
from ._divergent import DIVERGENT_RANGES
from ._read import read_json_object, shown
from .reference import ReferenceTokenizer
from .vocab import CLS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK, VOCAB_NAME, load_vocab, looks_cased, save_vocab

logger = logging.getLogger("bertforge")

TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
Truncation = Literal["longest_first", "only_first", "only_second"] | bool

# Text holding a character on which the Rust normaliser and Google's definitions disagree (found by
# scripts/sweep_tokenizer_backends.py over every code point) is tokenized by the reference path. So is
# text holding a lone surrogate (U+D800-U+DFFF, which a JSON escape or a bad decode can produce): it
# cannot be encoded for the Rust library, and Google's tokenization.py, which passes a str through
# `convert_to_unicode` unchanged, treats it as a character of no class, so its word becomes [UNK].
_DIVERGENT = re.compile("[" + "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in DIVERGENT_RANGES)
                        + "\ud800-\udfff]")
# `re` tests a class's astral (beyond U+FFFF) ranges one by one for every character, so text without
# astral characters (nearly all) is searched with the table's BMP part only: ten times faster.
_DIVERGENT_BMP = re.compile("[" + "".join(f"{re.escape(chr(a))}-{re.escape(chr(min(b, 0xFFFF)))}"
                                          for a, b in DIVERGENT_RANGES if a <= 0xFFFF) + "\ud800-\udfff]")
_ASTRAL = re.compile("[\U00010000-\U0010FFFF]")
# No ASCII character diverges, so ASCII text (nearly all English text) skips the regex search.
_ASCII_FAST = all(a > 0x7F for a, _ in DIVERGENT_RANGES)


# transformers writes int(1e30) as model_max_length for "no limit"; any value above this means that.
_NO_LIMIT = 1_000_000


def _checked_settings(stored: dict, path: Path) -> dict:
    """The settings bertforge reads from a `tokenizer_config.json`, each checked for its type and range:
    ValueError naming the key and the file (a string "yes" for do_lower_case would silently mean true)."""
    settings = {}
    for key in ("do_lower_case", "strip_accents"):
        if key in stored:
            value = stored[key]
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{path}: {key} must be true, false or null, got {shown(value)}")
            settings[key] = value
    for key in ("max_input_chars_per_word", "model_max_length"):
        if key not in stored:
            continue
        value = stored[key]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if key == "model_max_length" and number and value > _NO_LIMIT:
            continue  # transformers' "no limit" sentinel: keep bertforge's default
        if not number or not isinstance(value, int) or value < 1:
            raise ValueError(f"{path}: {key} must be a whole number of at least 1, got {shown(value)}")
        settings[key] = value
    return settings


class BertTokenizer:
    """WordPiece tokenizer with BERT's `[CLS] A [SEP] B [SEP]` packing, truncation, padding and offsets."""

    def __init__(self, vocab_file: str | os.PathLike, do_lower_case: bool | None = True,
                 strip_accents: bool | None = None, max_input_chars_per_word: int = 200,
                 model_max_length: int = 512, backend: Literal["fast", "reference"] = "fast"):
        self.vocab_file = Path(vocab_file)
        self.vocab = load_vocab(self.vocab_file)
        self.ids_to_tokens = {i: t for t, i in self.vocab.items()}
        cased_vocab = looks_cased(self.vocab)
        if do_lower_case is None:
            do_lower_case = not cased_vocab
        elif do_lower_case == cased_vocab:
            # Google's validate_case_matches_checkpoint: the commonest silent mistake in BERT use.
            logger.warning(
                "%s looks %s but do_lower_case=%s: the tokens will not match how the model was trained",
                self.vocab_file, "cased" if cased_vocab else "uncased", do_lower_case)
        self.do_lower_case = do_lower_case
        self.strip_accents = strip_accents
        self.max_input_chars_per_word = max_input_chars_per_word
        self.model_max_length = model_max_length
        if backend not in ("fast", "reference"):
            raise ValueError(f"backend must be 'fast' or 'reference', got {backend!r}")
        self.backend = backend
        self.reference = ReferenceTokenizer(self.vocab, do_lower_case, strip_accents, max_input_chars_per_word,
                                            SPECIAL_TOKENS)
        self.fast = self._build_fast() if backend == "fast" else None
        # A run of more ASCII letters and digits than a word may have is [UNK] however long it is:
        # the fast path hands the Rust library only its first max_input_chars_per_word + 1 characters.
        keep = max_input_chars_per_word + 1
        self._long_run = re.compile(f"(?<![A-Za-z0-9])[A-Za-z0-9]{{{keep + 1},}}") if keep > 8 else None
        self.pad_token_id, self.unk_token_id = self.vocab[PAD], self.vocab[UNK]
        self.cls_token_id, self.sep_token_id, self.mask_token_id = self.vocab[CLS], self.vocab[SEP], self.vocab[MASK]

    def _build_fast(self):
        lower = self.do_lower_case
        strip = lower if self.strip_accents is None else self.strip_accents
        tokenizer = Tokenizer(models.WordPiece(vocab=self.vocab, unk_token=UNK,
                                               max_input_chars_per_word=self.max_input_chars_per_word))
        tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=strip, lowercase=lower)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
        return tokenizer

    # ---------------------------------------------------------------- loading and saving

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, **kwargs) -> "BertTokenizer":
        """From a directory holding `vocab.txt` and, optionally, `tokenizer_config.json`."""
        directory = Path(directory)
        if not directory.is_dir():
            raise FileNotFoundError(f"tokenizer directory not found: {directory}")
        check_finished(directory)  # a failed or killed run's directory is not a finished model
        settings = {"do_lower_case": None}  # no config: guess from the vocabulary
        config_file = directory / TOKENIZER_CONFIG_NAME
        if config_file.exists():
            stored = read_json_object(config_file, "tokenizer config")
            settings.update(_checked_settings(stored, config_file))
        settings.update(kwargs)
        return cls(directory / VOCAB_NAME, **settings)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_vocab(self.vocab, directory / VOCAB_NAME)
        (directory / TOKENIZER_CONFIG_NAME).write_text(json.dumps(self.settings(), indent=2) + "\n")

    def settings(self) -> dict:
        """The contents of `tokenizer_config.json` (transformers' keys): what `from_pretrained` reads back."""
        return {
            "tokenizer_class": "BertTokenizer", "do_lower_case": self.do_lower_case,
            "strip_accents": self.strip_accents, "tokenize_chinese_chars": True,
            "max_input_chars_per_word": self.max_input_chars_per_word,
            "model_max_length": self.model_max_length,
            "unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS, "mask_token": MASK,
        }

    # ---------------------------------------------------------------- tokens

    def __len__(self) -> int:
        return len(self.vocab)

    def _use_reference(self, text: str) -> bool:
        if self.fast is None:
            return True
        if _ASCII_FAST and isinstance(text, str) and text.isascii():
            return False
        divergent = _DIVERGENT if _ASTRAL.search(text) else _DIVERGENT_BMP
        return divergent.search(text) is not None

    def _shorten(self, text: str) -> tuple[str, list[tuple[int, int]] | None]:
        """`text` with every run of ASCII letters and digits longer than max_input_chars_per_word + 1
        cut to that length, and the cuts as (end of the cut run in the short text, characters removed
        up to there); None when nothing was cut.

        Such a run lies inside one basic token (nothing in it splits, and lower-casing and accent
        stripping keep ASCII letters one to one), which stays longer than max_input_chars_per_word
        and so is [UNK] either way; only offsets after a cut move, and `_restore` moves them back.
        The Rust normaliser costs about a microsecond per character: this keeps a megabyte without a
        space from costing that much.
        """
        if self._long_run is None or len(text) <= self.max_input_chars_per_word + 2:
            return text, None
        keep = self.max_input_chars_per_word + 1
        parts, cuts, last, removed = [], [], 0, 0
        for match in self._long_run.finditer(text):
            start, end = match.span()
            parts.append(text[last:start + keep])
            removed += end - start - keep
            cuts.append((start + keep - (removed - (end - start - keep)), removed))
            last = end
        if not cuts:
            return text, None
        parts.append(text[last:])
        return "".join(parts), cuts

    @staticmethod
    def _restore(offsets: list[tuple[int, int]], cuts: list[tuple[int, int]] | None) -> list[tuple[int, int]]:
        """Offsets into the text `_shorten` gave, as offsets into the original text."""
        if not cuts:
            return offsets
        ends = [end for end, _ in cuts]

        def position(p: int) -> int:
            i = bisect.bisect_right(ends, p)  # cut runs ending at or before p
            return p + cuts[i - 1][1] if i else p

        return [(position(s), position(e)) for s, e in offsets]

    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of `text`, without [CLS]/[SEP]."""
        if self._use_reference(text):
            return self.reference.tokenize(text)
        return self.fast.encode(self._shorten(text)[0], add_special_tokens=False).tokens

    def tokenize_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and [start, end) character spans into `text`, without [CLS]/[SEP]."""
        if self._use_reference(text):
            pairs = self.reference.tokenize_with_offsets(text)
            return [self.vocab[t] for t, _ in pairs], [s for _, s in pairs]
        short, cuts = self._shorten(text)
        encoding = self.fast.encode(short, add_special_tokens=False)
        return encoding.ids, self._restore(encoding.offsets, cuts)

    def _ids_batch(self, texts: Sequence[str], offsets: bool,
                   what: str = "texts") -> list[tuple[list[int], list | None]]:
        if isinstance(texts, str):
            raise TypeError(f"{what} must be a sequence of str, not one str")
        if not isinstance(texts, (list, tuple)):
            texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"{what}[{i}] is {type(text).__name__}, not str")
        results: list = [None] * len(texts)
        fast_indices = [i for i, t in enumerate(texts) if not self._use_reference(t)]
        if fast_indices:
            shortened = [self._shorten(texts[i]) for i in fast_indices]
            batch = [short for short, _ in shortened]
            if offsets:
                encodings = self.fast.encode_batch(batch, add_special_tokens=False)
                for i, e, (_, cuts) in zip(fast_indices, encodings, shortened):
                    results[i] = (e.ids, self._restore(e.offsets, cuts))
            else:  # no offset bookkeeping: measurably faster
                encodings = self.fast.encode_batch_fast(batch, add_special_tokens=False)
                for i, e in zip(fast_indices, encodings):
                    results[i] = (e.ids, None)
        for i, text in enumerate(texts):
            if results[i] is None:
                pairs = self.reference.tokenize_with_offsets(text)
                results[i] = ([self.vocab[t] for t, _ in pairs], [s for _, s in pairs] if offsets else None)
        return results

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
        return [self.vocab.get(t, self.unk_token_id) for t in tokens]

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.ids_to_tokens[int(i)] for i in ids]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        tokens = self.convert_ids_to_tokens(ids)
        if skip_special_tokens:
            tokens = [t for t in tokens if t not in SPECIAL_TOKENS]
        return " ".join(tokens).replace(" ##", "")

    # ---------------------------------------------------------------- model inputs

    def encode(self, text: str, text_pair: str | None = None, max_length: int | None = None,
               truncation: Truncation = "longest_first", return_offsets: bool = False) -> dict[str, list]:
        """`[CLS] text [SEP] (text_pair [SEP])` as `input_ids`, `token_type_ids`, `attention_mask`.

        `max_length` (default: model_max_length, 512) counts the special tokens. With
        `return_offsets`, `offsets` holds each token's [start, end) span in its own text ((0, 0) for
        specials).
        """
        return self.encode_batch([text], None if text_pair is None else [text_pair], max_length,
                                 truncation, padding=False, return_offsets=return_offsets)[0]

    def encode_batch(self, texts: Sequence[str], text_pairs: Sequence[str] | None = None,
                     max_length: int | None = None, truncation: Truncation = "longest_first",
                     padding: Literal["longest", "max_length"] | bool = "longest",
                     return_offsets: bool = False, return_tensors: Literal["pt"] | None = None):
        """Encode many texts (and pairs). With padding, every row has the batch's longest length
        (or `max_length`); `return_tensors="pt"` gives a dict of (B, S) int64 tensors instead of a
        list of dicts."""
        if text_pairs is not None and len(text_pairs) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(text_pairs)} text_pairs")
        max_length = self.model_max_length if max_length is None else max_length
        firsts = self._ids_batch(texts, return_offsets)
        seconds = self._ids_batch(text_pairs, return_offsets, "text_pairs") if text_pairs is not None else None
        if seconds is None and not return_offsets:
            rows = self._single_rows(firsts, max_length, truncation)
        else:
            rows = self._rows(firsts, seconds, max_length, truncation, return_offsets)
        target = None
        if padding:
            target = max_length if padding == "max_length" else max((len(r["input_ids"]) for r in rows), default=0)
            for row in rows:
                extra = target - len(row["input_ids"])
                row["input_ids"] += [self.pad_token_id] * extra
                row["token_type_ids"] += [0] * extra
                row["attention_mask"] += [0] * extra
                if return_offsets:
                    row["offsets"] += [(0, 0)] * extra
        if return_tensors == "pt":
            lengths = {len(r["input_ids"]) for r in rows}
            if len(lengths) > 1:
                raise ValueError("return_tensors='pt' needs rows of one length: use padding (rows longer than "
                                 "max_length stay longer when truncation is off)")
            keys = ["input_ids", "token_type_ids", "attention_mask"] + (["offsets"] if return_offsets else [])
            if not rows:
                shape = (0, target or 0)
                return {k: torch.zeros(shape + ((2,) if k == "offsets" else ()), dtype=torch.long) for k in keys}
            return {k: torch.tensor([r[k] for r in rows], dtype=torch.long) for k in keys}
        return rows

    def _single_rows(self, firsts, max_length: int, truncation: Truncation) -> list[dict[str, list[int]]]:
        # The common case (single texts, no offsets), kept lean: a row is truncated only when over
        # the budget, and nothing is sliced or looked up per row otherwise.
        cls, sep, budget = self.cls_token_id, self.sep_token_id, max_length - 2
        rows: list[dict[str, list[int]]] = []
        append = rows.append
        for i, (ids, _) in enumerate(firsts):
            n = len(ids)
            if n > budget and truncation is not False and truncation is not None:
                n = truncated_lengths(n, None, max_length, truncation, i)[0]
                ids = ids[:n]
            n += 2
            append({"input_ids": [cls, *ids, sep], "token_type_ids": [0] * n, "attention_mask": [1] * n})
        return rows

    def _rows(self, firsts, seconds, max_length: int, truncation: Truncation,
              return_offsets: bool) -> list[dict[str, list]]:
        rows = []
        for i, (ids_a, offsets_a) in enumerate(firsts):
            ids_b, offsets_b = seconds[i] if seconds is not None else (None, None)
            keep_a, keep_b = truncated_lengths(len(ids_a), None if ids_b is None else len(ids_b),
                                               max_length, truncation, i)
            input_ids = [self.cls_token_id, *ids_a[:keep_a], self.sep_token_id]
            token_type_ids = [0] * len(input_ids)
            if ids_b is not None:
                input_ids += [*ids_b[:keep_b], self.sep_token_id]
                token_type_ids += [1] * (keep_b + 1)
            row = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": [1] * len(input_ids)}
            if return_offsets:
                offsets = [(0, 0), *offsets_a[:keep_a], (0, 0)]
                if ids_b is not None:
                    offsets += [*offsets_b[:keep_b], (0, 0)]
                row["offsets"] = offsets
            rows.append(row)
        return rows


def truncated_lengths(len_a: int, len_b: int | None, max_length: int, truncation: Truncation,
                      index: int = 0) -> tuple[int, int]:
    """How many tokens of A and B to keep so that `[CLS] A [SEP] B [SEP]` fits `max_length`.

    "longest_first" removes one token at a time from the longer sequence (from B on ties), as
    Google's `_truncate_seq_pair`.
    """
    budget = max_length - (3 if len_b is not None else 2)
    len_b_ = len_b or 0
    if truncation is False or truncation is None or len_a + len_b_ <= budget:
        return len_a, len_b_
    if budget < 0:
        raise ValueError(f"max_length={max_length} leaves no room for the special tokens")
    if truncation is True or truncation == "longest_first":
        if len_b is None:
            return budget, 0
        # Trim the longer one down to the shorter, then alternate: B gives up the odd token.
        long_a = len_a > len_b
        short = min(len_a, len_b)
        if 2 * short >= budget:
            keep_a = keep_b = budget // 2
            if budget % 2:
                keep_a += 1  # A removed last only when it was strictly longer; B trims first on ties
            return keep_a, keep_b
        return (budget - short, short) if long_a else (short, budget - short)
    if truncation == "only_first":
        if budget - len_b_ < 0:
            raise ValueError(f"example {index}: the second text alone ({len_b_} tokens) exceeds max_length={max_length}")
        return budget - len_b_, len_b_
    if truncation == "only_second":
        if len_b is None or budget - len_a < 0:
            raise ValueError(f"example {index}: cannot fit the first text ({len_a} tokens) in max_length={max_length} "
                             "by truncating only the second")
        return len_a, budget - len_a
    raise ValueError(f"truncation must be 'longest_first', 'only_first', 'only_second' or False, got {truncation!r}")
