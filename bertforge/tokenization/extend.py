"""Domain words in a checkpoint's `[unusedN]` vocabulary slots, every existing token's id kept.

Google reserved entries such as `[unused0]` in BERT's vocabularies (bert-base-uncased has 994 of
them) so that a user can give a domain's words ids of their own without changing any other id: the
checkpoint's (V, H) embedding matrix and its masked-LM output layer stay valid row for row. Only
the rows of the filled slots mean something new (`pretrain --init-from` initialises them).

Which words (`select_new_words`): the words of the domain text the current vocabulary splits into
`min_pieces` (default 3) or more WordPieces and that occur at least `min_count` (default 2) times,
ranked by the tokens they would save, `count * (pieces - 1)`. Why:

- Tokens saved is what a slot buys: every occurrence of the word becomes one token instead of
  `pieces`, so this ranking shortens the corpus's sequences the most for the slots there are.
- A word split in two is nearly always a known stem and a known suffix or a compound of two
  known words (`walk ##ing`, `sea ##weed`): the model already composes it from meaningful
  pieces. Three or more pieces are mostly meaningless fragments (`g ##ry ##ph ##on`), which is
  where a word of its own helps the model most.
- A word seen once is as often a typo or a one-off name as a domain term, and one occurrence
  gives its new embedding almost nothing to learn from.
- A word WordPiece cannot spell at all (one `[UNK]`: a character the vocabulary lacks) is one token
  already and saves nothing: it is not added.

Words are the basic tokens the tokenizer itself produces (lower-casing and accent stripping as the
model's tokenizer settings say, punctuation and CJK split), taken from its own normaliser and
pre-tokeniser, so each new word is exactly what WordPiece later sees. WordPiece's greedy
longest-match-first tries the whole word first, so a word in the vocabulary is always one token;
`extend_vocab` checks this with a tokenizer loaded from the file it wrote before putting it in place.

What changes: a new word's own occurrences become one token, and so can a longer word that starts
with it (its first piece is chosen greedily: with `gryphon` added, `gryphons` becomes
`gryphon ##s`). Continuation pieces (`##...`) are never added, so every other word - every word
that does not start with a new word - tokenizes exactly as before, to the same ids.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Iterable

from .._files import temporary_file
from .reference import WordpieceTokenizer
from .tokenizer import BertTokenizer

UNUSED = re.compile(r"\[unused\d+\]")
REPORT_SUFFIX = ".extend.json"
# Texts are normalised in chunks of about this many characters: one call into the Rust normaliser per
# chunk instead of per sentence (a newline is whitespace to the basic tokenizer, so joining is exact).
_CHUNK_CHARS = 1 << 16


def unused_slots(vocab: dict[str, int]) -> list[int]:
    """Ids of the `[unusedN]` entries, in id order: the slots that can take new words."""
    return sorted(i for token, i in vocab.items() if UNUSED.fullmatch(token))


def load_source_tokenizer(model_or_vocab: str | os.PathLike) -> BertTokenizer:
    """The tokenizer whose vocabulary is extended: a model directory's (with its tokenizer_config.json
    settings) or a vocab.txt's (lower-casing guessed from the vocabulary, as BertTokenizer does)."""
    path = Path(model_or_vocab)
    if path.is_dir():
        return BertTokenizer.from_pretrained(path)
    if path.is_file():
        return BertTokenizer(path, do_lower_case=None)
    raise FileNotFoundError(f"vocabulary or model directory not found: {path}")


def basic_words(tokenizer: BertTokenizer, text: str) -> list[str]:
    """The words of `text` as `tokenizer` hands them to WordPiece: its basic tokens.

    Special tokens written in the text ([CLS], ...) are kept whole, as the tokenizer does. The fast
    backend's own normaliser and pre-tokeniser are used where it would use them, the reference
    BasicTokenizer elsewhere, so the words are exactly the tokenizer's.
    """
    pattern = tokenizer.reference.special_pattern
    parts = pattern.split(text) if pattern else [text]
    words: list[str] = []
    for i, part in enumerate(parts):
        if i % 2:  # a special token written in the text
            words.append(part)
        elif tokenizer._use_reference(part):
            words.extend(tokenizer.reference.basic.tokenize(part))
        else:
            normalized = tokenizer.fast.normalizer.normalize_str(part)
            words.extend(word for word, _ in tokenizer.fast.pre_tokenizer.pre_tokenize_str(normalized))
    return words


