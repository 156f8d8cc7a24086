"""`bertforge prepare-pretraining`: raw text -> masked-LM / next-sentence instances on disk.

Pipeline per worker: files -> documents (`text.read_documents`, streamed) -> token ids
(`BertTokenizer` batch path) -> a bounded document window (`instances.windowed_instances`) ->
instances -> masking (static) -> shards (`shards.ShardWriter`, flushed every `shard_size`).

Parallelism: `workers` processes (spawn start method, so safe everywhere) each take a fixed share
of the input files (largest first onto the least-loaded worker, by bytes) and write their own
shards with their own random streams derived from (seed, worker): one `random.Random` for the
instance structure, one numpy Generator for masking. Separate streams mean that static and dynamic
masking with the same seed produce the same unmasked instances in the same order. The output is
byte-identical for the same inputs, settings, seed and number of workers (but differs between
worker counts: the file split and the NotNext windows change). The main process renames the shards
to `shard-00000`, ... (worker 0's first), copies the vocabulary (`vocab.txt`, byte for byte) and the
tokenizer settings (`tokenizer_config.json`) beside them, so that the directory is all `bertforge
pretrain` needs, and writes `index.json` last, atomically.

Shuffling: instances are stored in corpus order (a document's instances together; dupes adjacent).
Google shuffles all instances in memory; here the dataset is random access, so shuffling is the
sampler's job (`DataLoader(shuffle=True)` or a shuffled distributed sampler).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import queue
import random
import re
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from tqdm.auto import tqdm

from .._files import write_text_atomic
from ..tokenization import BertTokenizer
from ..tokenization.tokenizer import TOKENIZER_CONFIG_NAME
from ..tokenization.vocab import CLS, MASK, PAD, SEP, VOCAB_NAME, vocab_fingerprint
from .instances import tokenize_document, windowed_instances
from .masking import mask_instance
from .shards import (CONTINUATION_NAME, FIELDS, FORMAT, INDEX_NAME, MASK_FIELDS, MAX_SEQ_LENGTH_LIMIT, ShardWriter,
                     id_dtype, save_atomic, shard_file)
from .text import FORMATS, check_utf8, detect_format, read_documents, replaced_bytes

logger = logging.getLogger("bertforge")

MASKING = ("static", "dynamic")
DEFAULT_SHARD_SIZE = 65536
DEFAULT_BUFFER_DOCUMENTS = 1000
DEFAULT_BUFFER_TOKENS = 4_000_000
_STALE = re.compile(r"^(shard-\d+|\.tmp-w\d+-\d+)\.[a-z_]+\.npy(\.part)?$")


def _worker_seeds(seed: int, worker: int) -> tuple[random.Random, np.random.Generator]:
    structure = np.random.SeedSequence([seed, worker, 0]).generate_state(2, dtype=np.uint64)
    structure_rng = random.Random(int(structure[0]) << 64 | int(structure[1]))
    mask_rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, worker, 1])))
    return structure_rng, mask_rng


def _assign_files(files: Sequence[str], workers: int) -> list[list[str]]:
    """Largest file first onto the least-loaded worker; each worker keeps the input order."""
    sizes = [os.path.getsize(f) for f in files]
    loads = [0] * workers
    owner = [0] * len(files)
    for index in sorted(range(len(files)), key=lambda i: (-sizes[i], i)):
        w = min(range(workers), key=lambda k: (loads[k], k))
        owner[index] = w
        loads[w] += sizes[index]
    return [[f for f, o in zip(files, owner) if o == w] for w in range(workers)]


def _run_worker(job: dict, report: Callable[[int], None]) -> dict:
    """Make and write one worker's instances; returns its shards and statistics."""
    tokenizer = BertTokenizer(job["vocab_file"], do_lower_case=job["do_lower_case"])
    vocab = tokenizer.vocab
    cls_id, sep_id, mask_id, pad_id, unk_id = (vocab[CLS], vocab[SEP], vocab[MASK], vocab[PAD],
                                               tokenizer.unk_token_id)
    vocab_size = max(vocab.values()) + 1
    static = job["masking"] == "static"
    continuation = None
    if job["whole_word_mask"]:
        continuation = np.zeros(max(vocab.values()) + 1, dtype=bool)
        for token, index in vocab.items():
            continuation[index] = token.startswith("##")
    structure_rng, mask_rng = _worker_seeds(job["seed"], job["worker"])
    writer = ShardWriter(job["output_dir"], f".tmp-w{job['worker']:03d}", shard_size=job["shard_size"],
                         max_seq_length=job["max_seq_length"], max_predictions_per_seq=job["max_predictions_per_seq"],
                         vocab_size=vocab_size, pad_id=pad_id, static=static)
    stats = Counter()
    formats = Counter()
    replaced_by_file: dict[str, int] = {}  # file -> bytes that were not UTF-8 (read as U+FFFD)

    def documents():
        for path in job["files"]:
            fmt = job["input_format"] if job["input_format"] != "auto" else detect_format(path)
            formats[fmt] += 1
            seen = 0

            def progress(n: int) -> None:
                nonlocal seen
                seen += n
                report(n)

            before = replaced_bytes()
            for sentences in read_documents(path, fmt, progress):
                document = tokenize_document(sentences, tokenizer, unk_id, (pad_id, cls_id, sep_id, mask_id))
                if document is not None:
                    yield document
            if replaced_bytes() > before:
                replaced_by_file[path] = replaced_bytes() - before
                stats["replaced_bytes"] += replaced_by_file[path]
            size = os.path.getsize(path)
            if size != seen:
                report(size - seen)  # characters were counted; settle to the file's bytes
            stats["input_bytes"] += size

    def on_document(document) -> None:
        stats["documents"] += 1
        stats["sentences"] += document.num_sentences
        stats["document_tokens"] += document.num_tokens

    P = job["max_predictions_per_seq"]
    for inst in windowed_instances(documents(), structure_rng, max_seq_length=job["max_seq_length"],
                                   short_seq_prob=job["short_seq_prob"], dupe_factor=job["dupe_factor"],
                                   buffer_documents=job["buffer_documents"], buffer_tokens=job["buffer_tokens"],
                                   on_document=on_document):
        r = writer.next_row()
        arrays = writer.arrays
        row = arrays["input_ids"][r]
        la = inst.a[1] - inst.a[0]
        lb = inst.b[1] - inst.b[0]
        row[0] = cls_id
        row[1:1 + la] = inst.document.tokens[inst.a[0]:inst.a[1]]
        row[1 + la] = sep_id
        b_start = 2 + la
        row[b_start:b_start + lb] = inst.other.tokens[inst.b[0]:inst.b[1]]
        length = b_start + lb + 1
        row[length - 1] = sep_id
        arrays["lengths"][r] = length
        arrays["segment_b_start"][r] = b_start
        arrays["next_sentence_labels"][r] = 1 if inst.is_random_next else 0
        if static:
            positions, labels = mask_instance(
                row, length, b_start, mask_rng, vocab_size=vocab_size, mask_id=mask_id,
                masked_lm_prob=job["masked_lm_prob"], max_predictions_per_seq=P, continuation=continuation)
            k = len(positions)
            arrays["masked_lm_positions"][r, :k] = positions
            arrays["masked_lm_ids"][r, :k] = labels
            stats["masked"] += k
            replaced = row[positions]
            as_mask = int(np.count_nonzero(replaced == mask_id))
            as_kept = int(np.count_nonzero((replaced == labels) & (replaced != mask_id)))
            stats["masked_as_mask"] += as_mask
            stats["masked_as_kept"] += as_kept
            stats["masked_as_random"] += k - as_mask - as_kept
        writer.commit()
        stats["instances"] += 1
        stats["tokens"] += length
        stats["maskable_tokens"] += length - 3
        stats["is_next"] += 0 if inst.is_random_next else 1
        stats["not_next"] += 1 if inst.is_random_next else 0
        stats["short_target"] += inst.short_target
        stats["truncated"] += inst.truncated
        stats["not_next_same_document"] += inst.same_document_fallback
    writer.flush()
    return {"worker": job["worker"], "shards": writer.shards, "stats": dict(stats), "formats": dict(formats),
            "replaced": replaced_by_file}


