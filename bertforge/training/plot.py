"""Curves of a training run from its `log.jsonl`: losses, accuracies, learning rate, throughput (PNG).

Training records (`step`, `loss`, `*_loss`, `*_accuracy`, `lr`, `tokens_per_second`, ...) and
evaluation records (`eval_*`) may share the file; each curve is drawn against the step.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

PLOTS_DIR = "plots"


def read_log(path: str | os.PathLike) -> list[dict]:
    """The records of a log.jsonl (or of DIR/log.jsonl); a line cut short by a crash is skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / "log.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"training log not found: {path}")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "step" in record:
            records.append(record)
    if not records:
        raise ValueError(f"{path}: no log records (lines with a 'step')")
    return records


def _series(records: list[dict], name: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[name]) for r in records
              if isinstance(r.get(name), (int, float)) and math.isfinite(r[name])]
    return [s for s, _ in points], [v for _, v in points]


def plot_log(log: str | os.PathLike, output_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write loss.png, accuracy.png, lr.png, throughput.png (and perplexity.png with eval data); returns them."""
    try:
        import matplotlib  # optional extra
    except ImportError:
        raise ModuleNotFoundError("plotting needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt  # optional extra

    records = read_log(log)
    run = Path(log) if Path(log).is_dir() else Path(log).parent
    output_dir = Path(output_dir) if output_dir is not None else run / PLOTS_DIR
    output_dir.mkdir(parents=True, exist_ok=True)
    names = sorted({k for r in records for k in r})
    train = [r for r in records if not any(k.startswith("eval_") for k in r)]
    evaluation = [r for r in records if any(k.startswith("eval_") for k in r)]

    def is_loss(name: str) -> bool:
        return name == "loss" or name.endswith("_loss")

    figures = {
        "loss": ("loss", [n for n in names if is_loss(n) and not n.startswith("eval_")],
                 [n for n in names if n.startswith("eval_") and is_loss(n[5:])], False),
        "accuracy": ("accuracy", [n for n in names if n.endswith("_accuracy") and not n.startswith("eval_")],
                     [n for n in names if n.startswith("eval_") and n.endswith("_accuracy")], False),
        "lr": ("learning rate", ["lr"], [], False),
        "throughput": ("tokens / second", ["tokens_per_second"], [], False),
        "perplexity": ("perplexity", [], ["eval_perplexity"], True),
    }
    written = []
    for filename, (ylabel, train_names, eval_names, log_scale) in figures.items():
        curves = [(n, *_series(train, n), "-") for n in train_names] + \
                 [(n, *_series(evaluation, n), "o--") for n in eval_names]
        curves = [c for c in curves if c[1]]
        if not curves:
            continue
        figure, axes = plt.subplots(figsize=(7, 4.2))
        colors: dict[str, str] = {}  # a metric and its eval_ twin share a colour
        for name, steps, values, style in curves:
            base = name.removeprefix("eval_")
            colors.setdefault(base, f"C{len(colors)}")
            axes.plot(steps, values, style, label=name, markersize=4, color=colors[base])
        axes.set_xlabel("step")
        axes.set_ylabel(ylabel)
        if log_scale:
            axes.set_yscale("log")
        axes.grid(alpha=0.3)
        axes.legend()
        axes.set_title(f"{run.name}: {ylabel}")
        figure.tight_layout()
        path = output_dir / f"{filename}.png"
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    return written
