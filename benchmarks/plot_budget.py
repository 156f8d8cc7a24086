"""Held-out curves of two `pretrain_budget.py` runs, side by side, against training time.

    python benchmarks/plot_budget.py runs/ours runs/peer --output docs/results/pretrain_budget_mini.png

Reads each run's log.jsonl (the evaluation records: eval_mlm_loss, eval_mlm_accuracy,
eval_nsp_accuracy, with `elapsed` = training seconds, evaluation excluded) and draws the three
curves, one panel each. Prints ONE JSON line with each run's last evaluation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PANELS = [("eval_mlm_loss", "held-out masked-LM loss"), ("eval_mlm_accuracy", "held-out masked-LM accuracy"),
          ("eval_nsp_accuracy", "held-out next-sentence accuracy")]


def evaluations(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in records if "eval_mlm_loss" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="output directories of pretrain_budget.py")
    parser.add_argument("--labels", help="comma-separated, one per run (default: the directory names)")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = args.labels.split(",") if args.labels else [run.name for run in args.runs]
    figure, axes = plt.subplots(1, len(PANELS), figsize=(5 * len(PANELS), 4))
    last = {}
    for run, label in zip(args.runs, labels):
        records = evaluations(run)
        last[label] = records[-1]
        for axis, (key, title) in zip(axes, PANELS):
            axis.plot([r["elapsed"] / 60 for r in records], [r[key] for r in records], marker="o", label=label)
            axis.set_title(title)
            axis.set_xlabel("training minutes")
            axis.grid(alpha=0.3)
    axes[0].legend()
    figure.tight_layout()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.output, dpi=100)
    print(json.dumps({"plot": str(args.output), "last": last}))


if __name__ == "__main__":
    main()
