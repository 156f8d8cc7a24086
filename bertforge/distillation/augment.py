"""Data augmentation for distillation: more transfer text, made from the training text itself.

A student learns the teacher's function from the teacher's outputs, so every text the teacher labels is a
lesson, labelled or not. With few training texts the student sees too little of that function; Tang et
al. 2019 ("Distilling Task-Specific Knowledge from BERT into Simple Neural Networks", §3.2) and TinyBERT
(Jiao et al. 2020, §3.2 "Data Augmentation") add perturbed copies of each training text to the transfer
set: the teacher's soft targets on them are the only targets (no label is assumed to survive the
perturbation).

Per word of a text (words: whitespace-separated), as Tang et al.'s procedure, one draw X ~ U(0, 1):

* X < p_mask (0.1): **masking**, the word becomes `[MASK]` (the teacher has seen it in pre-training;
  the student learns what a word contributes by its absence);
* p_mask <= X < p_mask + p_replace (0.1): **replacement**. Tang et al. draw a word of the same part of
  speech; here, without a tagger, a word drawn from the training text's unigram distribution. With a
  masked language model (`MaskedLmCandidates`, `--augment-mlm`), TinyBERT's rule instead: a word that is a
  single WordPiece is replaced by one of the model's top K = 15 predictions for that position masked (a
  word of several pieces keeps the unigram draw; TinyBERT uses GloVe neighbours there);
* otherwise the word is kept.

Then, with probability p_ngram (0.25), **n-gram sampling**: n is drawn from 1..5 and a random window of
n consecutive words is kept (the whole text when it has n words or fewer).

Everything is a pure function of the text and a seed: copy c of text i draws from
`random.Random(f"{seed}:{i}:{c}")`, so one augmentation seed (`--augment-seed`, not the training seed)
gives the same augmented set in every run, hence the same teacher outputs, computed once for all students
(`cache.cache_key` hashes the inputs). `augmented_transfer` keeps the augmented texts beside the teacher's
outputs, so that a second student (or --resume) reads them back instead of running the MLM again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from .._files import atomic_open
from ..modeling import BertForMaskedLM, load_for_inference
from ..modeling.pretrained import read_tensor_shapes, resolve_model_dir, weights_path
from ..tokenization import BertTokenizer
from .cache import file_digest

logger = logging.getLogger("bertforge")

__all__ = ["MASK", "MAX_AUGMENT", "MAX_AUGMENTED_TEXTS", "AugmentRates", "MaskedLmCandidates", "augment_text",
           "augment_texts", "augment_words", "augmented_transfer", "check_augment", "check_masked_lm",
           "iter_augmented", "unigram_words"]

MASK = "[MASK]"
MAX_NGRAM = 5  # Tang et al.: n in {1, ..., 5}
TOP_K = 15  # TinyBERT's K
# The bounds of --augment: copies per training text (Tang et al. and TinyBERT use 20), and augmented texts in
# all. The transfer set, its features included, is held in memory (about 1 to 3 KB per text of a few dozen
# tokens), so 2 million texts (TinyBERT's 20 copies of SST-2's 67k sentences fit) stay within a few GB.
MAX_AUGMENT = 100
MAX_AUGMENTED_TEXTS = 2_000_000

# candidates(words, position) -> replacement words for words[position] (empty: fall back to the unigram draw)
Candidates = Callable[[Sequence[str], int], Sequence[str]]


@dataclass(frozen=True)
class AugmentRates:
    """Tang et al. 2019's probabilities (§3.2 and §4.2: p_mask = p_pos = 0.1, p_ng = 0.25)."""

    mask: float = 0.1
    replace: float = 0.1
    ngram: float = 0.25


def unigram_words(texts: Sequence[str]) -> list[str]:
    """Every word of `texts`, repeats kept: drawing uniformly from it draws from their unigram distribution."""
    return [word for text in texts for word in text.split()]


def augment_words(words: Sequence[str], rng: random.Random, unigram: Sequence[str],
                  candidates: Candidates | None = None, rates: AugmentRates = AugmentRates()) -> list[str]:
    """One augmented copy of `words` (see the module docstring): masking, replacement, then n-gram sampling.
    `unigram`: the words replacements are drawn from; `candidates`: an MLM's replacements (TinyBERT's rule)."""
    out = []
    for position, word in enumerate(words):
        x = rng.random()
        if x < rates.mask:
            out.append(MASK)
        elif x < rates.mask + rates.replace:
            choices = candidates(words, position) if candidates is not None else ()
            out.append(rng.choice(choices) if choices else rng.choice(unigram) if unigram else word)
        else:
            out.append(word)
    if rng.random() < rates.ngram:
        n = rng.randint(1, MAX_NGRAM)
        if len(out) > n:
            start = rng.randint(0, len(out) - n)
            out = out[start:start + n]
    return out


