"""Google's `create_instances_from_document` over a bounded window of documents.

A document is held as one token array plus sentence boundaries, so segment A, segment B (IsNext)
and a random document's run of sentences (NotNext) are all contiguous slices.

Semantics, as Google's `create_pretraining_data.py`:

- `max_num_tokens = max_seq_length - 3`; with probability `short_seq_prob` the target length is
  `randint(2, max_num_tokens)` instead. DIFFERENCE: Google draws the target once per *document*;
  we draw it afresh for every instance (as the paper describes: "10 % of the time"). With Google's
  rule a book-sized document is either all short or all full-length, so the short share over a
  corpus of 45 books would be a coin toss per book; per instance it is 10 % up to sampling noise.
  A short target does not always give a short instance: whole sentences are added until the
  target is reached, so one long sentence overshoots it.
- sentences are gathered into a chunk until it reaches the target or the document ends; A is
  the first `randint(1, len(chunk) - 1)` sentences (all of a one-sentence chunk);
- B is the rest of the chunk (IsNext, label 0), or with probability 0.5 sentences from a random
  *other* document starting at a random sentence, until `target - len(A)` tokens (NotNext, label
  1); the chunk's unused sentences are put back (`i -= num_unused_segments`).
  DIFFERENCE: Google has no B for a one-sentence chunk (a sentence that alone reaches the target:
  a long one, or any under a short target) and makes it NotNext without tossing the coin; on the
  books that is ~3 % of the instances and leaves IsNext at ~48.5 % instead of 50 %. Here such a
  chunk tosses the coin too, and an IsNext B continues into the document's following sentences
  up to `target - len(A)` tokens (the same rule as a NotNext B in the other document). Only a
  one-sentence chunk at the very end of a document is still forced to NotNext.
- the pair is truncated to `max_num_tokens` one token at a time from the longer side (B on ties),
  from the front or the back with equal probability (`truncate_seq_pair`);
- `dupe_factor` passes are made over every document, each with fresh random choices.

Bounded memory - the document window. Google picks NotNext documents uniformly from the whole
corpus, which it holds in memory (token lists of Python strings: gigabytes for Wikipedia). Here
documents stream in and stay in a window of at most `buffer_documents` documents and
`buffer_tokens` tokens (int32: 4 bytes a token). When the window is full, a random document
leaves it: its instances are made, drawing NotNext documents from those still in the window, and it
is dropped. At the end the remaining documents are processed in random order, each with all the
others still available. So a corpus that fits the window gets exactly Google's sampling; a larger
one gets NotNext segments from a random set of nearby documents (in input order, so, e.g.,
Wikipedia articles with neighbouring ids, or the other books of the same worker). The trade-off:
memory is bounded by the window (plus the largest document) instead of growing with the corpus,
while negatives are less diverse than corpus-wide sampling (topically closer, each document reused
more often; its effect on NSP accuracy has not been measured here). Only a corpus of a single document takes its
NotNext segments from that same document (Google's fallback after 10 draws).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np


@dataclass
class Document:
    tokens: np.ndarray   # int32, all sentences concatenated
    bounds: np.ndarray   # int64, sentence i is tokens[bounds[i]:bounds[i+1]]
    # (index in the sentences given to `tokenize_document`, tokens) of each sentence over its `long_sentence`
    long_sentences: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_sentences(self) -> int:
        return len(self.bounds) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


def tokenize_document(sentences: Sequence[str], tokenizer, unk_id: int, forbidden_ids: Sequence[int],
                      batch_size: int = 4096, long_sentence: int | None = None) -> Document | None:
    """Token ids of a document's sentences via the tokenizer's batch path (ids identical to
    `tokenize`). Sentences with no tokens are dropped; special tokens that the raw text spells out
    (a literal "[SEP]") become [UNK] so that they cannot fake the structure. None if empty.
    `long_sentence`: record the sentences of more tokens than that in `Document.long_sentences` (an
    instance keeps at most max_seq_length - 3 tokens of a sentence; the rest is never seen)."""
    token_parts: list[np.ndarray] = []
    length_parts: list[np.ndarray] = []
    for start in range(0, len(sentences), batch_size):
        pieces = [ids for ids, _ in tokenizer._ids_batch(sentences[start:start + batch_size], offsets=False)]
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
        token_parts.append(np.fromiter(itertools.chain.from_iterable(pieces), dtype=np.int32,
                                       count=int(lengths.sum())))
        length_parts.append(lengths)
    if not length_parts:
        return None
    lengths = np.concatenate(length_parts)
    tokens = np.concatenate(token_parts)
    if len(tokens) == 0:
        return None
    long_sentences = [] if long_sentence is None else \
        [(int(i), int(lengths[i])) for i in np.flatnonzero(lengths > long_sentence)]
    if forbidden_ids:
        tokens[np.isin(tokens, np.asarray(forbidden_ids, dtype=np.int32))] = unk_id
    lengths = lengths[lengths > 0]
    bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    return Document(tokens, bounds, long_sentences)


@dataclass
class Instance:
    document: Document
    a: tuple[int, int]          # token slice of segment A in `document`
    other: Document             # where B comes from (the same document for IsNext)
    b: tuple[int, int]
    is_random_next: bool
    short_target: bool
    truncated: bool
    same_document_fallback: bool = False


def truncate_seq_pair(a: list[int], b: list[int], max_num_tokens: int, rng: random.Random) -> bool:
    """Google's `truncate_seq_pair` on [lo, hi) slices (mutated in place). True if it cut anything."""
    cut = False
    while (a[1] - a[0]) + (b[1] - b[0]) > max_num_tokens:
        trunc = a if (a[1] - a[0]) > (b[1] - b[0]) else b
        if rng.random() < 0.5:
            trunc[0] += 1
        else:
            trunc[1] -= 1
        cut = True
    return cut