def count_words(tokenizer: BertTokenizer, texts: Iterable[str]) -> Counter:
    """word -> occurrences over `texts`, words as `basic_words` gives them."""
    counts: Counter = Counter()

    def add(chunk: list[str]) -> None:
        joined = "\n".join(chunk)
        if tokenizer.fast is not None and tokenizer._use_reference(joined):
            for text in chunk:  # only the texts that hold a divergent character take the slow reference path
                counts.update(basic_words(tokenizer, text))
        else:
            counts.update(basic_words(tokenizer, joined))

    chunk: list[str] = []
    size = 0
    for text in texts:
        chunk.append(text)
        size += len(text)
        if size >= _CHUNK_CHARS:
            add(chunk)
            chunk, size = [], 0
    if chunk:
        add(chunk)
    return counts


def piece_counts(vocab: dict[str, int], words: Iterable[str], max_input_chars_per_word: int = 200) -> dict[str, int]:
    """word -> number of WordPieces (greedy longest-match-first) `vocab` splits it into."""
    wordpiece = WordpieceTokenizer(vocab, max_input_chars_per_word=max_input_chars_per_word)
    return {word: len(wordpiece.tokenize_word(word)) for word in words}


def select_new_words(counts: Counter, pieces: dict[str, int], max_new: int, min_pieces: int = 3,
                     min_count: int = 2) -> list[str]:
    """Up to `max_new` words split into `min_pieces` or more pieces and seen `min_count` times or more,
    by tokens saved (`count * (pieces - 1)`), then by count, then alphabetically (a stable order)."""
    candidates = [w for w, c in counts.items() if pieces[w] >= min_pieces and c >= min_count]
    candidates.sort(key=lambda w: (-counts[w] * (pieces[w] - 1), -counts[w], w))
    return candidates[:max_new]


def corpus_stats(counts: Counter, pieces: dict[str, int]) -> dict[str, float | int]:
    """Word occurrences, tokens, tokens per word and the occurrences that are one token."""
    words = sum(counts.values())
    tokens = sum(c * pieces[w] for w, c in counts.items())
    single = sum(c for w, c in counts.items() if pieces[w] == 1)
    return {"tokens": tokens, "tokens_per_word": tokens / words if words else 0.0, "single_token_words": single}


def report_path(output: str | os.PathLike) -> Path:
    """`vocab.txt` -> `vocab.extend.json`, beside the written vocabulary."""
    output = Path(output)
    return output.with_name(output.stem + REPORT_SUFFIX)


