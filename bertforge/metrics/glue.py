"""GLUE's metrics, on scikit-learn and SciPy.

Per task, as the GLUE paper (Wang et al. 2019) and the BERT paper report them:

    cola            mcc (Matthews correlation)
    stsb            pearson, spearman
    mrpc, qqp       f1 (of the positive class, label id 1), accuracy
    mnli            accuracy (on dev_matched)
    mnli-mm         accuracy_mismatched (the same model on dev_mismatched)
    sst2, qnli, rte, wnli, and ax   accuracy

`predictions` and `labels` are label ids for classification (the argmax of the logits) and floats
for STS-B. Every value is a Python float: accuracy and F1 lie in [0, 1]; mcc, pearson and spearman
in [-1, 1] and are kept as they are (a negative correlation is a real, if bad, result).

`main_metric(task)` names the value to select checkpoints on. For STS-B it is **pearson**: the
GLUE leaderboard shows Pearson first (its per-task score averages Pearson and Spearman, and the
BERT paper's Table 1 reports Spearman); on STS-B the two differ by well under a point, so the
choice rarely changes which checkpoint wins, and both are always in the dict.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

_TASK_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("mcc",),
    "sst2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "stsb": ("pearson", "spearman"),
    "qqp": ("f1", "accuracy"),
    "mnli": ("accuracy",),
    "mnli-mm": ("accuracy_mismatched",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
    "ax": ("accuracy",),  # the diagnostic set, scored by an MNLI model (GLUE itself reports R3 there)
}
_MAIN_METRIC = {task: names[0] for task, names in _TASK_METRICS.items()}
_REGRESSION = {"stsb"}

# Names people write for the same tasks: "SST-2", "STS-B", "CoLA", "MNLI-mm", "mnli_mismatched".
_ALIASES = {"mnli-m": "mnli", "mnlim": "mnli", "mnlimatched": "mnli", "mnli-matched": "mnli",
            "mnlimm": "mnli-mm", "mnli-mismatched": "mnli-mm", "mnlimismatched": "mnli-mm"}

GLUE_METRIC_TASKS = tuple(_TASK_METRICS)


def normalize_task(task: str) -> str:
    """'SST-2' -> 'sst2', 'STS-B' -> 'stsb', 'MNLI-mm' / 'mnli_mismatched' -> 'mnli-mm'."""
    name = task.strip().lower().replace("_", "-")
    if name in _TASK_METRICS:
        return name
    if name in _ALIASES:
        return _ALIASES[name]
    compact = name.replace("-", "")
    if compact in _TASK_METRICS:
        return compact
    if compact in _ALIASES:
        return _ALIASES[compact]
    raise ValueError(f"unknown GLUE task {task!r}; known: {', '.join(GLUE_METRIC_TASKS)}")


def main_metric(task: str) -> str:
    """The key of `glue_metrics(task, ...)` to select checkpoints on (higher is better)."""
    return _MAIN_METRIC[normalize_task(task)]


def metric_names(task: str) -> tuple[str, ...]:
    """The keys `glue_metrics(task, ...)` returns, the main metric first."""
    return _TASK_METRICS[normalize_task(task)]


def _as_array(values, name: str) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one value per example (1-D), got shape {array.shape}"
                         + ("; take the argmax of the logits first" if array.ndim == 2 else ""))
    return array


def accuracy(predictions: Sequence, labels: Sequence) -> float:
    predictions, labels = _as_array(predictions, "predictions"), _as_array(labels, "labels")
    return float((predictions == labels).mean())


def f1(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """F1 of the positive class (label id 1), as GLUE scores MRPC and QQP.

    0.0 when there is no positive prediction and no positive label (precision and recall both
    undefined), rather than scikit-learn's warning.
    """
    return float(f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0.0))


def mcc(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Matthews correlation: (TP·TN − FP·FN) / √((TP+FP)(TP+FN)(TN+FP)(TN+FN)) for two classes.

    scikit-learn returns 0.0 when the denominator is 0 (constant predictions or labels): a model
    that always says "acceptable" has no correlation with the truth, which is what 0 means.
    """
    return float(matthews_corrcoef(labels, predictions))


def _correlation(function, predictions, labels) -> float:
    predictions = _as_array(predictions, "predictions").astype(np.float64)
    labels = _as_array(labels, "labels").astype(np.float64)
    # A constant series (e.g. a collapsed regression head predicting the mean everywhere) has
    # no variance, so the correlation is 0/0: undefined, and SciPy returns NaN with a warning. A
    # NaN would poison checkpoint selection (NaN > x is always False) and the logs; 0.0, "no
    # linear relationship", is the honest score of a model whose output carries no information.
    if len(predictions) < 2 or np.ptp(predictions) == 0 or np.ptp(labels) == 0:
        return 0.0
    value = float(function(predictions, labels)[0])
    return 0.0 if np.isnan(value) else value


def pearson(predictions: Sequence[float], labels: Sequence[float]) -> float:
    return _correlation(pearsonr, predictions, labels)


def spearman(predictions: Sequence[float], labels: Sequence[float]) -> float:
    return _correlation(spearmanr, predictions, labels)


_FUNCTIONS = {"accuracy": accuracy, "accuracy_mismatched": accuracy, "f1": f1, "mcc": mcc,
              "pearson": pearson, "spearman": spearman}


def glue_metrics(task: str, predictions: Sequence, labels: Sequence) -> dict[str, float]:
    """The task's metrics as {name: float}; see the module docstring for which."""
    name = normalize_task(task)
    predictions, labels = _as_array(predictions, "predictions"), _as_array(labels, "labels")
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions but {len(labels)} labels")
    if len(labels) == 0:
        raise ValueError("no examples to score")
    if name not in _REGRESSION:
        for array, what in ((predictions, "predictions"), (labels, "labels")):
            if not np.issubdtype(array.dtype, np.integer):
                if np.issubdtype(array.dtype, np.floating) and np.all(np.mod(array, 1) == 0):
                    continue  # ids that went through a float array; fine
                raise ValueError(f"{task}: {what} must be label ids (integers), got dtype {array.dtype}")
        predictions, labels = predictions.astype(np.int64), labels.astype(np.int64)
    return {metric: _FUNCTIONS[metric](predictions, labels) for metric in _TASK_METRICS[name]}
