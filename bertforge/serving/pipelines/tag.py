"""The `tag` pipeline: labels per word and entities with character spans (token classification, NER)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...modeling import BertForTokenClassification
from ...tasks.arrays import softmax
from ...tasks.windows import max_context_window
from ..entities import group_entities
from ..graphs import LogitsGraph
from ..registry import register_pipeline
from .base import Feature, Pipeline, PipelineInputError, windows


@register_pipeline("tag")
class TagPipeline(Pipeline):
    """Labels per word and entities with character spans (NER).

    Each word is labelled by its first word piece (the paper's §4.3 setup); texts longer than
    `max_length` run as overlapping windows `stride` tokens apart, each token taking the window in
    which it has the most context. `pipe(texts, aggregation="simple")` -> for each text a list of
    entities `{"entity", "score", "start", "end", "text"}`; `aggregation="none"` gives every word
    `{"word", "label", "score", "start", "end"}` instead. `stride` is at least
    `limits.min_stride_fraction` of `max_length`, and the windows of a call at most `limits.max_rows`.
    """

    model_class = BertForTokenClassification
    output_names = ("logits",)
    output_axes = {"logits": {0: "batch", 1: "sequence"}}
    request_options = {"aggregation": (str,), "stride": (int,)}

    @classmethod
    def build_graph(cls, model):
        return LogitsGraph(model)

    def check_options(self, aggregation="simple", stride=None, **_) -> None:
        if aggregation not in ("simple", "none"):
            raise PipelineInputError(f"aggregation must be 'simple' or 'none', got {aggregation!r}")
        if stride is not None:
            self.check_stride("stride", stride)

    def preprocess(self, texts, aggregation="simple", stride=None):
        max_tokens = self.max_length - 2
        stride = max_tokens // 2 if stride is None else stride
        rows = self.tokenizer.encode_batch(texts, max_length=self.max_length, truncation=False, padding=False,
                                           return_offsets=True)
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        spans_of = [windows(len(row["input_ids"]) - 2, max_tokens, stride) for row in rows]
        self.check_rows(sum(map(len, spans_of)), "texts x windows")
        features = []
        for i, (row, spans) in enumerate(zip(rows, spans_of)):
            ids, offsets = row["input_ids"][1:-1], row["offsets"][1:-1]
            for w, (start, end) in enumerate(spans):
                n = end - start + 2
                features.append(Feature(i, [cls, *ids[start:end], sep], [0] * n, info={
                    "ids": ids, "offsets": offsets, "spans": spans, "window": w}))
        return features

    def postprocess(self, inputs, features, outputs, aggregation="simple", stride=None):
        labels = self.config.id2label or {}
        per_example: dict[int, list[tuple[Feature, np.ndarray]]] = {}
        for feature, output in zip(features, outputs):
            per_example.setdefault(feature.example, []).append((feature, output["logits"]))
        results = []
        for i, text in enumerate(inputs[0]):
            pieces = per_example.get(i, [])
            if not pieces:
                results.append([])
                continue
            first = pieces[0][0].info
            ids, offsets, spans = first["ids"], first["offsets"], first["spans"]
            probs = [softmax(logits) for _, logits in pieces]
            tokens = self.tokenizer.convert_ids_to_tokens(ids)
            words = []
            for position, token in enumerate(tokens):
                if token.startswith("##") and words:
                    words[-1]["end"] = offsets[position][1]  # a continuation piece extends the word
                    continue
                window = max_context_window(position, spans)
                p = probs[window][1 + position - spans[window][0]]  # +1: [CLS]
                best = int(p.argmax())
                words.append({"label": labels.get(best, f"LABEL_{best}"), "score": float(p[best]),
                              "start": offsets[position][0], "end": offsets[position][1]})
            if aggregation == "none":
                results.append([{"word": text[w["start"]:w["end"]], **w} for w in words])
            else:
                results.append(group_entities(text, words))
        return results

    def __call__(self, texts: Sequence[str], *, batch_size: int = 32, aggregation: str = "simple",
                 stride: int | None = None) -> list[list[dict]]:
        return super().__call__(texts, batch_size=batch_size, aggregation=aggregation, stride=stride)


__all__ = ["TagPipeline"]