def document_instances(document: Document, others: Sequence[Document], rng: random.Random,
                       max_seq_length: int, short_seq_prob: float) -> Iterator[Instance]:
    """One pass of Google's `create_instances_from_document` (with a per-instance target)."""
    max_num_tokens = max_seq_length - 3
    bounds = document.bounds
    n = document.num_sentences

    def draw_target() -> tuple[int, bool]:
        if rng.random() < short_seq_prob:
            return rng.randint(2, max_num_tokens), True
        return max_num_tokens, False

    target, short = draw_target()
    chunk_start = 0
    current_length = 0
    i = 0
    while i < n:
        current_length += int(bounds[i + 1] - bounds[i])
        if i == n - 1 or current_length >= target:
            chunk_len = i - chunk_start + 1
            a_end = rng.randint(1, chunk_len - 1) if chunk_len >= 2 else 1
            a = [int(bounds[chunk_start]), int(bounds[chunk_start + a_end])]
            fallback = False
            last_sentence = i == n - 1
            if (chunk_len == 1 and last_sentence) or rng.random() < 0.5:
                is_random_next = True
                target_b_length = target - (a[1] - a[0])
                if others:
                    other = others[rng.randrange(len(others))]
                else:
                    other, fallback = document, True
                ob = other.bounds
                start = rng.randint(0, other.num_sentences - 1)
                end = int(np.searchsorted(ob, ob[start] + target_b_length, side="left"))
                end = min(max(end, start + 1), other.num_sentences)
                b = [int(ob[start]), int(ob[end])]
                i -= chunk_len - a_end  # put the unused sentences back
            elif chunk_len >= 2:
                is_random_next = False
                other = document
                b = [int(bounds[chunk_start + a_end]), int(bounds[i + 1])]
            else:
                # A one-sentence chunk that is not the document's last: B continues into the
                # following sentences, as a NotNext B runs through a random document.
                is_random_next = False
                other = document
                target_b_length = target - (a[1] - a[0])
                end = int(np.searchsorted(bounds, bounds[i + 1] + target_b_length, side="left"))
                end = min(max(end, i + 2), n)
                b = [int(bounds[i + 1]), int(bounds[end])]
                i = end - 1
            truncated = truncate_seq_pair(a, b, max_num_tokens, rng)
            yield Instance(document, (a[0], a[1]), other, (b[0], b[1]), is_random_next, short, truncated, fallback)
            chunk_start = i + 1
            current_length = 0
            target, short = draw_target()
        i += 1


def windowed_instances(documents: Iterable[Document], rng: random.Random, *, max_seq_length: int,
                       short_seq_prob: float, dupe_factor: int, buffer_documents: int, buffer_tokens: int,
                       on_document: Callable[[Document], None] | None = None) -> Iterator[Instance]:
    """Instances of all documents, NotNext segments drawn from a bounded window (module docstring)."""
    window: list[Document] = []
    window_tokens = 0

    def process(index: int) -> Iterator[Instance]:
        document = window[index]
        others = window[:index] + window[index + 1:]
        if on_document:
            on_document(document)
        for _ in range(dupe_factor):
            yield from document_instances(document, others, rng, max_seq_length, short_seq_prob)

    for document in documents:
        window.append(document)
        window_tokens += document.num_tokens
        while len(window) > buffer_documents or (window_tokens > buffer_tokens and len(window) > 1):
            index = rng.randrange(len(window))
            yield from process(index)
            window_tokens -= window.pop(index).num_tokens
    order = list(range(len(window)))
    rng.shuffle(order)
    for index in order:
        yield from process(index)
