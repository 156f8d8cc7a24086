"""What several commands share: input globs, a model directory's config.json and the task it was
fine-tuned for, and the fine-tuning report."""

from __future__ import annotations

import argparse
import glob
from pathlib import Path

from ..tasks.registry import family_for_checkpoint, resolve
from ..tokenization._read import read_json_object


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
    try:  # (bounded: a config.json that is /dev/zero is refused, not read; loading the model says so)
        return read_json_object(Path(model_dir) / "config.json", "model config")
    except (OSError, ValueError):
        return {}


def task_family(task: str | None, model_dir: str) -> str | None:
    """The family of the task a command works with (the task registry's canonical name): `--task` (a
    name or an alias) when given, else the checkpoint's (`family_for_checkpoint`: its head, else the
    `finetuning_task` in its config.json); "classify" for a name the registry does not know (the
    classification reader reports it), None when neither says.
    """
    if task is None:
        family = family_for_checkpoint(model_dir, default=None)
        return None if family is None else family.name
    try:
        return resolve(task).name
    except ValueError:
        return "classify"


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
