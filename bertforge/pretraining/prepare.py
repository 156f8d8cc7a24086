"""`bertforge prepare-pretraining`: raw text -> masked-LM / next-sentence instances on disk.

Pipeline per worker: files -> documents (`text.read_documents`, streamed) -> token ids
(`BertTokenizer` batch path) -> a bounded document window (`instances.windowed_instances`) ->
instances -> masking (static) -> shards (`shards.ShardWriter`, flushed every `shard_size`).

Parallelism: `workers` processes each make and write their own shards (workers.py). The main process
renames the shards to `shard-00000`, ... (worker 0's first), copies the vocabulary (`vocab.txt`, byte
for byte) and the tokenizer settings (`tokenizer_config.json`) beside them, so that the directory is
all `bertforge pretrain` needs, and writes `index.json` last, atomically.

Shuffling: instances are stored in corpus order (a document's instances together; dupes adjacent).
Google shuffles all instances in memory; here the dataset is random access, so shuffling is the
sampler's job (`DataLoader(shuffle=True)` or a shuffled distributed sampler).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from .._files import own_directory, write_text_atomic
from ..tokenization import BertTokenizer
from ..tokenization.tokenizer import TOKENIZER_CONFIG_NAME
from ..tokenization.vocab import CLS, MASK, PAD, SEP, VOCAB_NAME, continuation_flags, vocab_fingerprint
from .shards import (CONTINUATION_NAME, FIELDS, FORMAT, INDEX_NAME, MASK_FIELDS, MAX_SEQ_LENGTH_LIMIT, id_dtype,
                     save_atomic, shard_file)
from .text import FORMATS, check_utf8
from .workers import _assign_files, _run_parallel, _run_worker, long_sentence_limit

logger = logging.getLogger("bertforge")

MASKING = ("static", "dynamic")
DEFAULT_SHARD_SIZE = 65536
DEFAULT_BUFFER_DOCUMENTS = 1000
DEFAULT_BUFFER_TOKENS = 4_000_000
_STALE = re.compile(r"^(shard-\d+|\.tmp-w\d+-\d+)\.[a-z_]+\.npy(\.part)?$")


def _clear_outputs(directory: Path, vocab_file: Path) -> None:
    """Remove a previous run's index, shards and vocabulary files (only files of this format's naming;
    `_check_vocab_target` has made sure that a `vocab.txt` here is such a copy, unless it is `vocab_file`)."""
    index = directory / INDEX_NAME
    if index.exists():
        index.unlink()
    (directory / CONTINUATION_NAME).unlink(missing_ok=True)
    for entry in directory.iterdir():
        if entry.is_file() and _STALE.match(entry.name):
            entry.unlink()
    copy = directory / VOCAB_NAME
    if copy.is_file() and not copy.samefile(vocab_file):
        copy.unlink()
        (directory / TOKENIZER_CONFIG_NAME).unlink(missing_ok=True)


def _check_vocab_target(directory: Path, vocab_file: Path, fingerprint: str) -> None:
    """Refuse before any work to replace a `DIR/vocab.txt` that holds another vocabulary than `vocab_file`,
    unless it is the one a previous run wrote (its fingerprint is that run's index.json's `vocab_hash`)."""
    target = directory / VOCAB_NAME
    if not target.is_file() or target.samefile(vocab_file):
        return
    try:
        existing = vocab_fingerprint(target)
    except ValueError:  # not a BERT vocabulary at all
        existing = None
    if existing == fingerprint:
        return
    previous = None
    if (directory / INDEX_NAME).is_file():
        try:
            previous = json.loads((directory / INDEX_NAME).read_text(encoding="utf-8")).get("vocab_hash")
        except (json.JSONDecodeError, AttributeError):
            previous = None
    if existing is None or previous != existing:
        raise ValueError(f"{target} already exists and is another vocabulary than {vocab_file}; the output directory "
                         f"gets the vocabulary its data is made with: choose another --output-dir or move {target} away")


def _line_of(path: str, start: str) -> int | None:
    """The first line of `path` holding `start` (a sentence's opening words), None if none does (a
    sentence joined from a hard-wrapped paragraph's lines may begin mid-line: then that line)."""
    if not start:
        return None
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if start in line:
                return number
    return None


def _warn_long_sentences(path: str, record: dict, max_seq_length: int) -> dict:
    """One warning for a file's sentences over `long_sentence_limit`; the record as kept in the index
    (with the longest one's line)."""
    line = _line_of(path, record["start"])
    where = f"{path}:{line}" if line is not None else path
    logger.warning("%s: a sentence of %d tokens, over twice --max-seq-length %d: an instance keeps at most %d of a "
                   "sentence's tokens; %d such sentence(s) in this file, %d tokens more than their instances "
                   "hold (one sentence per line, or text with sentence punctuation, avoids it)", where,
                   record["longest"], max_seq_length, max_seq_length - 3, record["sentences"], record["tokens_dropped"])
    return {"sentences": record["sentences"], "tokens_dropped": record["tokens_dropped"],
            "longest": record["longest"], "line": line, "limit": long_sentence_limit(max_seq_length)}


def _write_tokenizer(directory: Path, vocab_file: Path, settings: dict) -> None:
    """DIR/vocab.txt (a verbatim copy, so that every id stays its line number) and DIR/tokenizer_config.json."""
    target = directory / VOCAB_NAME
    if not (target.is_file() and target.samefile(vocab_file)):
        with open(vocab_file, encoding="utf-8", newline="") as source:  # newlines untranslated
            write_text_atomic(target, source.read())
    write_text_atomic(directory / TOKENIZER_CONFIG_NAME, json.dumps(settings, indent=2) + "\n")


def _validate(max_seq_length, max_predictions_per_seq, masked_lm_prob, short_seq_prob, dupe_factor, masking,
              input_format, workers, shard_size, buffer_documents, buffer_tokens) -> None:
    if not 8 <= max_seq_length <= MAX_SEQ_LENGTH_LIMIT:
        raise ValueError(f"max_seq_length must be in [8, {MAX_SEQ_LENGTH_LIMIT}], got {max_seq_length}")
    if not (isinstance(masked_lm_prob, (int, float)) and 0 < masked_lm_prob < 1):
        raise ValueError(f"masked_lm_prob must be in (0, 1), got {masked_lm_prob}")
    if not 0 <= short_seq_prob <= 1:
        raise ValueError(f"short_seq_prob must be in [0, 1], got {short_seq_prob}")
    if max_predictions_per_seq < 1:
        raise ValueError(f"max_predictions_per_seq must be at least 1, got {max_predictions_per_seq}")
    if dupe_factor < 1:
        raise ValueError(f"dupe_factor must be at least 1, got {dupe_factor}")
    if masking not in MASKING:
        raise ValueError(f"masking must be 'static' or 'dynamic', got {masking!r}")
    if input_format not in FORMATS:
        raise ValueError(f"input format must be one of {', '.join(FORMATS)}, got {input_format!r}")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if shard_size < 1 or buffer_documents < 1 or buffer_tokens < 1:
        raise ValueError("shard_size, buffer_documents and buffer_tokens must be positive")


def prepare_pretraining(inputs: Sequence[str | os.PathLike], vocab_file: str | os.PathLike,
                        output_dir: str | os.PathLike, *, max_seq_length: int = 128,
                        max_predictions_per_seq: int = 20, masked_lm_prob: float = 0.15,
                        short_seq_prob: float = 0.1, dupe_factor: int = 5, whole_word_mask: bool = False,
                        masking: str = "static", do_lower_case: bool | None = None, seed: int = 12345,
                        workers: int = 1, input_format: str = "auto", shard_size: int = DEFAULT_SHARD_SIZE,
                        buffer_documents: int = DEFAULT_BUFFER_DOCUMENTS, buffer_tokens: int = DEFAULT_BUFFER_TOKENS,
                        progress: bool = True, strict: bool = False) -> dict:
    """Write pre-training instances made from `inputs` to `output_dir`; returns the index dict.

    `output_dir` also gets a copy of `vocab_file` and the tokenizer settings (`tokenizer_config.json`), so
    that `bertforge pretrain --data output_dir` needs nothing else; an existing `output_dir/vocab.txt` holding
    another vocabulary (not a previous run's) is a ValueError, raised before any work.

    `do_lower_case=None` guesses from the vocabulary (as `BertTokenizer`). Raises FileNotFoundError
    for a missing input or vocabulary, ValueError for bad settings or a corpus with no document.
    Bytes that are not UTF-8 are read as U+FFFD and counted: the index's `replaced_bytes` maps each
    such file to its count (and `stats["replaced_bytes"]` totals them); `strict=True` instead refuses
    the first such byte (file, line, offset) before any work starts. `output_dir` is locked for the run
    (`bertforge._files.own_directory`): a second run into it is refused while this one lasts.

    A sentence of more than twice `max_seq_length` tokens loses most of them (an instance keeps at most
    `max_seq_length - 3`; Google's script cuts them silently): each file with such sentences gets one
    warning naming the longest one's line, how many there are and how many tokens they have beyond what
    an instance holds (the index's `long_sentences`).
    """
    with own_directory(output_dir, "bertforge prepare-pretraining"):  # two runs would mix their shards
        return _prepare_pretraining(
            inputs, vocab_file, output_dir, max_seq_length=max_seq_length,
            max_predictions_per_seq=max_predictions_per_seq, masked_lm_prob=masked_lm_prob,
            short_seq_prob=short_seq_prob, dupe_factor=dupe_factor, whole_word_mask=whole_word_mask, masking=masking,
            do_lower_case=do_lower_case, seed=seed, workers=workers, input_format=input_format, shard_size=shard_size,
            buffer_documents=buffer_documents, buffer_tokens=buffer_tokens, progress=progress, strict=strict)


def _prepare_pretraining(inputs: Sequence[str | os.PathLike], vocab_file: str | os.PathLike,
                         output_dir: str | os.PathLike, *, max_seq_length: int, max_predictions_per_seq: int,
                         masked_lm_prob: float, short_seq_prob: float, dupe_factor: int, whole_word_mask: bool,
                         masking: str, do_lower_case: bool | None, seed: int, workers: int, input_format: str,
                         shard_size: int, buffer_documents: int, buffer_tokens: int, progress: bool,
                         strict: bool) -> dict:
    _validate(max_seq_length, max_predictions_per_seq, masked_lm_prob, short_seq_prob, dupe_factor, masking,
              input_format, workers, shard_size, buffer_documents, buffer_tokens)
    files = [str(f) for f in inputs]
    if not files:
        raise ValueError("no input files given")
    for file in files:
        if not Path(file).is_file():
            raise FileNotFoundError(f"pre-training input not found: {file}")
    if strict:
        for file in files:
            check_utf8(file)
    tokenizer = BertTokenizer(vocab_file, do_lower_case=do_lower_case)  # raises for a missing/bad vocab
    vocab = tokenizer.vocab
    vocab_size = max(vocab.values()) + 1  # ids are line numbers
    fingerprint = vocab_fingerprint(vocab)
    vocab_path = Path(vocab_file) / VOCAB_NAME if Path(vocab_file).is_dir() else Path(vocab_file)

    directory = Path(output_dir)
    _check_vocab_target(directory, vocab_path, fingerprint)
    directory.mkdir(parents=True, exist_ok=True)
    _clear_outputs(directory, vocab_path)
    workers = min(workers, len(files))
    base = {
        "vocab_file": str(vocab_file), "do_lower_case": tokenizer.do_lower_case, "output_dir": str(directory),
        "max_seq_length": max_seq_length, "max_predictions_per_seq": max_predictions_per_seq,
        "masked_lm_prob": float(masked_lm_prob), "short_seq_prob": float(short_seq_prob),
        "dupe_factor": dupe_factor, "whole_word_mask": bool(whole_word_mask), "masking": masking,
        "seed": seed, "input_format": input_format, "shard_size": shard_size,
        "buffer_documents": buffer_documents, "buffer_tokens": buffer_tokens,
    }
    jobs = [dict(base, worker=w, num_workers=workers, files=share)
            for w, share in enumerate(_assign_files(files, workers))]
    total_bytes = sum(os.path.getsize(f) for f in files)
    with tqdm(total=total_bytes, unit="B", unit_scale=True, desc="prepare-pretraining", disable=not progress,
              dynamic_ncols=True) as bar:
        try:
            if workers == 1:
                results = [_run_worker(jobs[0], bar.update)]
            else:
                results = _run_parallel(jobs, bar)
        except BaseException:
            _clear_outputs(directory, vocab_path)
            raise

    stats: Counter = Counter()
    formats: Counter = Counter()
    replaced: dict[str, int] = {}
    long_sentences: dict[str, dict] = {}
    for result in results:
        stats.update(result["stats"])
        formats.update(result["formats"])
        replaced.update(result["replaced"])
        long_sentences.update(result["long_sentences"])
    for file in files:
        if file in long_sentences:
            long_sentences[file] = _warn_long_sentences(file, long_sentences[file], max_seq_length)
    if stats["documents"] == 0:
        _clear_outputs(directory, vocab_path)
        raise ValueError(f"no documents in the {len(files)} input file(s): the corpus is empty")

    shards = []
    for result in results:
        for name, count in result["shards"]:
            final = f"shard-{len(shards):05d}"
            for field in FIELDS + (MASK_FIELDS if masking == "static" else ()):
                os.replace(shard_file(directory, name, field), shard_file(directory, final, field))
            shards.append({"name": final, "num_instances": count})
    save_atomic(directory / CONTINUATION_NAME, continuation_flags(vocab))
    _write_tokenizer(directory, vocab_path, tokenizer.settings())

    index = {
        "format": FORMAT,
        "max_seq_length": max_seq_length,
        "max_predictions_per_seq": max_predictions_per_seq,
        "masked_lm_prob": float(masked_lm_prob),
        "short_seq_prob": float(short_seq_prob),
        "dupe_factor": dupe_factor,
        "whole_word_mask": bool(whole_word_mask),
        "masking": masking,
        "seed": seed,
        "do_lower_case": tokenizer.do_lower_case,
        "vocab_size": vocab_size,
        "vocab_hash": fingerprint,  # tokenization.vocab_fingerprint of vocab.txt
        "vocab_file": VOCAB_NAME,
        "input_ids_dtype": id_dtype(vocab_size).name,
        "special_ids": {"pad": vocab[PAD], "cls": vocab[CLS], "sep": vocab[SEP], "mask": vocab[MASK],
                        "unk": tokenizer.unk_token_id},
        "num_instances": int(stats["instances"]),
        "num_documents": int(stats["documents"]),
        "shards": shards,
        "stats": {key: (int(value) if isinstance(value, (int, np.integer)) else value)
                  for key, value in sorted(stats.items())},
        "input_formats": dict(sorted(formats.items())),
        "replaced_bytes": {file: replaced[file] for file in files if file in replaced},
        "long_sentences": {file: long_sentences[file] for file in files if file in long_sentences},
        "workers": workers,
        "buffer_documents": buffer_documents,
        "buffer_tokens": buffer_tokens,
        "shard_size": shard_size,
        "continuation_file": CONTINUATION_NAME,
        "inputs": files,
    }
    write_text_atomic(directory / INDEX_NAME, json.dumps(index, indent=2) + "\n")
    return index
