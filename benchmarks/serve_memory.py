"""Memory of `bertforge serve` under randomised traffic: does its resident memory stop growing?

    python benchmarks/serve_memory.py --model runs/mrpc/final --minutes 10 --dtype fp32
    python benchmarks/serve_memory.py --model DIR --minutes 2 --warmup-minutes 1   # a short run

Starts the server as a child process (`python -m bertforge serve --task classify`, as
`serve_load.py` does) and sends it, from `--clients` concurrent keep-alive connections, requests of
a random number of texts (1 to `--max-texts`), each of a random number of words (1 to `--max-words`)
drawn from the SST-2 dev sentences, for `--minutes`: every request brings new lengths and batch
sizes, as real traffic does, so every forward pass can meet a shape it has not seen. The server's
resident memory is sampled every 5 s. Prints one JSON line: the peak RSS of the minute after the
warm-up (`--warmup-minutes`, the first minute by default) and of the last minute of the load (the
requests then in flight are answered afterwards, for at most `--drain-seconds`; a shorter window
where the load after the warm-up is under 2 minutes: half of it each), the growth between them in %, p50
and p99 latency, the count of 5xx answers (and of any other failure), and `ok`: growth <= `--max-growth`
% and no 5xx. Only loopback is used; every loop is bounded in time.

    python benchmarks/serve_memory.py --quick      # seconds: the test, backs no figure

`--quick`: a tiny random classifier (MiniLM's vocabulary) and words from a toy SST-2 dev file of Shakespeare's
speeches, both in a temporary directory; 6 s of load (1.5 s of warm-up) from 2 clients of requests of up to
4 texts of up to 32 words, RSS sampled every 0.5 s.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import DEFAULT_DATA, HOST, Server, post, read_sentences, rss_bytes  # noqa: E402

from _common import quick_checkpoint, quick_glue  # noqa: E402

RSS_EVERY_S = 5.0


def random_body(rng: random.Random, words: list[str], max_texts: int, max_words: int) -> bytes:
    texts = [" ".join(rng.choices(words, k=rng.randint(1, max_words))) for _ in range(rng.randint(1, max_texts))]
    return json.dumps({"texts": texts}).encode()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a sequence-classification checkpoint directory (required unless --quick)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="SST-2 dev.tsv (the words to draw from)")
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the load, warm-up included")
    parser.add_argument("--warmup-minutes", type=float, default=1.0, help="growth is measured after this")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--max-texts", type=int, default=64, help="texts per request: 1 to this")
    parser.add_argument("--max-words", type=int, default=300, help="words per text: 1 to this")
    parser.add_argument("--dtype", choices=("fp32", "bf16", "int8"), default="fp32")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--num-threads", type=int, help="torch threads in the server")
    parser.add_argument("--max-growth", type=float, default=10.0, help="%% of RSS growth after the warm-up that passes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drain-seconds", type=float, default=120.0,
                        help="how long the requests in flight at the end may take to be answered")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--quick", action="store_true", help="a tiny classifier, toy words, 6 s of load (the test)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="serve-memory-") as scratch:
        every = RSS_EVERY_S
        if args.quick:
            args.model = quick_checkpoint(Path(scratch) / "model", "BertForSequenceClassification", num_labels=2)
            args.data = quick_glue(Path(scratch) / "glue", "SST-2", rows=96) / "SST-2" / "dev.tsv"
            args.minutes, args.warmup_minutes, args.clients, args.max_texts, args.max_words = 0.1, 0.025, 2, 4, 32
            args.drain_seconds, every = 30.0, 0.5
        elif not args.model:
            parser.error("--model is required (or --quick)")
        run(parser, args, every)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, every: float) -> None:
    """The load, the samples and the JSON line (`every`: seconds between RSS samples)."""
    if not 0 < args.warmup_minutes < args.minutes:
        parser.error(f"--warmup-minutes must be above 0 and below --minutes ({args.minutes}), got {args.warmup_minutes}")

    words = sorted({word for sentence in read_sentences(args.data) for word in sentence.split()})
    server = Server(args, batching=True)
    duration = args.minutes * 60
    stop_at = time.monotonic() + duration
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    failures: list[str] = []
    samples: list[tuple[float, float]] = []  # (seconds since the load began, RSS MiB)
    lock = threading.Lock()
    started = time.monotonic()

    def client(index: int) -> None:
        rng = random.Random(args.seed * 1000 + index)
        connection = http.client.HTTPConnection(HOST, server.port, timeout=300)
        while time.monotonic() < stop_at:
            body = random_body(rng, words, args.max_texts, args.max_words)
            start = time.perf_counter()
            try:
                status, payload = post(connection, "/v1/classify", body)
            except (OSError, http.client.HTTPException) as error:
                status, payload = "connection_error", str(error).encode()
                connection.close()
                connection = http.client.HTTPConnection(HOST, server.port, timeout=300)
            elapsed = time.perf_counter() - start
            with lock:
                statuses[str(status)] = statuses.get(str(status), 0) + 1
                if status == 200:
                    latencies.append(elapsed)
                elif len(failures) < 3:
                    failures.append(f"{status}: {payload[:200].decode(errors='replace')}")
        connection.close()

    def sample() -> None:
        while time.monotonic() < stop_at:
            time.sleep(every)
            rss = rss_bytes(server.process.pid)
            if rss:
                samples.append((time.monotonic() - started, rss / 2**20))

    try:
        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
        for thread in [*threads, threading.Thread(target=sample, daemon=True)]:
            thread.start()
        time.sleep(max(0.0, stop_at - time.monotonic()))
        rss_end = rss_bytes(server.process.pid)  # at the end of the load, before the queue drains
        # The requests sent before the end are still answered (counted, latencies included), for
        # at most --drain-seconds; those still unanswered then are reported, not failed.
        drain_until = time.monotonic() + args.drain_seconds
        for thread in threads:
            thread.join(max(0.0, drain_until - time.monotonic()))
        with lock:
            unanswered = sum(thread.is_alive() for thread in threads)
            answered = dict(statuses)
            failures_done = list(failures)  # what came later is the server's shutdown, not the load
            latencies_done = sorted(latencies)
    finally:
        exit_code = server.stop()

    # A forward pass of 32 long texts holds a few hundred MB of activations while it runs, so one
    # sample says more about the batch in flight than about what the server keeps: compare the peaks
    # of windows instead (a leak raises the later peaks; the batches' own peaks are alike).
    warmup_s = args.warmup_minutes * 60
    window_s = min(60.0, (duration - warmup_s) / 2)  # two windows that do not overlap
    first = [rss for at, rss in samples if warmup_s <= at < warmup_s + window_s]
    last = [rss for at, rss in samples if at >= duration - window_s]
    rss_warm = max(first) if first else None
    rss_last = max(last) if last else None
    rss_end = rss_end / 2**20 if rss_end else None

    def percentile(q: float) -> float | None:
        done = latencies_done
        return round(done[min(len(done) - 1, int(q * len(done)))] * 1000, 1) if done else None

    errors_5xx = sum(count for status, count in answered.items() if status.isdigit() and int(status) >= 500)
    growth = round((rss_last - rss_warm) / rss_warm * 100, 1) if rss_warm and rss_last else None
    result = {
        "benchmark": "serve_memory", **({"quick": True} if args.quick else {}),
        "model": str(args.model), "dtype": args.dtype, "minutes": args.minutes,
        "warmup_minutes": args.warmup_minutes, "clients": args.clients, "max_texts": args.max_texts,
        "max_words": args.max_words, "max_batch_size": args.max_batch_size,
        "torch_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "requests_ok": len(latencies_done), "statuses": answered, "errors_5xx": errors_5xx,
        "unanswered_after_drain": unanswered,
        "failure_examples": failures_done, "p50_ms": percentile(0.50), "p99_ms": percentile(0.99),
        "rss_start_mb": round(samples[0][1], 1) if samples else None,
        "rss_peak_after_warmup_mb": round(rss_warm, 1) if rss_warm else None,
        "rss_peak_at_end_mb": round(rss_last, 1) if rss_last else None, "rss_growth_pct": growth,
        "rss_end_mb": round(rss_end, 1) if rss_end else None, "window_s": window_s,
        "rss_mb_every_30s": [round(rss, 1) for at, rss in samples[::max(1, int(30 / every))]],
        "exit_code_after_sigterm": exit_code,
    }
    result["ok"] = (growth is not None and growth <= args.max_growth and errors_5xx == 0
                    and answered.get("connection_error", 0) == 0)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
