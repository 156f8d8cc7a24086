"""GLUE: the fine-tuning task of the nine GLUE tasks (`bertforge finetune glue`).

The data side (the layout, the readers of every task and split, the submission writer) is
`bertforge.tasks.glue_data`, below `bertforge.tasks.classification` which uses it; its names stay
importable from here.
"""

from __future__ import annotations

import os

from ..metrics.glue import glue_metrics, main_metric
from .classification import classification_task
from .glue_data import (BINARY, ENTAILMENT, GLUE_TASKS, LAST, NLI, SplitSpec, TaskSpec, get_task, glue_task_dir,
                        read_glue_examples, read_glue_file, write_dev_predictions, write_predictions)

__all__ = ["BINARY", "ENTAILMENT", "GLUE_TASKS", "LAST", "NLI", "SplitSpec", "TaskSpec", "get_task", "glue_task",
           "glue_task_dir", "read_glue_examples", "read_glue_file", "write_dev_predictions", "write_predictions"]


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
