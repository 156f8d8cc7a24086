"""GLUE metrics against values worked out by hand."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from bertforge.metrics import glue_metrics, main_metric, mcc, metric_names, normalize_task, pearson, spearman

# A 2x2 confusion matrix: TP = 3, FN = 2, FP = 1, TN = 4 (positive = label 1).
LABELS = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
PREDS = [1, 1, 1, 0, 0, 1, 0, 0, 0, 0]
# accuracy  = (TP + TN) / 10 = 7/10
# precision = TP / (TP + FP) = 3/4, recall = TP / (TP + FN) = 3/5
# f1        = 2 · (3/4)(3/5) / (3/4 + 3/5) = 0.9 / 1.35 = 2/3
# mcc       = (TP·TN − FP·FN) / √((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (12 − 2) / √(4·5·5·6) = 10/√600
ACCURACY, F1, MCC = 0.7, 2 / 3, 10 / math.sqrt(600)  # mcc = 0.40825


def test_confusion_matrix_by_hand():
    assert glue_metrics("cola", PREDS, LABELS) == {"mcc": pytest.approx(MCC, abs=1e-12)}
    assert glue_metrics("mrpc", PREDS, LABELS) == {"f1": pytest.approx(F1), "accuracy": pytest.approx(ACCURACY)}
    assert glue_metrics("qqp", np.array(PREDS), torch.tensor(LABELS)) == {
        "f1": pytest.approx(F1), "accuracy": pytest.approx(ACCURACY)}
    for task in ("sst2", "qnli", "rte", "wnli", "mnli"):
        assert glue_metrics(task, PREDS, LABELS) == {"accuracy": pytest.approx(ACCURACY)}
    assert glue_metrics("mnli-mm", PREDS, LABELS) == {"accuracy_mismatched": pytest.approx(ACCURACY)}


def test_values_are_python_floats():
    for task in ("cola", "mrpc", "stsb", "rte"):
        for value in glue_metrics(task, PREDS, LABELS).values():
            assert type(value) is float


def test_mcc_matches_the_formula_on_random_data():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 500)
    preds = np.where(rng.random(500) < 0.7, labels, 1 - labels)
    tp = int(((preds == 1) & (labels == 1)).sum())
    tn = int(((preds == 0) & (labels == 0)).sum())
    fp = int(((preds == 1) & (labels == 0)).sum())
    fn = int(((preds == 0) & (labels == 1)).sum())
    expected = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert mcc(preds, labels) == pytest.approx(expected, abs=1e-12)


def test_correlations_by_hand():
    # x = 1 2 3, y = 1 3 2: deviations (-1, 0, 1) and (-1, 1, 0); covariance sum 1, each variance sum 2
    # -> pearson = 1 / √(2·2) = 0.5; the ranks are the values, so spearman = 0.5 too.
    assert glue_metrics("stsb", [1.0, 2.0, 3.0], [1.0, 3.0, 2.0]) == {"pearson": pytest.approx(0.5),
                                                                     "spearman": pytest.approx(0.5)}
    # y = x² on 1..4: monotone, so spearman = 1; deviations (-1.5, -.5, .5, 1.5) and (-6.5, -3.5, 1.5, 8.5)
    # -> covariance sum 25, variance sums 5 and 129: pearson = 25 / √645 = 0.98437.
    result = glue_metrics("STS-B", [1, 2, 3, 4], [1, 4, 9, 16])
    assert result["pearson"] == pytest.approx(25 / math.sqrt(645)) and result["spearman"] == pytest.approx(1.0)
    # A negative correlation is reported as it is, not clipped to [0, 1].
    assert glue_metrics("stsb", [3.0, 2.0, 1.0], [1.0, 2.0, 3.0]) == {"pearson": pytest.approx(-1.0),
                                                                     "spearman": pytest.approx(-1.0)}
    assert glue_metrics("cola", [1, 1, 0, 0], [0, 0, 1, 1]) == {"mcc": pytest.approx(-1.0)}


def test_degenerate_cases_do_not_crash_or_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert glue_metrics("cola", [1, 1, 1, 1], [0, 1, 1, 0]) == {"mcc": 0.0}  # constant predictions
        assert glue_metrics("cola", [0, 1, 1, 0], [1, 1, 1, 1]) == {"mcc": 0.0}  # constant labels
        assert glue_metrics("stsb", [2.5, 2.5, 2.5], [1.0, 4.0, 2.0]) == {"pearson": 0.0, "spearman": 0.0}
        assert pearson([1.0], [2.0]) == 0.0 and spearman([1.0, 2.0], [3.0, 3.0]) == 0.0
        assert glue_metrics("mrpc", [0, 0, 0], [0, 0, 0]) == {"f1": 0.0, "accuracy": 1.0}  # no positives at all


def test_main_metric_and_names():
    assert {task: main_metric(task) for task in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "mnli-mm",
                                                   "qnli", "rte", "wnli")} == {
        "cola": "mcc", "sst2": "accuracy", "mrpc": "f1", "stsb": "pearson", "qqp": "f1", "mnli": "accuracy",
        "mnli-mm": "accuracy_mismatched", "qnli": "accuracy", "rte": "accuracy", "wnli": "accuracy"}
    assert metric_names("mrpc") == ("f1", "accuracy")
    assert [normalize_task(n) for n in ("CoLA", "SST-2", "STS-B", "MNLI-mm", "mnli_mismatched", "MNLI-m")] == [
        "cola", "sst2", "stsb", "mnli-mm", "mnli-mm", "mnli"]
    for task in ("cola", "mrpc", "stsb", "mnli-mm"):
        assert main_metric(task) in glue_metrics(task, PREDS, LABELS)


def test_bad_inputs():
    with pytest.raises(ValueError, match="3 predictions but 2 labels"):
        glue_metrics("rte", [0, 1, 0], [0, 1])
    with pytest.raises(ValueError, match="argmax"):
        glue_metrics("rte", [[0.1, 0.9]], [1])
    with pytest.raises(ValueError, match="label ids"):
        glue_metrics("rte", [0.4, 0.6], [0, 1])
    with pytest.raises(ValueError, match="no examples"):
        glue_metrics("rte", [], [])
    with pytest.raises(ValueError, match="unknown GLUE task 'squad'"):
        glue_metrics("squad", [1], [1])
    assert glue_metrics("rte", np.array([0.0, 1.0]), [0, 1]) == {"accuracy": 1.0}  # ids held as floats
