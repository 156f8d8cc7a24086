"""SQuAD side by side: `bertforge finetune squad` and the peer (`squad_peer.py`) over several seeds.

Each (side, seed) is one process with the same data and hyperparameters, written to
OUT/{bertforge,peer}/seed{N}/ (bertforge's `eval_results.json` + `log.jsonl`, the peer's `summary.json`;
both sides' `predictions.json` and, for v2.0, `null_odds.json`). A run that finished (its `run.json`
beside it) is not run again, so the same command resumes. OUT/summary.json and the one JSON line on
stdout give, per side, each seed's best-epoch scores, its wall time at each epoch's end, its peak
resident memory, and the mean and standard deviation over seeds; `goal_met` is issue 28's test:
bertforge's mean F1 >= the peer's mean F1 - half the peer's standard deviation.

Scores are the official scripts' (bertforge.metrics.squad), both sides at the null-score threshold 0;
for v2.0 also HasAns/NoAns and `best_f1` / `best_f1_thresh` (evaluate-v2.0.py's best threshold from each
side's `null_odds.json`: what `bertforge finetune squad --tune-threshold` would choose).

`--jobs N` runs N processes at once (on a GPU that holds them all); wall times are then shared and mean
nothing beside each other: time with `--jobs 1` (the default).

    python scripts/squad_answerable.py --output runs/squad/dev-v1.1-answerable.json
    python benchmarks/squad_side_by_side.py --model MINILM --version 1.1 \
        --train-file ../shared/data/squad/v1.1/train-v1.1.first11.json \
        --dev-file runs/squad/dev-v1.1-answerable.json --seeds 1,2,3 --output-dir runs/squad/v1.1
    python benchmarks/squad_side_by_side.py --model MINILM --version 2.0 \
        --train-file ../shared/data/squad/v2.0/train-v2.0.first10.json \
        --dev-file ../shared/data/squad/v2.0/dev-v2.0.cs224n-half.json --seeds 1,2,3 --output-dir runs/squad/v2.0
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import cpu_model, log

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bertforge's metrics, also where it is not installed
SIDES = ("bertforge", "peer")
# Flags both sides take with the same meaning, passed through as given.
SHARED_FLAGS = ("lr", "epochs", "batch_size", "max_seq_length", "doc_stride", "n_best_size", "max_answer_length",
                "max_train_examples", "num_threads", "device")
SCORES = {"1.1": ("exact", "f1"),
          "2.0": ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_exact", "best_f1",
                  "best_f1_thresh")}


def command(side: str, seed: int, out: Path, args: argparse.Namespace) -> list[str]:
    """The command line of one run."""
    flags = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in SHARED_FLAGS
             if getattr(args, name) is not None]
    common = ["--model", args.model, "--version", args.version, "--train-file", args.train_file,
              "--dev-file", args.dev_file, "--output-dir", str(out), "--seed", str(seed), *flags]
    if side == "bertforge":
        return [sys.executable, "-m", "bertforge", "finetune", "squad", *common,
                f"--max-query-length={args.max_query_length}", "--no-progress", *shlex.split(args.bertforge_flags)]
    return [sys.executable, str(REPO / "benchmarks" / "squad_peer.py"), *common]


def read_run(side: str, out: Path, version: str, dataset: list[dict]) -> dict:
    """A finished run's best-epoch official scores (percent) on `dataset` (the dev file's `data`), and the
    time at each epoch's end (bertforge's: training only; the peer's: training and earlier evaluations)."""
    from bertforge.metrics.squad import evaluate_v1, evaluate_v2

    if side == "bertforge":
        official = json.loads((out / "squad_eval.json").read_text())
        epochs = [{"epoch": row["epoch"], "elapsed_seconds": round(row["elapsed"], 2)}
                  for row in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "eval_f1" in row]
    else:
        summary = json.loads((out / "summary.json").read_text())
        official = summary["official"]
        epochs = [{"epoch": row["epoch"], "elapsed_seconds": row["elapsed_seconds"]} for row in summary["epochs"]]
    # Re-scored here from the files, the same way for both sides.
    predictions = json.loads((out / "predictions.json").read_text())
    if version == "2.0":
        null_odds = json.loads((out / "null_odds.json").read_text())
        rescored = evaluate_v2(dataset, predictions, null_odds)
    else:  # evaluate-v1.1.py names it exact_match
        rescored = evaluate_v1(dataset, predictions)
        rescored["exact"] = rescored.pop("exact_match")
        official = {**official, "exact": official.get("exact", official.get("exact_match"))}
    for key in ("exact", "f1"):
        if abs(rescored[key] - official[key]) > 1e-9:
            raise SystemExit(f"{out}: {key} {official[key]} on record but {rescored[key]} from predictions.json")
    return {"scores": {k: rescored[k] for k in SCORES[version] if k in rescored}, "epochs": epochs}


def device_name(device: str | None) -> str:
    """What the runs ran on: the GPU's name, or the CPU's."""
    import torch

    if (device or "cuda").startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return cpu_model()


def portable(cmd: list[str]) -> list[str]:
    """A run's command as a user would type it: `python`, paths relative to the repository."""
    return ["python" if part == sys.executable else part.replace(f"{REPO}/", "") for part in cmd]


