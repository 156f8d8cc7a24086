"""RESULTS.md rows for a GLUE task from the two sides' outputs: bertforge's `OUT/summary.json`
(`bertforge finetune glue --seeds N [--lr-grid ...]`) and the peer's JSON lines
(`benchmarks/glue_peer.py`, one per learning rate).

    python benchmarks/glue_table.py runs/ours-rte/summary.json runs/peer-rte.json
    python benchmarks/glue_table.py runs/ours-stsb-grid/summary.json runs/peer-stsb-lr*.json   # a grid

    python benchmarks/glue_table.py runs/ours/summary.json --also-ours runs/ours-more-seeds/summary.json \
        runs/peer-lr4e-5.json runs/peer-lr4e-5-more-seeds.json                                  # pooled seeds

    python benchmarks/glue_table.py runs/ours-sst2/summary.json \
        --also-ours-run 2e-5 42 docs/results/glue_sst2/bertforge_lr2e-5_seed42.json ...    # a kept run's file

    python benchmarks/glue_table.py --quick     # MRPC's rows from the checked-in files (the test)

`--quick` renders MRPC's tables from the files kept in docs/results/glue_mrpc/, as that folder's README
does (a grid, three bertforge summaries pooled, the peer's files by learning rate).

Prints markdown tables: with a grid, the main metric's mean ± std per learning rate on each side;
then, at each side's best learning rate (by mean main dev metric, as `--lr-grid` picks it), mean ±
std per metric with the goal (bertforge's mean ≥ the peer's mean − ½ the peer's std), then each
seed's scores. Values in points (×100).

Seeds run at different times pool: `--also-ours` adds the runs of more bertforge summaries,
`--also-ours-run LR SEED FILE` one run's own `eval_results.json` (as kept in docs/results/ after its
run directory is gone), and peer files with the same learning rate are merged; a (learning rate,
seed) given twice keeps the later file's run. Statistics are then recomputed over the pooled runs
(bertforge's `describe`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MRPC = REPO / "docs" / "results" / "glue_mrpc"

from bertforge.training.finetune import describe  # the statistics `--seeds` writes to summary.json


def summarize(runs: list[dict]) -> dict:
    names = sorted(set.intersection(*(set(run["metrics"]) for run in runs)))
    return {name: describe([run["metrics"][name] for run in runs]) for name in names}


def pool_ours(summaries: list[dict]) -> dict:
    """One bertforge summary from several: runs keyed by (lr, seed), statistics per lr recomputed."""
    if len(summaries) == 1:
        return summaries[0]
    first = summaries[0]
    runs = {}
    for summary in summaries:
        for run in summary["runs"]:
            runs[(float(run["lr"]), run["seed"])] = run
    main_metric = first["main_metric"]
    by_lr = {f"{lr:g}": summarize([r for (l, _), r in sorted(runs.items()) if l == lr])
             for lr in sorted({lr for lr, _ in runs}, reverse=True)}
    best = max(by_lr, key=lambda lr: by_lr[lr][main_metric]["mean"])
    return {**first, "by_lr": by_lr, "best_lr": float(best), "metrics": by_lr[best],
            "runs": [run for _, run in sorted(runs.items())]}


def kept_run(lr: str, seed: str, path: str) -> dict:
    """A one-run bertforge summary from the run's own eval_results.json, for `pool_ours`."""
    try:
        run = {"lr": float(lr), "seed": int(seed), "dir": path}
    except ValueError:
        raise SystemExit(f"--also-ours-run {lr} {seed} {path}: LR must be a number and SEED an integer") from None
    results = json.loads(Path(path).read_text())
    return {"task": results["task"], "runs": [{**run, **results}]}


def pool_peers(peers: list[dict]) -> list[dict]:
    """One peer result per learning rate, runs keyed by seed, statistics recomputed."""
    by_lr: dict[float, dict] = {}
    for peer in peers:
        pooled = by_lr.setdefault(peer["lr"], {**peer, "runs": []})
        seeds = {run["seed"] for run in peer["runs"]}
        pooled["runs"] = [run for run in pooled["runs"] if run["seed"] not in seeds] + peer["runs"]
    for pooled in by_lr.values():
        pooled["runs"].sort(key=lambda run: run["seed"])
        pooled["summary"] = summarize(pooled["runs"])
    return list(by_lr.values())


def points(value: float) -> str:
    return f"{100 * value:.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    quick = "--quick" in (sys.argv[1:] if argv is None else argv)  # then the files are the kept MRPC ones
    parser.add_argument("ours", type=Path, nargs="?" if quick else None, help="bertforge's summary.json")
    parser.add_argument("peer", type=Path, nargs="*" if quick else "+",
                        help="glue_peer.py's JSON output (one or more per learning rate)")
    parser.add_argument("--also-ours", type=Path, action="append", default=[], metavar="SUMMARY",
                        help="another bertforge summary.json whose runs pool with the first's (repeatable)")
    parser.add_argument("--also-ours-run", nargs=3, action="append", default=[],
                        metavar=("LR", "SEED", "EVAL_RESULTS"),
                        help="one bertforge run's eval_results.json, fine-tuned at LR with SEED (repeatable)")
    parser.add_argument("--quick", action="store_true",
                        help="MRPC's rows from docs/results/glue_mrpc/ (the files its README names)")
    args = parser.parse_args(argv)
    if args.quick:
        args.ours, args.peer = MRPC / "bertforge_lr_grid.json", sorted(MRPC.glob("transformers_lr*.json"))
        args.also_ours = [MRPC / "bertforge_lr2e-5.json", MRPC / "bertforge_lr_grid_seeds45-46.json"]
    summaries = [json.loads(path.read_text()) for path in [args.ours, *args.also_ours]]
    ours = pool_ours(summaries + [kept_run(*run) for run in args.also_ours_run])
    peers = pool_peers([json.loads(path.read_text().strip().splitlines()[-1]) for path in args.peer])
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
        cells = [f"{points(side['mean'])} ± {points(side['std'])}" for side in (mine, theirs)]
        higher = 0 if mine["mean"] >= theirs["mean"] else 1  # bold: the higher mean
        cells[higher] = f"**{cells[higher]}**"
        print(f"| {task} | {name} | {cells[0]} | {cells[1]} | {points(bar)} | "
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
