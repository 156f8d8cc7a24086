"""RESULTS.md rows for a GLUE task from the two sides' outputs: bertforge's `OUT/summary.json`
(`bertforge finetune glue --seeds N [--lr-grid ...]`) and the peer's JSON lines
(`benchmarks/glue_peer.py`, one per learning rate).

    python benchmarks/glue_table.py runs/ours-rte/summary.json runs/peer-rte.json
    python benchmarks/glue_table.py runs/ours-stsb-grid/summary.json runs/peer-stsb-lr*.json   # a grid

Prints markdown tables: with a grid, the main metric's mean ± std per learning rate on each side;
then, at each side's best learning rate (by mean main dev metric, as `--lr-grid` picks it), mean ±
std per metric with the goal (bertforge's mean ≥ the peer's mean − ½ the peer's std), then each
seed's scores. Values in points (×100).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def points(value: float) -> str:
    return f"{100 * value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ours", type=Path, help="bertforge's summary.json")
    parser.add_argument("peer", type=Path, nargs="+", help="glue_peer.py's JSON output, one per learning rate")
    args = parser.parse_args()
    ours = json.loads(args.ours.read_text())
    peers = [json.loads(path.read_text().strip().splitlines()[-1]) for path in args.peer]
    task = ours["task"].upper()
    main_metric = ours.get("main_metric") or next(iter(ours["metrics"]))
    peer = max(peers, key=lambda p: p["summary"][main_metric]["mean"])
    if len(peers) > 1 or len(ours.get("by_lr", {})) > 1:
        grid = sorted({float(lr) for lr in ours.get("by_lr", {})} | {p["lr"] for p in peers}, reverse=True)
        peer_by_lr = {p["lr"]: p["summary"][main_metric] for p in peers}
        print(f"| lr | bertforge {main_metric} | transformers {main_metric} |")
        print("|---|---|---|")
        for lr in grid:
            mine = ours.get("by_lr", {}).get(f"{lr:g}", {}).get(main_metric)
            theirs = peer_by_lr.get(lr)
            cells = [f"{points(m['mean'])} ± {points(m['std'])} (n={m['n']})" if m else "–" for m in (mine, theirs)]
            print(f"| {lr:g} | {cells[0]} | {cells[1]} |")
        print(f"\nbest lr: bertforge {ours.get('best_lr', '–')}, transformers {peer['lr']:g}\n")

    print("| task | metric | bertforge (mean ± std) | transformers | peer mean − ½ std | goal met |")
    print("|---|---|---|---|---|---|")
    for name, mine in ours["metrics"].items():
        theirs = peer["summary"].get(name)
        if theirs is None:
            continue
        bar = theirs["mean"] - theirs["std"] / 2
        print(f"| {task} | {name} | **{points(mine['mean'])} ± {points(mine['std'])}** | "
              f"{points(theirs['mean'])} ± {points(theirs['std'])} | {points(bar)} | "
              f"{'yes' if mine['mean'] >= bar else 'no'} |")
    print()
    names = list(ours["metrics"])
    print(f"| seed | bertforge {' / '.join(names)} (epoch) | transformers {' / '.join(names)} (epoch) |")
    print("|---|---|---|")
    peer_runs = {run["seed"]: run for run in peer["runs"]}
    best_runs = [run for run in ours["runs"] if "best_lr" not in ours or run.get("lr") == ours["best_lr"]]
    for run in best_runs:
        other = peer_runs.get(run["seed"], {})
        mine = " / ".join(points(run["metrics"][n]) for n in names)
        theirs = " / ".join(points(other["metrics"][n]) for n in names) if other else "–"
        their_epoch = f"{other['epoch']:g}" if other.get("epoch") is not None else "–"
        print(f"| {run['seed']} | {mine} ({run['epoch']:g}) | {theirs} ({their_epoch}) |")


if __name__ == "__main__":
    main()