def augment_text(text: str, seed: int, index: int, copy: int, unigram: Sequence[str],
                 candidates: Candidates | None = None, rates: AugmentRates = AugmentRates()) -> str:
    """Copy `copy` of text number `index` under augmentation `seed`: the same arguments, the same text."""
    rng = random.Random(f"{seed}:{index}:{copy}")
    return " ".join(augment_words(text.split(), rng, unigram, candidates, rates))


def augment_texts(texts: Sequence[Sequence[str | None]], copies: int, seed: int, unigram: Sequence[str],
                  candidates: Candidates | None = None, rates: AugmentRates = AugmentRates()) -> list[tuple]:
    """`copies` augmented copies of each example, in order (example 0's copies first). An example is a tuple
    of texts (a sentence, or a pair: each text augmented with its own draws, as text number 2i and 2i + 1
    of `augment_text`; None stays None)."""
    return list(iter_augmented(texts, copies, seed, unigram, candidates, rates))


def iter_augmented(texts: Sequence[Sequence[str | None]], copies: int, seed: int, unigram: Sequence[str],
                   candidates: Candidates | None = None, rates: AugmentRates = AugmentRates()) -> Iterator[tuple]:
    """`augment_texts`' copies one at a time, in the same order (a writer streams them to disk)."""
    for index, example in enumerate(texts):
        for copy in range(copies):
            yield tuple(None if text is None else augment_text(text, seed, index * 2 + part, copy, unigram,
                                                               candidates, rates)
                        for part, text in enumerate(example))


def check_augment(copies: int, examples: int | None = None, flag: str = "--augment") -> None:
    """ValueError, one line naming `flag`, unless `copies` is 0 to MAX_AUGMENT and (`examples` given: the
    training texts) the augmented texts number at most MAX_AUGMENTED_TEXTS. Judged before any text is made:
    the transfer set (its texts and their features) is held in memory."""
    if not 0 <= copies <= MAX_AUGMENT:
        raise ValueError(f"{flag} must be 0 or more, at most {MAX_AUGMENT} copies of each training text (Tang et al. "
                         f"and TinyBERT use 20), got {copies}")
    if examples is not None and copies * examples > MAX_AUGMENTED_TEXTS:
        raise ValueError(f"{flag} {copies}: {copies} copies of {examples:,} training texts are {copies * examples:,} "
                         f"augmented texts, over the limit of {MAX_AUGMENTED_TEXTS:,} (the transfer set is held in "
                         f"memory); give at most {max(MAX_AUGMENTED_TEXTS // max(examples, 1), 0)}")


def check_masked_lm(model_dir: str | os.PathLike) -> None:
    """`--augment-mlm`'s checkpoint judged from its files' headers (milliseconds): a vocabulary and a
    masked-LM head (`cls.predictions.*`, bertforge's and transformers' name). ValueError, one line."""
    directory = Path(resolve_model_dir(model_dir))
    if not (directory / "vocab.txt").is_file():
        raise FileNotFoundError(f"--augment-mlm {model_dir}: no vocab.txt")
    weights = weights_path(directory)
    if not any(name.startswith("cls.predictions.") for name in read_tensor_shapes(weights)):
        raise ValueError(f"--augment-mlm {model_dir}: {weights} has no masked-LM head (no cls.predictions.* "
                         "tensors): give a pre-trained checkpoint with its MLM head (BertForMaskedLM / "
                         "BertForPreTraining)")


