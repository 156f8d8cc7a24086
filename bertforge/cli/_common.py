"""What several commands share: input globs, a model directory's config.json and the task it was
fine-tuned for, and the fine-tuning report."""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path


def expand(patterns: list[str]) -> list[str]:
    """The files the globs name (sorted per pattern); FileNotFoundError for a pattern that matches none."""
    files: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True))
        if not matches:
            raise FileNotFoundError(f"no file matches {pattern}")
        files.extend(m for m in matches if Path(m).is_file())
    return files


def model_config(model_dir: str) -> dict:
    """A model directory's config.json ({} when absent or unreadable)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


# The task families `predict` dispatches on, by every name that means them (the rest is classification:
# classify or a GLUE task). Replaced by the task registry's resolver where it exists.
_FAMILY_NAMES = {
    "answer": ("answer", "squad", "squad_v2", "question-answering", "qa"),
    "tag": ("tag", "ner", "token-classification", "tagging"),
    "multiple-choice": ("multiple-choice", "multiple_choice", "choice", "swag"),
}


def task_family(task: str | None, model_dir: str) -> str | None:
    """The family of the task a command works with: `--task` (a name or an alias) when given, else the
    task the model was fine-tuned for (`finetuning_task` in its config.json); "classify" for any other
    name, None when neither says.

    The command line's one place that maps a task name or a checkpoint to its task family.
    """
    task = task or model_config(model_dir).get("finetuning_task")
    if task is None:
        return None
    return next((family for family, names in _FAMILY_NAMES.items() if task in names), "classify")


def report_finetune(results: dict, output_dir: str) -> None:
    """One line on a finished fine-tuning run (or the summary of a learning-rate/seed grid)."""
    if "runs" in results:  # a grid or several seeds
        main = results["main_metric"]
        stats = results["metrics"][main]
        print(f"{results['task']}: best lr {results['best_lr']:g}; {main} over {stats['n']} seed(s): "
              f"mean {stats['mean']:.4f} ± {stats['std']:.4f} (min {stats['min']:.4f}, max {stats['max']:.4f}); "
              f"{output_dir}/summary.json, best model in {output_dir}")
    else:
        metrics = ", ".join(f"{k} {v:.4f}" for k, v in results["metrics"].items())
        print(f"{results['task']}: best at epoch {results['epoch']:g} (step {results['step']}): {metrics}; "
              f"model and eval_results.json in {output_dir}")


def ner_summary(metrics: dict) -> str:
    """Entity F1, precision and recall, and F1 per entity type, on one line."""
    types = sorted(k[3:] for k in metrics if k.startswith("f1_"))
    per_type = ", ".join(f"{t} {metrics['f1_' + t]:.4f}" for t in types)
    return (f"entity F1 {metrics['f1']:.4f} (precision {metrics['precision']:.4f}, recall {metrics['recall']:.4f}); "
            f"per type F1: {per_type}")


# The SquadSettings fields that `finetune squad` and `predict` take as flags of the same names.
SQUAD_FLAGS = ("max_seq_length", "doc_stride", "max_query_length", "n_best_size", "max_answer_length",
               "null_score_diff_threshold")


def squad_flags(args: argparse.Namespace) -> dict:
    """The SquadSettings fields given on the command line."""
    return {name: getattr(args, name) for name in SQUAD_FLAGS if getattr(args, name, None) is not None}
