"""GLUE data: the layout and readers of the nine tasks, and the submission writer.

Files are in the layout the classic `download_glue_data.py` writes: `<data_dir>/<Task>/{train,
dev,test}.tsv` (MNLI: `train.tsv`, `dev_matched.tsv`, `dev_mismatched.tsv`, `test_matched.tsv`,
`test_mismatched.tsv`). Columns as google-research/bert's `run_classifier.py` and Hugging Face's
legacy `glue.py` processors read them:

    task   dir     header          text_a  text_b  label   id      fields (train / dev / test)
    cola   CoLA    test only       3       -       1       test 0  4 / 4 / 2 (test: index, sentence)
    sst2   SST-2   yes             0       -       1       test 0  2 / 2 / 2 (test: index, sentence)
    mrpc   MRPC    yes (UTF-8 BOM) 3       4       0       test 0  5 / 5 / 5
    stsb   STS-B   yes             7       8       9       0       10 / 10 / 9 (score, a float)
    qqp    QQP     yes             3       4       5       0       6 / 6 / 3 (test: id, q1, q2)
    mnli   MNLI    yes             8       9       last    0       12 / 16 / 10
    qnli   QNLI    yes             1       2       3       0       4 / 4 / 3
    rte    RTE     yes             1       2       3       0       4 / 4 / 3
    wnli   WNLI    yes             1       2       3       0       4 / 4 / 3

A test file has an id column (column 0, `index` or `id`), which a submission's `index` column
repeats; CoLA, SST-2 and MRPC train/dev have none, so their examples are numbered by data row
from 0. Every example's guid is `<split>-<id>` ("dev-17", "dev_matched-9815", "test-0") and
`example.id` gives the id back.

Files are read as Google's `_read_tsv`: the `csv` module, tab-delimited, `quoting=QUOTE_NONE` (MRPC
and MNLI text holds bare `"`), decoded as `utf-8-sig` (MRPC starts with a BOM). A row with the
wrong number of fields, an unknown label, a non-numeric STS-B score or an empty text is a
`ValueError` naming `file:line` and what was expected.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from .._files import read_text, write_text_atomic
from .classify_reader import InputExample

__all__ = ["GLUE_TASKS", "SplitSpec", "TaskSpec", "get_task", "glue_task_dir", "read_glue_examples",
           "read_glue_file", "write_dev_predictions", "write_predictions"]

LAST = -1  # the label is the last column (MNLI: train and dev have different numbers of columns)


@dataclass(frozen=True)
class SplitSpec:
    """Where things are in one file of a task."""

    file: str
    fields: int  # the exact number of tab-separated fields of every line (the header's too)
    text_a: int
    text_b: int | None = None
    label: int | None = None  # None: unlabelled (a test file); LAST: the last column
    id: int | None = 0  # the id column; None: number the data rows from 0
    header: bool = True
    metrics_task: str = ""  # the `glue_metrics` task to score this split with (dev splits)
    submission: str | None = None  # GLUE's name for this split's predictions (test splits)


@dataclass(frozen=True)
class TaskSpec:
    """One GLUE task: its directory, labels (None: regression), files and main metric."""

    name: str
    directory: str
    labels: tuple[str, ...] | None
    splits: dict[str, SplitSpec] = field(hash=False)
    metric: str = "accuracy"  # the main metric, `bertforge.metrics.main_metric(name)`
    dev_splits: tuple[str, ...] = ("dev",)
    test_splits: tuple[str, ...] = ("test",)

    @property
    def regression(self) -> bool:
        return self.labels is None

    @property
    def label_list(self) -> list[str] | None:
        return None if self.labels is None else list(self.labels)

    @property
    def num_labels(self) -> int:
        """The classifier's output size: 1 for regression (BertForSequenceClassification uses MSE)."""
        return 1 if self.labels is None else len(self.labels)

    def split_name(self, name: str) -> str:
        """The file's split name: "dev" and "test" also name MNLI's matched sets."""
        if name in self.splits:
            return name
        if name == "dev":
            return self.dev_splits[0]
        if name == "test":
            return self.test_splits[0]
        raise ValueError(f"{self.name} has no split {name!r}; it has {', '.join(self.splits)}")

    def split(self, name: str) -> SplitSpec:
        return self.splits[self.split_name(name)]