def _worker_main(job: dict, messages) -> None:
    """Entry point of a worker process: progress and the result (or the error) go to `messages`."""
    # The tokenizer's batch encoding runs on a Rust thread pool as wide as the machine: give each
    # worker its share of the cores instead (read when the pool starts, i.e. before first use).
    os.environ.setdefault("RAYON_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // job["num_workers"])))
    pending = 0
    last = time.monotonic()

    def report(n: int) -> None:
        nonlocal pending, last
        pending += n
        now = time.monotonic()
        if now - last > 0.2:
            messages.put(("progress", job["worker"], pending))
            pending, last = 0, now

    try:
        result = _run_worker(job, report)
        if pending:
            messages.put(("progress", job["worker"], pending))
        messages.put(("done", job["worker"], result))
    except BaseException as error:  # noqa: BLE001 - everything goes back to the parent
        messages.put(("error", job["worker"], (type(error).__name__, str(error), traceback.format_exc())))


def _run_parallel(jobs: list[dict], bar) -> list[dict]:
    context = multiprocessing.get_context("spawn")
    messages = context.Queue()
    processes = [context.Process(target=_worker_main, args=(job, messages), daemon=True) for job in jobs]
    for process in processes:
        process.start()
    results: dict[int, dict] = {}
    try:
        while len(results) < len(jobs):
            try:
                kind, worker, payload = messages.get(timeout=1.0)
            except queue.Empty:
                dead = [p for i, p in enumerate(processes) if i not in results and p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a prepare-pretraining worker died (exit code {dead[0].exitcode})")
                continue
            if kind == "progress":
                bar.update(payload)
            elif kind == "done":
                results[worker] = payload
            else:
                name, message, trace = payload
                logger.debug("worker %d failed:\n%s", worker, trace)
                error_type = {"FileNotFoundError": FileNotFoundError, "ValueError": ValueError}.get(name)
                if error_type is not None:
                    raise error_type(message)
                raise RuntimeError(f"prepare-pretraining worker {worker} failed: {name}: {message}\n{trace}")
    finally:
        for process in processes:
            if process.is_alive() and len(results) < len(jobs):
                process.terminate()
        for process in processes:
            process.join()
    return [results[w] for w in range(len(jobs))]


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
    the first such byte (file, line, offset) before any work starts.
    """
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
    for result in results:
        stats.update(result["stats"])
        formats.update(result["formats"])
        replaced.update(result["replaced"])
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
    continuation = np.zeros(vocab_size, dtype=bool)
    for token, index in vocab.items():
        continuation[index] = token.startswith("##")
    save_atomic(directory / CONTINUATION_NAME, continuation)
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
        "workers": workers,
        "buffer_documents": buffer_documents,
        "buffer_tokens": buffer_tokens,
        "shard_size": shard_size,
        "continuation_file": CONTINUATION_NAME,
        "inputs": files,
    }
    write_text_atomic(directory / INDEX_NAME, json.dumps(index, indent=2) + "\n")
    return index
