"""Evaluation metrics (GLUE's, on scikit-learn and SciPy)."""

from .glue import (GLUE_METRIC_TASKS, accuracy, f1, glue_metrics, main_metric, mcc, metric_names,
                   normalize_task, pearson, spearman)

__all__ = ["GLUE_METRIC_TASKS", "accuracy", "f1", "glue_metrics", "main_metric", "mcc", "metric_names",
           "normalize_task", "pearson", "spearman"]