def _task(name: str, directory: str, labels, metric: str = "accuracy", *, a: int, b: int | None,
               label: int, fields: tuple[int, int, int], test_a: int, test_b: int | None,
               submission: str, id_column: int | None = 0, header: bool = True) -> TaskSpec:
    train_fields, dev_fields, test_fields = fields
    common = dict(text_a=a, text_b=b, label=label, id=id_column, header=header)
    return TaskSpec(name, directory, labels, {
        "train": SplitSpec("train.tsv", train_fields, **common),
        "dev": SplitSpec("dev.tsv", dev_fields, metrics_task=name, **common),
        # Every test file has a header and an id column (index, or QQP's id) first.
        "test": SplitSpec("test.tsv", test_fields, text_a=test_a, text_b=test_b, submission=submission),
    }, metric)


BINARY = ("0", "1")
ENTAILMENT = ("entailment", "not_entailment")
NLI = ("contradiction", "entailment", "neutral")  # Google's MnliProcessor order

_MNLI_TRAIN = dict(text_a=8, text_b=9, label=LAST)
GLUE_TASKS: dict[str, TaskSpec] = {
    "cola": _task("cola", "CoLA", BINARY, "mcc", a=3, b=None, label=1, fields=(4, 4, 2), test_a=1, test_b=None,
                       id_column=None, header=False, submission="CoLA.tsv"),
    "sst2": _task("sst2", "SST-2", BINARY, a=0, b=None, label=1, fields=(2, 2, 2), test_a=1, test_b=None,
                       id_column=None, submission="SST-2.tsv"),
    "mrpc": _task("mrpc", "MRPC", BINARY, "f1", a=3, b=4, label=0, fields=(5, 5, 5), test_a=3, test_b=4,
                       id_column=None, submission="MRPC.tsv"),
    "stsb": _task("stsb", "STS-B", None, "pearson", a=7, b=8, label=9, fields=(10, 10, 9), test_a=7, test_b=8,
                       submission="STS-B.tsv"),
    "qqp": _task("qqp", "QQP", BINARY, "f1", a=3, b=4, label=5, fields=(6, 6, 3), test_a=1, test_b=2,
                      submission="QQP.tsv"),
    "mnli": TaskSpec("mnli", "MNLI", NLI, {
        "train": SplitSpec("train.tsv", 12, **_MNLI_TRAIN),
        "dev_matched": SplitSpec("dev_matched.tsv", 16, metrics_task="mnli", **_MNLI_TRAIN),
        "dev_mismatched": SplitSpec("dev_mismatched.tsv", 16, metrics_task="mnli-mm", **_MNLI_TRAIN),
        "test_matched": SplitSpec("test_matched.tsv", 10, text_a=8, text_b=9, submission="MNLI-m.tsv"),
        "test_mismatched": SplitSpec("test_mismatched.tsv", 10, text_a=8, text_b=9, submission="MNLI-mm.tsv"),
    }, "accuracy", dev_splits=("dev_matched", "dev_mismatched"), test_splits=("test_matched", "test_mismatched")),
    "qnli": _task("qnli", "QNLI", ENTAILMENT, a=1, b=2, label=3, fields=(4, 4, 3), test_a=1, test_b=2,
                       submission="QNLI.tsv"),
    "rte": _task("rte", "RTE", ENTAILMENT, a=1, b=2, label=3, fields=(4, 4, 3), test_a=1, test_b=2,
                      submission="RTE.tsv"),
    "wnli": _task("wnli", "WNLI", BINARY, a=1, b=2, label=3, fields=(4, 4, 3), test_a=1, test_b=2,
                       submission="WNLI.tsv"),
}