class MaskedLmCandidates:
    """TinyBERT's replacements: the top-K words a masked language model predicts at a word's position.

    `model_dir`: a checkpoint with an MLM head (bertforge's `BertForMaskedLM` / `BertForPreTraining`, or
    transformers' `BertForMaskedLM`: the same tensor names); a checkpoint without one is a ValueError.
    Called as `candidates(words, position)`: the predictions for `words[position]` when it is one WordPiece
    (the input is the text with that piece replaced by [MASK]), excluding special tokens and `##`
    continuations; empty for a word of several pieces. All the positions of one text are predicted in one
    batch, kept until another text is asked for (the copies of a text are made one after another)."""

    def __init__(self, model_dir: str, top_k: int = TOP_K, max_length: int = 128, device: str | None = None):
        directory = resolve_model_dir(model_dir)
        self.model = load_for_inference(BertForMaskedLM, directory, task=f"--augment-mlm {model_dir}")
        self.model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.device = next(self.model.parameters()).device
        self.tokenizer = BertTokenizer.from_pretrained(directory)
        self.top_k, self.max_length = top_k, min(max_length, self.model.config.max_position_embeddings)
        vocab = self.tokenizer.vocab
        self.words = {i: token for token, i in vocab.items()}
        self.excluded = torch.tensor([token.startswith("##") or (token.startswith("[") and token.endswith("]"))
                                      for token, _ in sorted(vocab.items(), key=lambda item: item[1])])
        self._text: tuple[str, ...] | None = None
        self._predicted: dict[int, list[str]] = {}

    def __call__(self, words: Sequence[str], position: int) -> list[str]:
        if tuple(words) != self._text:
            self._text, self._predicted = tuple(words), self._predict(list(words))
        return self._predicted.get(position, [])

    @torch.no_grad()
    def _predict(self, words: list[str]) -> dict[int, list[str]]:
        vocab = self.tokenizer.vocab
        pieces = [self.tokenizer.tokenize(word) for word in words]
        ids, starts = [vocab["[CLS]"]], []
        for word_pieces in pieces:
            starts.append(len(ids))
            ids.extend(self.tokenizer.convert_tokens_to_ids(word_pieces))
        ids = ids[:self.max_length - 1] + [vocab["[SEP]"]]
        positions = [p for p, (start, wp) in enumerate(zip(starts, pieces)) if len(wp) == 1 and start < len(ids) - 1]
        if not positions:
            return {}
        batch = torch.tensor([ids] * len(positions))
        rows = torch.arange(len(positions))
        columns = torch.tensor([starts[p] for p in positions])
        batch[rows, columns] = vocab[MASK]
        batch = batch.to(self.device)
        logits = self.model(input_ids=batch, attention_mask=torch.ones_like(batch)).logits[rows, columns].float().cpu()
        vocab_size = min(logits.shape[-1], len(self.excluded))
        logits = logits[:, :vocab_size].masked_fill(self.excluded[:vocab_size], float("-inf"))
        top = logits.topk(min(self.top_k, vocab_size), dim=-1)
        return {p: [self.words[i] for i, v in zip(row, values) if v > float("-inf")]
                for p, row, values in zip(positions, top.indices.tolist(), top.values.tolist())}


def augmented_transfer(cache_dir: str | os.PathLike, examples: Sequence[Sequence[str | None]], copies: int, seed: int,
                       mlm: str | os.PathLike | None = None, rates: AugmentRates = AugmentRates(),
                       device: str | None = None) -> list[tuple]:
    """`augment_texts` of `examples` (the unigram distribution: their words), with `mlm`'s candidates when
    given (the MLM run on `device`: default the GPU if there is one); stored as
    `cache_dir/augmented-<key>.json` (key: a hash of the texts, copies, seed, rates and the MLM's weights and
    vocabulary) and read back from there when present.

    The count is judged first (`check_augment`: ValueError before any text is made or the MLM loads); the
    copies are then written to the file one per line as they are made (a JSON array, one row a line), so
    that only the returned rows are held, never a second copy of them as one JSON string."""
    check_augment(copies, len(examples))
    digest = hashlib.sha256(str(len(examples)).encode())
    for example in examples:  # the texts hashed one by one: no JSON string of them all
        digest.update(json.dumps(list(example), ensure_ascii=False).encode())
    digest.update(json.dumps([copies, seed, asdict(rates), TOP_K, MAX_NGRAM]).encode())
    if mlm is not None:
        directory = Path(resolve_model_dir(mlm))
        digest.update(file_digest(weights_path(directory)).encode())
        digest.update(file_digest(directory / "vocab.txt").encode())
    path = Path(cache_dir) / f"augmented-{digest.hexdigest()[:24]}.json"
    stored = _read_rows(path, copies * len(examples))
    if stored is not None:
        logger.info("augmented transfer set read back from %s", path)
        return stored
    unigram = unigram_words([text for example in examples for text in example if text is not None])
    candidates = MaskedLmCandidates(str(mlm), device=device) if mlm is not None else None
    augmented = []
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "w", encoding="utf-8", newline="\n") as out:
        out.write("[\n")
        for row in iter_augmented(examples, copies, seed, unigram, candidates, rates):
            out.write(("" if not augmented else ",\n") + json.dumps(list(row), ensure_ascii=False))
            augmented.append(row)
        out.write("\n]\n")
    logger.info("augmented transfer set (%d texts) written to %s", len(augmented), path)
    return augmented


def _read_rows(path: Path, count: int) -> list[tuple] | None:
    """The `count` rows of an augmented-text file, read line by line (one row a line); None when absent,
    unreadable or of another count (then made again)."""
    rows = []
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                line = line.strip().rstrip(",")
                if line in ("[", "]", ""):
                    continue
                row = json.loads(line)
                if not isinstance(row, list) or not all(text is None or isinstance(text, str) for text in row):
                    return None  # not one row a line (an older file holding every row on one line): made again
                rows.append(tuple(row))
                if len(rows) > count:
                    return None
    except (OSError, ValueError):
        return None
    return rows if len(rows) == count else None
