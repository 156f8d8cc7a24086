"""WordPiece vocabularies: reading `vocab.txt`, checking its special tokens, training one from text."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from ._read import VOCAB_LIMIT, decode_utf8, read_bounded
from .reference import is_chinese_char, is_control, is_punctuation, is_whitespace

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
VOCAB_NAME = "vocab.txt"


def load_vocab(path: str | os.PathLike) -> dict[str, int]:
    """token -> id, one token per line, id = line number (as Google's `load_vocab`).

    Raises ValueError naming the file if a BERT special token is missing (without them no input can be
    built) or a token appears on two lines: Google's reader then silently gives the token the later
    line's id, so every id the model learnt for it is wrong. The file must be a regular UTF-8 file of
    at most `VOCAB_LIMIT` bytes.
    """
    path = Path(path)
    if path.is_dir():
        path = path / VOCAB_NAME
    if not path.exists():
        raise FileNotFoundError(f"vocabulary file not found: {path}")
    text = decode_utf8(read_bounded(path, VOCAB_LIMIT, "vocabulary file"), path)
    vocab: dict[str, int] = {}
    # Lines as a text-mode file reads them (\n, \r\n or \r ends one), stripped, as Google's load_vocab.
    for index, line in enumerate(io.StringIO(text, newline=None)):
        token = line.strip()
        if token in vocab:
            raise ValueError(f"{path}: line {index + 1} repeats the token {token!r} of line {vocab[token] + 1}; "
                             "each token must appear once (a token's id is its line number)")
        vocab[token] = index
    missing = [token for token in SPECIAL_TOKENS if token not in vocab]
    if missing:
        raise ValueError(f"{path}: the vocabulary lacks the special token(s) {', '.join(missing)}; "
                         f"a BERT vocabulary needs all of {', '.join(SPECIAL_TOKENS)}")
    return vocab


def save_vocab(vocab: dict[str, int], path: str | os.PathLike) -> None:
    tokens = sorted(vocab, key=vocab.get)
    Path(path).write_text("".join(token + "\n" for token in tokens), encoding="utf-8")


def vocab_fingerprint(vocab: str | os.PathLike | Mapping[str, int] | Sequence[str]) -> str:
    """A short hash of a vocabulary's tokens in id order: equal exactly when every token has the same id.

    `vocab`: a `vocab.txt` (or a directory holding one), a token -> id mapping, or the tokens in id
    order. Pre-training data stores it as `vocab_hash` in its `index.json` (and pre-training checkpoints
    in their extra state), so data, a vocabulary file and a model can be matched without comparing files.
    Value: the first 16 hex digits of the sha256 of the tokens joined by newlines.
    """
    if isinstance(vocab, (str, os.PathLike)):
        vocab = load_vocab(vocab)
    tokens = sorted(vocab, key=vocab.get) if isinstance(vocab, Mapping) else list(vocab)
    digest = hashlib.sha256("\n".join(tokens).encode("utf-8"))
    return digest.hexdigest()[:16]


def _continuation_pieces(files: list[str], normalizer) -> list[str]:
    """"##c" for every character c the normalised text can hold inside a word (not whitespace, control,
    punctuation or CJK, which BERT's pre-tokenizer splits off), sorted. A character seen only at the start
    of words gets an unused piece: harmless, and rare."""
    chars: set[str] = set()
    for file in files:
        with open(file, encoding="utf-8", errors="replace") as handle:
            for chunk in iter(lambda: handle.read(1 << 24), ""):
                chars.update(chunk)
    normalised = set("".join(normalizer.normalize_str(c) for c in chars))
    return sorted(f"##{c}" for c in normalised
                  if not (is_whitespace(c) or is_control(c) or is_punctuation(c) or is_chinese_char(ord(c))))


def looks_cased(vocab: Iterable[str]) -> bool:
    """True if the vocabulary has upper-case tokens: it was built from text that was not lower-cased."""
    return any(any("A" <= c <= "Z" for c in token) for token in vocab
               if not (token.startswith("[") and token.endswith("]")))


def train_vocab(files: Iterable[str | os.PathLike], vocab_size: int = 30522, lowercase: bool = True,
                min_frequency: int = 2, output: str | os.PathLike | None = None,
                show_progress: bool = True) -> dict[str, int]:
    """Train a WordPiece vocabulary on text files with the `tokenizers` trainer.

    Text is normalised and split exactly as BertTokenizer does before WordPiece, so every trained
    piece can be produced. The five specials come first: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4;
    then the whole-word tokens and the ##pieces, each in sorted order (the same ids in every run).
    """
    files = [str(f) for f in files]
    for file in files:
        if not Path(file).is_file():
            raise FileNotFoundError(f"vocabulary training input not found: {file}")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    tokenizer = Tokenizer(models.WordPiece(unk_token=UNK))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # The trainer numbers the "##c" pieces in the order its hash map of words meets them, which differs
    # from process to process, and breaks ties between equally frequent merges by those numbers, so the
    # same text could give another vocabulary (huggingface/tokenizers#1794). Registered up front (as the
    # trainer's special tokens, which it numbers first, in order) they are numbered the same every time.
    pieces = _continuation_pieces(files, tokenizer.normalizer)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[*SPECIAL_TOKENS, *pieces],
        continuing_subword_prefix="##", show_progress=show_progress)
    tokenizer.train(files, trainer)
    # Canonical ids: specials, whole words, then ##pieces, each sorted.
    trained = tokenizer.get_vocab()
    others = sorted((t for t in trained if t not in SPECIAL_TOKENS), key=lambda t: (t.startswith("##"), t))
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *others])}
    if output is not None:
        save_vocab(vocab, output)
    return vocab


def continuation_flags(vocab: Mapping[str, int]) -> np.ndarray:
    """(largest id + 1,) bool: whether each id's token continues a word ("##..."): what whole-word masking
    and a tagger's word starts read."""
    flags = np.zeros(max(vocab.values(), default=-1) + 1, dtype=bool)
    for token, index in vocab.items():
        flags[index] = token.startswith("##")
    return flags
