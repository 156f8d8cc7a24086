"""Held-out curves of two `pretrain_budget.py` runs, side by side, against training time.

    python benchmarks/plot_budget.py runs/ours runs/peer --output docs/results/pretrain_budget_mini.png
    python benchmarks/plot_budget.py --quick --output /tmp/budget.png      # the checked-in logs (the test)

`--quick` draws the logs kept in docs/results/pretrain_budget_mini/ (bertforge's, and the peer's corrected
one) as that folder's README does; without `--output` the figure goes to a temporary directory, removed after.

Reads each run's log.jsonl (the evaluation records: eval_mlm_loss, eval_mlm_accuracy,
eval_nsp_accuracy, with `elapsed` = training seconds, evaluation excluded) and draws the three
curves, one panel each. Prints ONE JSON line with each run's last evaluation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
from pathlib import Path

KEPT = Path(__file__).resolve().parents[1] / "docs" / "results" / "pretrain_budget_mini"

PANELS = [("eval_mlm_loss", "held-out masked-LM loss"), ("eval_mlm_accuracy", "held-out masked-LM accuracy"),
          ("eval_nsp_accuracy", "held-out next-sentence accuracy")]


def evaluations(run: Path) -> list[dict]:
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in records if "eval_mlm_loss" in r]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", type=Path, help="output directories of pretrain_budget.py")
    parser.add_argument("--labels", help="comma-separated, one per run (default: the directory names)")
    parser.add_argument("--output", type=Path, help="the PNG to write (required unless --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="the logs kept in docs/results/pretrain_budget_mini/, bertforge against the peer")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.quick:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="plot-budget-")))
            args.runs, args.labels = [], "bertforge,transformers"
            for name, log in (("ours", "bertforge.log.jsonl"), ("peer_corrected", "transformers_corrected.log.jsonl")):
                (scratch / name).mkdir()
                shutil.copy(KEPT / log, scratch / name / "log.jsonl")
                args.runs.append(scratch / name)
            args.output = args.output or scratch / "pretrain_budget_mini.png"
        elif not args.runs or args.output is None:
            parser.error("runs and --output are required (or --quick)")
        plot(args)


def plot(args: argparse.Namespace) -> None:
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
