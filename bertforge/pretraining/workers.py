"""The worker processes of `prepare-pretraining`: each turns its share of the input files into instances
and writes its own shards.

Parallelism: `workers` processes (spawn start method, so safe everywhere) each take a fixed share
of the input files (largest first onto the least-loaded worker, by bytes) and write their own
shards with their own random streams derived from (seed, worker): one `random.Random` for the
instance structure, one numpy Generator for masking. Separate streams mean that static and dynamic
masking with the same seed produce the same unmasked instances in the same order. The output is
byte-identical for the same inputs, settings, seed and number of workers (but differs between
worker counts: the file split and the NotNext windows change).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import random
import time
import traceback
from collections import Counter
from typing import Callable, Sequence

import numpy as np

from ..tokenization import BertTokenizer
from ..tokenization.vocab import CLS, MASK, PAD, SEP, continuation_flags
from .instances import tokenize_document, windowed_instances
from .masking import mask_instance
from .shards import ShardWriter
from .text import detect_format, read_documents, replaced_bytes

logger = logging.getLogger("bertforge")


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
    continuation = continuation_flags(vocab) if job["whole_word_mask"] else None
    structure_rng, mask_rng = _worker_seeds(job["seed"], job["worker"])
    writer = ShardWriter(job["output_dir"], f".tmp-w{job['worker']:03d}", shard_size=job["shard_size"],
                         max_seq_length=job["max_seq_length"], max_predictions_per_seq=job["max_predictions_per_seq"],
                         vocab_size=vocab_size, pad_id=pad_id, static=static)
    stats = Counter()
    formats = Counter()
    replaced_by_file: dict[str, int] = {}  # file -> bytes that were not UTF-8 (read as U+FFFD)
    long_by_file: dict[str, dict] = {}  # file -> its sentences far over max_seq_length (`long_sentence_limit`)
    limit = long_sentence_limit(job["max_seq_length"])

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
                document = tokenize_document(sentences, tokenizer, unk_id, (pad_id, cls_id, sep_id, mask_id),
                                             long_sentence=limit)
                if document is not None:
                    for index, length in document.long_sentences:
                        _count_long_sentence(long_by_file, path, sentences[index], length, job["max_seq_length"])
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
            "replaced": replaced_by_file, "long_sentences": long_by_file}


def long_sentence_limit(max_seq_length: int) -> int:
    """Sentences of more tokens than this are reported (`prepare_pretraining` warns once per file): twice
    the instance length, where most of the sentence never reaches an instance (an instance keeps at most
    max_seq_length - 3 of its tokens, as Google's `truncate_seq_pair`, which cuts silently). Usually a file
    whose text is not split into sentences (a whole document on one line, no sentence punctuation)."""
    return 2 * max_seq_length


def _count_long_sentence(long_by_file: dict[str, dict], path: str, sentence: str, length: int,
                         max_seq_length: int) -> None:
    """Add one over-long sentence to its file's record: how many, the tokens beyond what an instance holds,
    and the longest one's length and opening words (to find its line for the warning)."""
    record = long_by_file.setdefault(path, {"sentences": 0, "tokens_dropped": 0, "longest": 0, "start": ""})
    record["sentences"] += 1
    record["tokens_dropped"] += length - (max_seq_length - 3)
    if length > record["longest"]:
        record["longest"], record["start"] = length, sentence.strip()[:40]


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
