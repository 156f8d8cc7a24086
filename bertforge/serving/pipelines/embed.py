"""The `embed` pipeline: one vector per text, pooled from chosen encoder layers (feature extraction, and the
sentence embeddings of a bi-encoder); and its companion `similarity`: texts ranked by cosine to a query.

A model directory that declares its pooling (a `bertforge finetune sentence-embedding` output, or a
sentence-transformers directory such as all-MiniLM-L6-v2: `modules.json`, `1_Pooling/config.json`,
`2_Normalize`) is embedded with that pooling and normalisation by default, and at its `max_seq_length`;
a request for another pooling is refused. A bare encoder declares nothing: mean pooling, not normalised.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ...modeling import BertModel
from ...tasks.sentence_embedding import CONFIG_KEY, SentencePooling, read_pooling
from ..graphs import HiddenStatesGraph, LastHiddenStateGraph
from ..registry import register_pipeline
from ..runner import Runner, TorchRunner
from .base import Feature, Pipeline, PipelineInputError, check_texts, word_count


@register_pipeline("embed")
class EmbedPipeline(Pipeline):
    """One vector per text: `pipe(texts, pooling=None, layers=(-1,), normalize=None)`.

    pooling: "cls" (the [CLS] token's hidden state) or "mean" (the average over real tokens,
    specials included, as sentence-transformers does); None: the model's declared pooling
    (`declared`), else mean. normalize: to unit length; None: as the model declares, else False.
    layers: encoder layers, -1 = last, 0 = first (as `extract-features`); several are pooled each and
    concatenated in the order given (the paper's feature-based setup concatenates the last four).
    Returns a float32 array (N, H x layers).
    """

    model_class = BertModel
    unused_weights = ("pooler.",)  # hidden states only
    output_names = ("hidden_states",)
    output_axes = {"hidden_states": {0: "batch", 2: "sequence"}}
    request_options = {"pooling": (str,), "layers": (list,), "normalize": (bool,)}
    optional_request_inputs = ("text_pairs",)

    def __init__(self, model: Any, *args: Any, max_length: int | None = None, **kwargs: Any) -> None:
        declared = None
        if not hasattr(model, "config"):  # a directory (a module passed in carries its config)
            declared = read_pooling(model)
        elif isinstance(model.config.extra.get(CONFIG_KEY), dict):
            declared = SentencePooling(**model.config.extra[CONFIG_KEY])
        if max_length is None and declared is not None and declared.max_seq_length:
            max_length = declared.max_seq_length  # sentence-transformers' truncation
        super().__init__(model, *args, max_length=max_length, **kwargs)
        self.declared: SentencePooling | None = declared
        # The default call reads the last layer only: on PyTorch it runs a graph that returns that layer
        # alone (`runner_for`); ONNX and a caller's runner run the general graph for every call.
        self.last_layer_runner: Runner | None = None
        if isinstance(self.runner, TorchRunner) and isinstance(self.runner.graph, HiddenStatesGraph):
            self.last_layer_runner = TorchRunner(LastHiddenStateGraph(self.runner.graph.model), self.input_names,
                                                 self.output_names, self.device)

    @classmethod
    def build_graph(cls, model):
        if not isinstance(model, BertModel):  # a head class: embed with its encoder
            model = model.bert
        return HiddenStatesGraph(model)

    def _settings(self, pooling: str | None, normalize: bool | None) -> tuple[str, bool]:
        """The pooling and normalisation of a call: the caller's, else the model's declared ones."""
        declared = self.declared
        if pooling is None:
            pooling = declared.pooling if declared is not None else "mean"
        if pooling not in ("cls", "mean"):
            raise PipelineInputError(f"pooling must be 'cls' or 'mean', got {pooling!r}")
        if declared is not None and pooling != declared.pooling:
            raise PipelineInputError(f"pooling {pooling!r}: the model declares {declared.pooling!r} pooling "
                                     "(its embeddings were trained so); leave pooling out")
        if normalize is None:
            normalize = declared.normalize if declared is not None else False
        return pooling, normalize

    def check_options(self, pooling: str | None = None, normalize: bool | None = None, **options: Any) -> None:
        self._settings(pooling, normalize)

    def runner_for(self, layers: Sequence[int] | int = (-1,), **options: Any) -> Runner:
        last = [self.config.num_hidden_layers - 1]
        if self.last_layer_runner is not None and self._layer_indexes(layers) == last:
            return self.last_layer_runner
        return self.runner

    def preprocess(self, texts, text_pairs=None, pooling=None, layers=(-1,), normalize=None):
        self._settings(pooling, normalize)
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

    def pooled(self, features: Sequence[Feature], outputs: Sequence[dict[str, np.ndarray]], count: int,
               pooling: str, layers: Sequence[int] = (-1,), normalize: bool = False) -> np.ndarray:
        """(count, H x layers) float32: each feature's pooled vector at row `feature.example`. Its output
        holds every layer (`HiddenStatesGraph`) or exactly the asked ones (`LastHiddenStateGraph`)."""
        indexes = self._layer_indexes(layers)
        hidden = self.config.hidden_size
        vectors = np.zeros((count, hidden * len(indexes)), dtype=np.float32)
        for feature, output in zip(features, outputs):
            states = output["hidden_states"]
            if states.shape[0] == self.config.num_hidden_layers:  # every layer: take the asked ones
                states = states[indexes]
            states = states[:, :len(feature.input_ids)]  # (layers, S, H)
            pooled = states[:, 0] if pooling == "cls" else states.mean(axis=1)
            vectors[feature.example] = pooled.reshape(-1)
        if normalize:
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return vectors

    def postprocess(self, inputs, features, outputs, text_pairs=None, pooling=None, layers=(-1,),
                    normalize=None):
        pooling, normalize = self._settings(pooling, normalize)
        return self.pooled(features, outputs, len(inputs[0]), pooling, layers, normalize)

    def __call__(self, texts: Sequence[str], text_pairs: Sequence[str] | None = None, *, batch_size: int = 32,
                 pooling: str | None = None, layers: Sequence[int] | int = (-1,),
                 normalize: bool | None = None) -> np.ndarray:
        return super().__call__(texts, batch_size=batch_size, text_pairs=text_pairs, pooling=pooling,
                                layers=layers, normalize=normalize)


@register_pipeline("similarity")
class SimilarityPipeline(EmbedPipeline):
    """Texts ranked by the cosine of their embeddings to a query (semantic search), each text embedded alone
    with the model's pooling (`EmbedPipeline`). Served beside `embed` (`POST /v1/similarity`).

    `pipe(queries, texts, top_k=None)`: `texts[i]` is the list of candidates of `queries[i]`; returns for each
    query its candidates, most similar first: `[{"index": j, "text": texts[i][j], "score": cosine}, ...]`
    (the first `top_k` when given).
    """

    request_inputs = ("queries", "texts")
    optional_request_inputs = ()
    nested_request_inputs = ("texts",)
    request_options = {"top_k": (int,)}
    chunk_batches = None  # a query and its candidates are ranked together

    def check_inputs(self, inputs: tuple) -> tuple:
        if len(inputs) != 2:
            raise PipelineInputError("similarity takes queries and texts (a list of candidate texts per query)")
        queries = self.check_tokens(check_texts(inputs[0], "queries"), "queries")
        texts = inputs[1]
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise PipelineInputError("texts must be a list of lists of strings (the candidates of each query)")
        if len(texts) != len(queries):
            raise PipelineInputError(f"{len(queries)} queries but {len(texts)} lists of texts")
        rows = [self.check_tokens(check_texts(row, f"texts[{i}]", allow_empty_list=False), f"texts[{i}]")
                for i, row in enumerate(texts)]
        self.check_rows(len(queries) + sum(len(row) for row in rows), "queries and their texts")
        return queries, rows

    def check_options(self, top_k: int | None = None, **options: Any) -> None:
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
            raise PipelineInputError(f"top_k must be a positive integer, got {top_k!r}")

    def preprocess(self, queries, texts, top_k=None):
        return self.encode_texts(self._rows(queries, texts))

    def postprocess(self, inputs, features, outputs, top_k=None):
        queries, texts = inputs
        pooling, _ = self._settings(None, None)
        vectors = self.pooled(features, outputs, len(features), pooling, normalize=True)
        results, start = [], len(queries)
        for i, row in enumerate(texts):
            scores = vectors[start:start + len(row)] @ vectors[i]
            start += len(row)
            order = np.argsort(-scores, kind="stable")[:top_k]
            results.append([{"index": int(j), "text": row[j], "score": float(scores[j])} for j in order])
        return results

    @staticmethod
    def _rows(queries: Sequence[str], texts: Sequence[Sequence[str]]) -> list[str]:
        """The texts a call embeds, each alone: its queries, then every candidate."""
        return list(queries) + [text for row in texts for text in row]

    def work_tokens(self, inputs, options) -> int:
        """One row per query and per candidate, cut to `max_length`."""
        return sum(min(self.max_length, n + 2) for n in self.token_counts(self._rows(inputs["queries"], inputs["texts"])))

    def least_work_tokens(self, inputs, options) -> int:
        return sum(min(self.max_length, word_count(text) + 2) for text in self._rows(inputs["queries"], inputs["texts"]))

    def __call__(self, queries: Sequence[str], texts: Sequence[Sequence[str]], *, batch_size: int = 32,
                 top_k: int | None = None) -> list[list[dict]]:
        return Pipeline.__call__(self, queries, texts, batch_size=batch_size, top_k=top_k)


EmbedPipeline.companions = (SimilarityPipeline,)

__all__ = ["EmbedPipeline", "SimilarityPipeline"]
