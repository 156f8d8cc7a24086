"""GLUE: the fine-tuning task of the nine GLUE tasks (`bertforge finetune glue`).

The data side (the layout, the readers of every task and split, the submission writer) is
`bertforge.tasks.glue_data`, below `bertforge.tasks.classify` which uses it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..metrics.glue import glue_metrics, main_metric
from ..training.finetune import FinetuneTask
from .classify import add_long_input_flags, classification_task, predict_file
from .glue_data import TaskSpec, get_task, glue_task_dir, read_glue_examples

__all__ = ["add_glue_flags", "glue_after", "glue_from_args", "glue_task"]


def glue_task(task: str | TaskSpec, data_dir: str | os.PathLike, model_dir: str | os.PathLike, *,
              max_seq_length: int = 128, eval_batch_size: int = 128, max_train_examples: int | None = None,
              long_input: str = "truncate", window_stride: int | None = None):
    """The `FinetuneTask` of a GLUE task: train.tsv to train, the dev file(s) to select on (MNLI: both).
    `long_input="windows"` windows inputs longer than `max_seq_length` (see `classification_task`)."""
    spec = task if isinstance(task, TaskSpec) else get_task(task)
    train = read_glue_examples(spec, data_dir, "train")[:max_train_examples]
    dev_sets = {split: read_glue_examples(spec, data_dir, split) for split in spec.dev_splits}

    def metrics_fn(split: str, predictions, labels) -> dict[str, float]:
        return glue_metrics(spec.split(split).metrics_task, predictions, labels)

    return classification_task(spec.name, model_dir, train, dev_sets, spec.label_list, metrics_fn=metrics_fn,
                                main_metric=main_metric(spec.name), max_seq_length=max_seq_length,
                                eval_batch_size=eval_batch_size, long_input=long_input, window_stride=window_stride)


def add_glue_flags(p: argparse.ArgumentParser) -> None:
    """`bertforge finetune glue`'s own flags: the task, the data, long inputs."""
    p.add_argument("--task", required=True, help="the task, a GLUE task: cola, sst2, mrpc, stsb, qqp, mnli, qnli, "
                   "rte or wnli (recorded as the model's finetuning_task)")
    p.add_argument("--data-dir", required=True, help="the GLUE root (holding MRPC/, ...) or the task's directory")
    p.add_argument("--max-train-examples", type=int, help="train on the first N examples only")
    p.add_argument("--no-test-predictions", action="store_true", help="skip the submission file for test.tsv")
    add_long_input_flags(p)


def glue_from_args(args: argparse.Namespace) -> FinetuneTask:
    """`glue_task` from `bertforge finetune glue`'s flags."""
    return glue_task(get_task(args.task), args.data_dir, args.model, max_seq_length=args.max_seq_length,
                     eval_batch_size=args.eval_batch_size, max_train_examples=args.max_train_examples,
                     long_input=args.long_input, window_stride=args.doc_stride)


def glue_after(args: argparse.Namespace) -> None:
    """The GLUE server's submission files for the task's test split(s), from the best model in OUT."""
    spec = get_task(args.task)
    for split in spec.test_splits:
        test = glue_task_dir(spec, args.data_dir) / spec.split(split).file
        if test.is_file() and not args.no_test_predictions:
            path = predict_file(args.output_dir, test, Path(args.output_dir) / spec.split(split).submission,
                                task=spec.name, max_seq_length=args.max_seq_length, long_input=args.long_input,
                                window_stride=args.doc_stride)
            print(f"test predictions: {path}")
