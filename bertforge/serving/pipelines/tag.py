"""The `tag` pipeline: labels per word and entities with character spans (token classification, NER)."""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from ...modeling import BertForTokenClassification
from ...tokenization.vocab import continuation_flags
from ...tasks.arrays import softmax
from ...tasks.windows import max_context_window
from ..entities import group_entities
from ..graphs import WordLogitsGraph
from ..registry import register_pipeline
from .base import Feature, Pipeline, PipelineInputError, windowed_tokens, windows, word_count


@register_pipeline("tag")
class TagPipeline(Pipeline):
    """Labels per word and entities with character spans (NER).

    Each word is labelled by its first word piece (the paper's §4.3 setup), and only those rows run
    through the encoder's last layer and the classifier (`WordLogitsGraph`); texts longer than
    `max_length` run as overlapping windows `stride` tokens apart, each token taking the window in
    which it has the most context. `pipe(texts, aggregation="simple")` -> for each text a list of
    entities `{"entity", "score", "start", "end", "text"}`; `aggregation="none"` gives every word
    `{"word", "label", "score", "start", "end"}` instead. With `limits` (the server's),
    `stride` is at least `limits.min_stride_fraction` of `max_length`, and the windows of a call at most
    `limits.max_rows`; without, a call takes any number of texts.
    """

    model_class = BertForTokenClassification
    # Each word's first piece, in the window where it has the most context: the only rows read.
    extra_input_names = ("word_positions",)
    output_names = ("logits",)
    output_axes = {"logits": {0: "batch", 1: "words"}}
    # An ONNX file exported before the graph took word_positions gives (B, S, K): gathered at them instead.
    rows_selected_by = {"word_positions": "logits"}
    request_options = {"aggregation": (str,), "stride": (int,)}

    @classmethod
    def build_graph(cls, model):
        return WordLogitsGraph(model)

    def check_options(self, aggregation="simple", stride=None, **_) -> None:
        if aggregation not in ("simple", "none"):
            raise PipelineInputError(f"aggregation must be 'simple' or 'none', got {aggregation!r}")
        if stride is not None:
            self.check_stride("stride", stride)

    @functools.cached_property
    def _continuation(self) -> np.ndarray:
        return continuation_flags(self.tokenizer.vocab)

    def word_starts(self, ids: Sequence[int]) -> np.ndarray:
        """The positions in `ids` (a text's word pieces) where a word starts: every piece but a "##"
        continuation, and the first piece whatever it is."""
        starts = np.flatnonzero(~self._continuation[np.asarray(ids, dtype=np.int64)])
        if len(ids) and (not len(starts) or starts[0] != 0):
            starts = np.concatenate([[0], starts])
        return starts

    def window(self, stride: int | None) -> tuple[int, int]:
        """(tokens per window, stride) of a call: room for a text's tokens beside [CLS] and [SEP], and a
        stride of half of it unless given."""
        max_tokens = self.max_length - 2
        return max_tokens, max_tokens // 2 if stride is None else stride

    def preprocess(self, texts, aggregation="simple", stride=None):
        max_tokens, stride = self.window(stride)
        rows = self.tokenizer.encode_batch(texts, max_length=self.max_length, truncation=False, padding=False,
                                           return_offsets=True)
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        spans_of = [windows(len(row["input_ids"]) - 2, max_tokens, stride) for row in rows]
        self.check_rows(sum(map(len, spans_of)), "texts x windows")
        features = []
        for i, (row, spans) in enumerate(zip(rows, spans_of)):
            ids, offsets = row["input_ids"][1:-1], row["offsets"][1:-1]
            starts = self.word_starts(ids)
            if len(spans) == 1:
                owners = np.zeros(len(starts), dtype=np.int64)
            else:  # each word read in the window where its first piece has the most context
                owners = np.array([max_context_window(int(position), spans) for position in starts], dtype=np.int64)
            for w, (start, end) in enumerate(spans):
                n = end - start + 2
                mine = starts[owners == w]
                features.append(Feature(i, [cls, *ids[start:end], sep], [0] * n,
                                        {"word_positions": (1 + mine - start).tolist()},  # +1: [CLS]
                                        info={"pieces": len(ids), "offsets": offsets, "starts": mine}))
        return features

    def postprocess(self, inputs, features, outputs, aggregation="simple", stride=None):
        labels = self.config.id2label or {}
        per_example: dict[int, list[tuple[Feature, np.ndarray]]] = {}
        for feature, output in zip(features, outputs):
            per_example.setdefault(feature.example, []).append((feature, output["logits"]))
        names: list[str] = []
        results = []
        for i, text in enumerate(inputs[0]):
            pieces = per_example.get(i, [])
            if not pieces:
                results.append([])
                continue
            count, offsets = pieces[0][0].info["pieces"], pieces[0][0].info["offsets"]
            # (words, K): each window's rows are its words' first pieces (the rest is the batch's padding)
            starts = np.concatenate([f.info["starts"] for f, _ in pieces])
            logits = np.concatenate([out[:len(f.info["starts"])] for f, out in pieces])
            order = np.argsort(starts, kind="stable")
            starts, probs = starts[order], softmax(logits[order])
            best = probs.argmax(-1)
            scores = probs[np.arange(len(best)), best].tolist()
            if len(names) < probs.shape[-1]:
                names = [labels.get(k, f"LABEL_{k}") for k in range(probs.shape[-1])]
            ends = [*(starts[1:] - 1).tolist(), count - 1]  # a word ends with its last piece
            words = [{"label": names[b], "score": score, "start": offsets[s][0], "end": offsets[e][1]}
                     for b, score, s, e in zip(best.tolist(), scores, starts.tolist(), ends)]
            if aggregation == "none":
                results.append([{"word": text[w["start"]:w["end"]], **w} for w in words])
            else:
                results.append(group_entities(text, words))
        return results

    def work_tokens(self, inputs, options) -> int:
        """Each text's windows (`preprocess`'s), each with its [CLS] and [SEP]."""
        room, stride = self.window(options.get("stride"))
        return sum(windowed_tokens(n, room, stride, 2) for n in self.token_counts(inputs["texts"]))

    def least_work_tokens(self, inputs, options) -> int:
        """Windows cover every token of a text: at least its words and one row's specials."""
        return sum(word_count(text) + 2 for text in inputs["texts"])

    def __call__(self, texts: Sequence[str], *, batch_size: int = 32, aggregation: str = "simple",
                 stride: int | None = None) -> list[list[dict]]:
        return super().__call__(texts, batch_size=batch_size, aggregation=aggregation, stride=stride)


__all__ = ["TagPipeline"]
