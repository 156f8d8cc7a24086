"""What several commands share: input globs, a model directory's config.json and the task it was
fine-tuned for, and the fine-tuning report."""

from __future__ import annotations

import glob
from pathlib import Path

from ..tasks.registry import family_for_checkpoint, resolve


def expand(patterns: list[str]) -> list[str]:
    """The files the globs name (sorted per pattern); FileNotFoundError for a pattern that matches none."""
    files: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True))
        if not matches:
            raise FileNotFoundError(f"no file matches {pattern}")
        files.extend(m for m in matches if Path(m).is_file())
    return files


def task_family(task: str | None, model_dir: str) -> str | None:
    """The family of the task a command works with (the task registry's canonical name): `--task` (a
    name or an alias) when given, else the checkpoint's (`family_for_checkpoint`: the `finetuning_task`
    in its config.json, else its `problem_type`, else its head); "classify" for a name the registry does
    not know (the classification reader reports it), None when none says.
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