def get_task(name: str) -> TaskSpec:
    """A task by name, in any of the spellings in use: "CoLA", "SST-2", "sst2", "STS-B", "MNLI"."""
    key = name.strip().lower().replace("-", "").replace("_", "")
    if key in ("mnlim", "mnlimm", "mnlimatched", "mnlimismatched"):
        key = "mnli"
    if key not in GLUE_TASKS:
        raise ValueError(f"unknown GLUE task {name!r}; known: {', '.join(GLUE_TASKS)}")
    return GLUE_TASKS[key]


def glue_task_dir(task: str | TaskSpec, data_dir: str | os.PathLike) -> Path:
    """`data_dir/<Task>` when `data_dir` is the GLUE root (holding CoLA/, MRPC/, ...), else `data_dir`."""
    spec = task if isinstance(task, TaskSpec) else get_task(task)
    data_dir = Path(data_dir)
    nested = data_dir / spec.directory
    return nested if nested.is_dir() else data_dir


def read_glue_examples(task: str | TaskSpec, data_dir: str | os.PathLike, split: str = "train", *,
                       skip_malformed: bool = False) -> list[InputExample]:
    """The examples of one split: "train", "dev", "test", or MNLI's "dev_matched", "dev_mismatched",
    "test_matched", "test_mismatched" ("dev"/"test" are the matched ones).

    `data_dir` is the GLUE root or the task's own directory. Test examples have `label=None`;
    STS-B labels are floats, the others label strings from `spec.labels`. A malformed row raises
    `ValueError` ("file:line: expected ..."); `skip_malformed=True` drops such rows instead (Hugging
    Face's legacy QQP reader skips rows short of columns) and reports nothing.
    """
    spec = task if isinstance(task, TaskSpec) else get_task(task)
    layout = spec.split(split)
    split_name = spec.split_name(split)
    path = glue_task_dir(spec, data_dir) / layout.file
    if not path.is_file():
        tried = [Path(data_dir) / spec.directory / layout.file, Path(data_dir) / layout.file]
        raise FileNotFoundError(f"{spec.directory} {split_name} file not found: looked for "
                                f"{' and '.join(str(t) for t in tried)}")
    examples = []
    with io.StringIO(read_text(path), newline="") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        blank_line = None
        row_number = 0  # data rows, from 0: the id of a file without an id column
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as error:
                raise ValueError(f"{path}:{reader.line_num}: {error}") from None
            line = reader.line_num
            if not row:
                blank_line = blank_line or line  # blank lines are fine only at the end of the file
                continue
            if blank_line is not None:
                raise ValueError(f"{path}:{blank_line}: empty line (expected {layout.fields} tab-separated fields)")
            if layout.header and line == 1:
                if len(row) != layout.fields:
                    raise ValueError(f"{path}:1: expected a header line of {layout.fields} tab-separated fields, "
                                     f"found {len(row)}")
                continue
            try:
                examples.append(_example(spec, layout, split_name, row, row_number, f"{path}:{line}"))
            except ValueError:
                if not skip_malformed:
                    raise
            row_number += 1
    if not examples:
        raise ValueError(f"{path}: no examples (an empty {split_name} file)")
    return examples


def _example(spec: TaskSpec, layout: SplitSpec, split_name: str, row: list[str], row_number: int,
             where: str) -> InputExample:
    if len(row) != layout.fields:
        raise ValueError(f"{where}: expected {layout.fields} tab-separated fields, found {len(row)}")

    def text(column: int | None) -> str | None:
        if column is None:
            return None
        value = row[column]
        if not value.strip():
            raise ValueError(f"{where}: empty text in column {column} (expected a sentence)")
        return value

    text_a, text_b = text(layout.text_a), text(layout.text_b)
    label = None
    if layout.label is not None:
        column = layout.label if layout.label >= 0 else len(row) + layout.label
        raw = row[column].strip()
        if spec.regression:
            try:
                label = float(raw)
            except ValueError:
                label = None
            if label is None or not math.isfinite(label):
                raise ValueError(f"{where}: expected a numeric score in column {column}, found {raw!r}")
        elif raw not in spec.labels:
            raise ValueError(f"{where}: expected a label in column {column} from {list(spec.labels)}, found {raw!r}")
        else:
            label = raw
    if layout.id is None:
        example_id = str(row_number)
    else:
        example_id = row[layout.id].strip()
        if not example_id:
            raise ValueError(f"{where}: empty id in column {layout.id}")
    return InputExample(f"{split_name}-{example_id}", text_a, text_b, label)


