"""The `classify` pipeline: a label and its probability per text or text pair (sequence classification);
for a multi-label model, every label whose probability reaches the model's decision threshold."""

from __future__ import annotations

from typing import Sequence

from ...modeling import BertForSequenceClassification
from ...tasks.arrays import softmax
from ...tasks.multi_label import is_multi_label, label_thresholds, sigmoid
from ..graphs import LogitsGraph
from ..registry import register_pipeline
from .base import Pipeline


@register_pipeline("classify")
class ClassifyPipeline(Pipeline):
    """A label and its probability per text (or text pair), from the model's `config.id2label`.

    `pipe(texts, text_pairs=None)` -> for each input `{"label", "score", "scores": {label: p}}`;
    a regression model (num_labels = 1) gives `{"score": value}`; a multi-label model (config.json's
    `problem_type="multi_label_classification"`) `{"labels": [{"label", "score"}, ...], "scores": {label: p}}`:
    every label whose probability (a sigmoid per label) reaches its threshold (`multi_label_threshold(s)`
    in config.json, tuned on dev by `bertforge finetune multi-label`; else 0.5), most probable first.
    """

    model_class = BertForSequenceClassification
    output_names = ("logits",)
    output_axes = {"logits": {0: "batch"}}
    optional_request_inputs = ("text_pairs",)

    @classmethod
    def build_graph(cls, model):
        return LogitsGraph(model)

    @property
    def labels(self) -> list[str]:
        id2label = self.config.id2label or {}
        return [id2label.get(i, f"LABEL_{i}") for i in range(self.config.num_labels)]

    def preprocess(self, texts, text_pairs=None):
        return self.encode_texts(texts, text_pairs)

    def postprocess(self, inputs, features, outputs, text_pairs=None):
        labels = self.labels
        multi_label = len(labels) > 1 and is_multi_label(self.config)
        thresholds = label_thresholds(self.config) if multi_label else None
        results = []
        for output in outputs:
            logits = output["logits"]
            if multi_label:
                probs = sigmoid(logits)
                chosen = sorted((i for i in range(len(labels)) if probs[i] >= thresholds[i]), key=lambda i: -probs[i])
                results.append({"labels": [{"label": labels[i], "score": float(probs[i])} for i in chosen],
                                "scores": {label: float(p) for label, p in zip(labels, probs)}})
                continue
            if len(labels) == 1:
                results.append({"score": float(logits[0])})
                continue
            probs = softmax(logits)
            best = int(probs.argmax())
            results.append({"label": labels[best], "score": float(probs[best]),
                            "scores": {label: float(p) for label, p in zip(labels, probs)}})
        return results

    def __call__(self, texts: Sequence[str], text_pairs: Sequence[str] | None = None, *,
                 batch_size: int = 32) -> list[dict]:
        return super().__call__(texts, batch_size=batch_size, text_pairs=text_pairs)


__all__ = ["ClassifyPipeline"]