def extend_vocab(model_or_vocab: str | os.PathLike, texts: Iterable[str], output: str | os.PathLike,
                 max_new: int | None = None, min_pieces: int = 3, min_count: int = 2,
                 inputs: list[str] | None = None) -> dict:
    """Write a copy of the vocabulary with the domain's words in its `[unusedN]` slots; return the report.

    `model_or_vocab` is a vocab.txt or a model directory holding one; `texts` the domain's text (any
    split: words never cross a text's boundary); `max_new` at most the free slots (default: all of
    them, if there are candidates enough). Every token other than the filled `[unusedN]` keeps its
    id. The report (also written beside `output` as `<stem>.extend.json`) gives the corpus's word
    occurrences, its tokens and tokens per word before and after, and how many occurrences become
    single tokens. Both files are written atomically; the vocabulary last, after the check that each
    new word is one token for a tokenizer loaded from it.
    """
    tokenizer = load_source_tokenizer(model_or_vocab)
    source = tokenizer.vocab_file
    output = Path(output)
    slots = unused_slots(tokenizer.vocab)
    if not slots:
        raise ValueError(f"{source}: no [unusedN] entries left to hold new words")
    if max_new is None:
        max_new = len(slots)
    if max_new < 1 or max_new > len(slots):
        raise ValueError(f"max_new (--max-new) {max_new}: {source} has {len(slots)} [unusedN] slots, "
                         f"so from 1 to {len(slots)} new words fit")
    if min_pieces < 2:
        raise ValueError(f"min_pieces (--min-pieces) {min_pieces}: a word must be split in 2 pieces or more "
                         "to gain from an entry of its own")
    if output.is_dir():
        raise ValueError(f"--output {output} is a directory: give the vocab.txt file to write")
    if not output.parent.is_dir():
        raise FileNotFoundError(f"--output {output}: directory {output.parent} not found")
    if output.exists() and output.resolve() == source.resolve():
        raise ValueError(f"--output {output} is the vocabulary being extended: write the extension elsewhere")

    counts = count_words(tokenizer, texts)
    if not counts:
        raise ValueError("the domain text holds no words")
    limit = tokenizer.max_input_chars_per_word
    before = piece_counts(tokenizer.vocab, counts, limit)
    new_words = select_new_words(counts, before, max_new, min_pieces, min_count)
    if not new_words:
        raise ValueError(f"no word of the domain text is split into {min_pieces} or more pieces and seen "
                         f"{min_count} or more times: nothing to add")

    vocab = dict(tokenizer.vocab)
    replaced = {}
    for word, slot in zip(new_words, slots):
        old = tokenizer.ids_to_tokens[slot]
        del vocab[old]
        vocab[word] = slot
        replaced[word] = old
    after = piece_counts(vocab, counts, limit)

    words = sum(counts.values())
    new_occurrences = sum(counts[w] for w in new_words)
    stats_before, stats_after = corpus_stats(counts, before), corpus_stats(counts, after)
    report = {
        "source": str(source), "output": str(output), "inputs": inputs or [],
        "do_lower_case": tokenizer.do_lower_case, "strip_accents": tokenizer.strip_accents,
        "criterion": {"min_pieces": min_pieces, "min_count": min_count, "rank": "count * (pieces - 1)"},
        "unused_slots": len(slots), "new_words": len(new_words), "unused_slots_left": len(slots) - len(new_words),
        "words": words, "distinct_words": len(counts),
        "new_word_occurrences": new_occurrences, "new_word_share": new_occurrences / words,
        "before": stats_before, "after": stats_after,
        "added": [{"token": w, "id": vocab[w], "replaced": replaced[w], "count": counts[w], "pieces_before": before[w]}
                  for w in new_words],
    }

    handle, temporary = temporary_file(output.parent, prefix=".vocab.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.writelines(token + "\n" for token in sorted(vocab, key=vocab.get))
        _check_single_tokens(temporary, tokenizer, new_words, vocab)
        _write_json(report, report_path(output))
        os.replace(temporary, output)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return report


def _check_single_tokens(vocab_file: str, source: BertTokenizer, new_words: list[str], vocab: dict[str, int]) -> None:
    # The written file, read back by the tokenizer with the source's settings: each new word must come
    # out as itself, one token, at its slot's id.
    extended = BertTokenizer(vocab_file, do_lower_case=source.do_lower_case, strip_accents=source.strip_accents,
                             max_input_chars_per_word=source.max_input_chars_per_word)
    if extended.vocab != vocab:
        raise RuntimeError(f"{vocab_file}: the vocabulary read back differs from the one written")
    wrong = [w for w in new_words if extended.tokenize_with_offsets(w)[0] != [vocab[w]]]
    if wrong:
        raise RuntimeError(f"new word(s) not produced as one token by the extended tokenizer: {', '.join(wrong[:10])}")


def _write_json(report: dict, path: Path) -> None:
    handle, temporary = temporary_file(path.parent, prefix=".extend.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(report, file, indent=2, ensure_ascii=False)
            file.write("\n")
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


__all__ = ["basic_words", "count_words", "extend_vocab", "load_source_tokenizer", "piece_counts",
           "report_path", "select_new_words", "unused_slots"]