# ---------------------------------------------------------------------------- predictions

def _values(values) -> list:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values).tolist()


def _label_string(prediction, label_list: Sequence[str], where: str) -> str:
    if isinstance(prediction, str):
        if prediction not in label_list:
            raise ValueError(f"{where}: prediction {prediction!r} is not one of {list(label_list)}")
        return prediction
    if isinstance(prediction, float):
        if not prediction.is_integer():
            raise ValueError(f"{where}: prediction {prediction!r} is not a label id")
        prediction = int(prediction)
    if not isinstance(prediction, int) or not 0 <= prediction < len(label_list):
        raise ValueError(f"{where}: prediction {prediction!r} is not a label id in 0..{len(label_list) - 1}")
    return label_list[prediction]


def write_predictions(path: str | os.PathLike, task: str | TaskSpec, ids: Sequence, predictions: Sequence,
                      label_list: Sequence[str] | None = None) -> Path:
    """A GLUE submission file: header `index\\tprediction`, then one line per test example.

    `ids` are the test examples' ids (`[e.id for e in examples]`); `predictions` are label ids
    (written as the label string: `entailment`, `1`) or, for STS-B, floats (written with 3
    decimals, unclipped). `label_list` defaults to the task's. Name the file as GLUE expects:
    `spec.split("test").submission` (CoLA.tsv, MNLI-m.tsv, MNLI-mm.tsv, STS-B.tsv, ...).
    """
    spec = task if isinstance(task, TaskSpec) else get_task(task)
    ids, predictions = _values(ids), _values(predictions)
    if len(ids) != len(predictions):
        raise ValueError(f"{len(ids)} ids but {len(predictions)} predictions")
    if not spec.regression:
        label_list = spec.label_list if label_list is None else list(label_list)
    lines = ["index\tprediction"]
    for i, (example_id, prediction) in enumerate(zip(ids, predictions)):
        if isinstance(prediction, list):  # a row of logits
            raise ValueError(f"prediction {i} is a vector: pass label ids (the argmax of the logits)")
        if spec.regression:
            value = float(prediction)
            if not math.isfinite(value):
                raise ValueError(f"prediction {i} ({prediction!r}) is not a finite number")
            lines.append(f"{example_id}\t{value:.3f}")
        else:
            lines.append(f"{example_id}\t{_label_string(prediction, label_list, f'prediction {i}')}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path


def write_dev_predictions(path: str | os.PathLike, examples: Sequence[InputExample], predictions: Sequence,
                          label_list: Sequence[str] | None = None) -> Path:
    """Per-example predictions for error analysis, as JSON lines:
    `{"guid", "text_a", "text_b", "label", "prediction"}` (+ `"correct"` for classification).

    `predictions` are label ids, mapped through `label_list` to the label strings, or floats when
    `label_list` is None (regression).
    """
    predictions = _values(predictions)
    if len(examples) != len(predictions):
        raise ValueError(f"{len(examples)} examples but {len(predictions)} predictions")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (example, prediction) in enumerate(zip(examples, predictions)):
        record = {"guid": example.guid, "text_a": example.text_a, "text_b": example.text_b,
                  "label": example.label}
        if label_list is None:
            record["prediction"] = float(prediction)
        else:
            record["prediction"] = _label_string(prediction, label_list, f"prediction {i}")
            if example.label is not None:
                record["correct"] = record["prediction"] == example.label
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    write_text_atomic(path, "".join(lines))
    return path


def read_glue_file(task: str | TaskSpec, path: str | os.PathLike, split: str = "test") -> list[InputExample]:
    """The examples of one GLUE file given by its path, laid out as the task's `split`."""
    spec = task if isinstance(task, TaskSpec) else get_task(task)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    layout = dataclasses.replace(spec.split(split), file=path.name)
    custom = dataclasses.replace(spec, splits={**spec.splits, spec.split_name(split): layout})
    return read_glue_examples(custom, path.parent, split)
