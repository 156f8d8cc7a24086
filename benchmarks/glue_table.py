"""RESULTS.md rows for a GLUE task from the two sides' outputs: bertforge's `OUT/summary.json`
(`bertforge finetune glue --seeds N`) and the peer's JSON line (`benchmarks/glue_peer.py`).

    python benchmarks/glue_table.py runs/ours-rte/summary.json runs/peer-rte.json

Prints two markdown tables: mean ± std per metric with the goal (bertforge's mean ≥ the peer's mean
− ½ the peer's std), then each seed's scores. Values in points (×100).
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
    parser.add_argument("peer", type=Path, help="glue_peer.py's JSON output")
    args = parser.parse_args()
    ours = json.loads(args.ours.read_text())
    peer = json.loads(args.peer.read_text().strip().splitlines()[-1])
    task = ours["task"].upper()

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
    for run in ours["runs"]:
        other = peer_runs.get(run["seed"], {})
        mine = " / ".join(points(run["metrics"][n]) for n in names)
        theirs = " / ".join(points(other["metrics"][n]) for n in names) if other else "–"
        their_epoch = f"{other['epoch']:g}" if other.get("epoch") is not None else "–"
        print(f"| {run['seed']} | {mine} ({run['epoch']:g}) | {theirs} ({their_epoch}) |")


if __name__ == "__main__":
    main()
