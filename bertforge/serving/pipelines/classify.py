"""The `classify` pipeline: a label and its probability per text or text pair (sequence classification)."""

from __future__ import annotations

from typing import Sequence


from ...modeling import BertForSequenceClassification
from ...tasks.arrays import softmax
from ..graphs import LogitsGraph
from ..registry import register_pipeline
from .base import Pipeline


@register_pipeline("classify")
class ClassifyPipeline(Pipeline):
    """A label and its probability per text (or text pair), from the model's `config.id2label`.

    `pipe(texts, text_pairs=None)` -> for each input `{"label", "score", "scores": {label: p}}`;
    a regression model (num_labels = 1) gives `{"score": value}`.
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
        results = []
        for output in outputs:
            logits = output["logits"]
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
