"""The `embed` pipeline: one vector per text, pooled from chosen encoder layers (feature extraction)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...modeling import BertModel
from ..graphs import HiddenStatesGraph
from ..registry import register_pipeline
from .base import Pipeline, PipelineInputError


@register_pipeline("embed")
class EmbedPipeline(Pipeline):
    """One vector per text: `pipe(texts, pooling="mean", layers=(-1,), normalize=False)`.

    pooling: "cls" (the [CLS] token's hidden state) or "mean" (the average over real tokens,
    specials included, as sentence-transformers does). layers: encoder layers, -1 = last, 0 = first
    (as `extract-features`); several are pooled each and concatenated in the order given (the
    paper's feature-based setup concatenates the last four). Returns a float32 array (N, H x layers).
    """

    model_class = BertModel
    unused_weights = ("pooler.",)  # hidden states only
    output_names = ("hidden_states",)
    output_axes = {"hidden_states": {0: "batch", 2: "sequence"}}
    request_options = {"pooling": (str,), "layers": (list,), "normalize": (bool,)}
    optional_request_inputs = ("text_pairs",)

    @classmethod
    def build_graph(cls, model):
        if not isinstance(model, BertModel):  # a head class: embed with its encoder
            model = model.bert
        return HiddenStatesGraph(model)

    def preprocess(self, texts, text_pairs=None, pooling="mean", layers=(-1,), normalize=False):
        if pooling not in ("cls", "mean"):
            raise PipelineInputError(f"pooling must be 'cls' or 'mean', got {pooling!r}")
        self._layer_indexes(layers)
        return self.encode_texts(texts, text_pairs)

    def _layer_indexes(self, layers) -> list[int]:
        num_layers = self.config.num_hidden_layers
        if isinstance(layers, int):
            layers = [layers]
        layers = list(layers)
        if not layers or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
            raise PipelineInputError(f"layers must be a non-empty list of integers, got {layers!r}")
        for index in layers:
            if not -num_layers <= index < num_layers:
                raise PipelineInputError(f"layer index {index} out of range for a {num_layers}-layer model "
                                         f"(use -{num_layers}..{num_layers - 1})")
        return [index % num_layers for index in layers]

    def postprocess(self, inputs, features, outputs, text_pairs=None, pooling="mean", layers=(-1,),
                    normalize=False):
        indexes = self._layer_indexes(layers)
        hidden = self.config.hidden_size
        vectors = np.zeros((len(inputs[0]), hidden * len(indexes)), dtype=np.float32)
        for feature, output in zip(features, outputs):
            states = output["hidden_states"][indexes, :len(feature.input_ids)]  # (layers, S, H)
            pooled = states[:, 0] if pooling == "cls" else states.mean(axis=1)
            vectors[feature.example] = pooled.reshape(-1)
        if normalize:
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return vectors

    def __call__(self, texts: Sequence[str], text_pairs: Sequence[str] | None = None, *, batch_size: int = 32,
                 pooling: str = "mean", layers: Sequence[int] | int = (-1,), normalize: bool = False) -> np.ndarray:
        return super().__call__(texts, batch_size=batch_size, text_pairs=text_pairs, pooling=pooling,
                                layers=layers, normalize=normalize)


__all__ = ["EmbedPipeline"]
