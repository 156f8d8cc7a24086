"""Memory and speed of pre-training on CPU, with and without the unpadded path's row buckets.

On CPU the matmuls of training run in oneDNN (fp32 and under bf16/fp16 autocast alike), which builds and
caches a kernel per matrix shape; the unpadded path packs a new number of real tokens nearly every step.
The Trainer therefore rounds the packed length up to a few sizes (`Packing`'s row_bucket) when it trains
on CPU. This script runs `bertforge pretrain` for `--steps` steps in a fresh process per arm, `--buckets on`
(the default behaviour) and `--buckets off` (the Trainer's bucketing replaced by a no-op), sampling the
process's resident memory every 2 s. One JSON line per arm goes to stdout. Environment variables pass to
the arms: ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 (no kernel cache) and BERTFORGE_KEEP_FREED_MEMORY=0 (glibc's
default malloc) separate the causes.

    python benchmarks/pretrain_memory.py --data runs/mini/train --vocab VOCAB --steps 200 --precision bf16
    python benchmarks/pretrain_memory.py --quick     # seconds: the test, backs no figure

`--quick`: both arms of the `tiny` preset for 3 steps (a log record every step) on instances that
`prepare_pretraining` makes from Shakespeare's speeches with MiniLM's vocabulary in a temporary directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import minilm_dir, quick_pretraining_data  # noqa: E402


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(args: argparse.Namespace) -> None:
    import bertforge.training.loop as loop
    import bertforge.training.memory as memory  # whether glibc keeps freed memory (BERTFORGE_KEEP_FREED_MEMORY)
    from bertforge.cli import main

    if args.buckets == "off":
        loop._bucket_packed_rows = lambda model: None
    samples: list[float] = []

    def sample() -> None:
        while True:
            samples.append(_rss_mb())
            time.sleep(2)

    threading.Thread(target=sample, daemon=True).start()
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(sys.stderr):  # stdout: the JSON line
        started = time.perf_counter()
        main(["pretrain", "--data", args.data, "--vocab", args.vocab, "--config", args.config, "--output-dir", out,
              "--batch-size", "32", "--lr", "5e-4", "--warmup-steps", "200", "--max-steps", str(args.steps),
              "--precision", args.precision, "--seed", "0", "--num-threads", str(args.threads), "--no-progress",
              "--log-every", "1" if args.quick else "10"])
        wall = time.perf_counter() - started
        log = [json.loads(line) for line in open(os.path.join(out, "log.jsonl"))]
    rates = [r["tokens_per_second"] for r in log if "tokens_per_second" in r]
    quarter = len(samples) // 4
    print(json.dumps({
        "benchmark": "pretrain_memory", **({"quick": True} if args.quick else {}),
        "config": args.config, "precision": args.precision, "buckets": args.buckets,
        "steps": args.steps, "threads": args.threads, "keep_freed_memory": memory._applied,
        "onednn_primitive_cache_capacity": os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "default"),
        "wall_seconds": round(wall, 1),
        "median_tokens_per_second": round(sorted(rates)[len(rates) // 2], 1),
        "rss_mb_after_first_quarter": round(samples[quarter]), "rss_mb_at_half": round(samples[len(samples) // 2]),
        "rss_mb_at_end": round(samples[-1]), "rss_mb_max": round(max(samples))}), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="prepare-pretraining output (required unless --quick)")
    parser.add_argument("--vocab", help="required unless --quick")
    parser.add_argument("--config", default="mini")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--buckets", choices=("on", "off", "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="the tiny preset, 3 steps, toy data (the test)")
    args = parser.parse_args(argv)
    argv = list(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="pretrain-memory-") as scratch:
        if args.quick and args.data is None:  # the arms get the toy data's --data and --vocab
            args.data = str(quick_pretraining_data(Path(scratch) / "data"))
            args.vocab = str(minilm_dir() / "vocab.txt")
            argv += ["--data", args.data, "--vocab", args.vocab, "--config", "tiny", "--steps", "3"]
            args.config, args.steps = "tiny", 3
        elif not (args.data and args.vocab):
            parser.error("--data and --vocab are required (or --quick)")
        if args.buckets != "both":
            return worker(args)
        for arm in ("on", "off"):  # a fresh process each, so that neither inherits the other's kernel cache
            command = [sys.executable, __file__, *argv, "--buckets", arm]
            subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