def run_all(args: argparse.Namespace, root: Path) -> dict[str, dict[int, dict]]:
    """Run every (side, seed) not finished yet, `args.jobs` at a time; returns their run.json records."""
    pending = []
    for seed in args.seeds:  # seed by seed, alternating sides: drift of the machine hits both alike
        for side in args.sides:
            out = root / side / f"seed{seed}"
            if not (out / "run.json").exists():
                pending.append((side, seed, out))
    running: dict[int, tuple] = {}
    dataset = json.loads(Path(args.dev_file).read_text(encoding="utf-8"))["data"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "TOKENIZERS_PARALLELISM": "false"}
    while pending or running:
        while pending and len(running) < args.jobs:
            side, seed, out = pending.pop(0)
            out.mkdir(parents=True, exist_ok=True)
            cmd = command(side, seed, out, args)
            logfile = open(out.parent / f"seed{seed}.log", "w")
            log(f"start {side} seed {seed}: {' '.join(cmd)}")
            proc = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, env=env, cwd=REPO)
            running[proc.pid] = (side, seed, out, cmd, time.perf_counter(), logfile)
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        side, seed, out, cmd, started, logfile = running.pop(pid)
        logfile.close()
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            log(f"{side} seed {seed} failed (exit {code}): see {out.parent / f'seed{seed}.log'}")
            continue
        record = {"side": side, "seed": seed, "command": portable(cmd), "device": device_name(args.device),
                  "jobs": args.jobs, "wall_seconds": round(time.perf_counter() - started, 1),
                  "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), **read_run(side, out, args.version, dataset)}
        (out / "run.json").write_text(json.dumps(record, indent=2) + "\n")
        log(f"done {side} seed {seed}: " + ", ".join(f"{k} {v:.2f}" for k, v in record["scores"].items()))
    records: dict[str, dict[int, dict]] = {side: {} for side in args.sides}
    for side in args.sides:
        for seed in args.seeds:
            path = root / side / f"seed{seed}" / "run.json"
            if path.exists():
                records[side][seed] = json.loads(path.read_text())
    return records


def mean_std(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "n": len(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint directory both sides start from")
    parser.add_argument("--version", choices=("1.1", "2.0"), required=True)
    parser.add_argument("--train-file", required=True)
    parser.add_argument("--dev-file", required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated")
    parser.add_argument("--sides", default=",".join(SIDES), help="bertforge, peer or both")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (1 for wall times that mean something)")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--epochs", type=float, help="default 3 (v1.1) or 2 (v2.0), as the paper")
    parser.add_argument("--batch-size", type=int, help="default 32 (v1.1) or 48 (v2.0), as the paper")
    parser.add_argument("--max-seq-length", type=int, default=384)
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--max-query-length", type=int, default=64, help="bertforge only (run_qa has none)")
    parser.add_argument("--n-best-size", type=int, default=20)
    parser.add_argument("--max-answer-length", type=int, default=30)
    parser.add_argument("--max-train-examples", type=int, help="first N training questions (smoke runs)")
    parser.add_argument("--num-threads", type=int, help="torch threads per run")
    parser.add_argument("--device", help="cpu, cuda (default: each side's own: the GPU if there is one)")
    parser.add_argument("--bertforge-flags", default="", help="more flags for bertforge's side, e.g. '--no-unpad'")
    args = parser.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.sides = [s for s in args.sides.split(",") if s]
    if unknown := set(args.sides) - set(SIDES):
        parser.error(f"--sides: unknown {sorted(unknown)}; choose from {', '.join(SIDES)}")
    args.epochs = args.epochs if args.epochs is not None else (2.0 if args.version == "2.0" else 3.0)
    args.batch_size = args.batch_size if args.batch_size is not None else (48 if args.version == "2.0" else 32)
    for flag in ("model", "train_file", "dev_file"):
        if not Path(getattr(args, flag)).exists():
            parser.error(f"--{flag.replace('_', '-')}: {getattr(args, flag)} does not exist")
    root = Path(args.output_dir)
    records = run_all(args, root)

    sides = {}
    for side, runs in records.items():
        if not runs:
            continue
        scores = {k: mean_std([r["scores"][k] for r in runs.values()]) for k in SCORES[args.version]
                  if all(k in r["scores"] for r in runs.values())}
        epoch_seconds = [[e["elapsed_seconds"] for e in r["epochs"]] for r in runs.values()]
        sides[side] = {"seeds": sorted(runs), "scores": scores,
                       "runs": {seed: {k: r.get(k) for k in ("scores", "epochs", "wall_seconds", "peak_rss_mib", "device",
                                                             "jobs")}
                                for seed, r in sorted(runs.items())},
                       "first_epoch_seconds": mean_std([e[0] for e in epoch_seconds if e])}
    goal = None
    if all(side in sides for side in SIDES):
        ours, peer = sides["bertforge"]["scores"]["f1"], sides["peer"]["scores"]["f1"]
        goal = ours["mean"] >= peer["mean"] - 0.5 * peer["std"]
    summary = {"benchmark": "squad_side_by_side", "version": args.version, "model": Path(args.model).name,
               "train_file": Path(args.train_file).name, "dev_file": Path(args.dev_file).name,
               "hyperparameters": {k: getattr(args, k) for k in (*SHARED_FLAGS, "max_query_length")
                                   if k not in ("device", "num_threads")},
               "bertforge_flags": args.bertforge_flags,
               "devices": sorted({r.get("device", "?") for runs in records.values() for r in runs.values()}),
               "jobs": sorted({r["jobs"] for runs in records.values() for r in runs.values()}), "num_threads": args.num_threads, "sides": sides, "goal_met": goal}
    (root / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))
    return 0 if all(len(records[s]) == len(args.seeds) for s in args.sides) else 1


if __name__ == "__main__":
    sys.exit(main())
