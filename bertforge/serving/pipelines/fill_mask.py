"""The `fill-mask` pipeline: the most likely tokens for each [MASK] (BERT's masked-LM head)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...modeling import BertForMaskedLM
from ...tasks.arrays import softmax
from ..graphs import FillMaskGraph
from ..registry import register_pipeline
from .base import MASK_TOKEN, Feature, Pipeline, PipelineInputError


@register_pipeline("fill-mask")
class FillMaskPipeline(Pipeline):
    """The `top_k` most likely tokens for each [MASK] of each text.

    `pipe(texts, top_k=5)` -> for each text, a list with one entry per [MASK] (in text order), each
    a list of `{"token", "token_id", "score", "sequence"}` (most likely first); `sequence` is the
    text with its [MASK] replaced by the token, given for a text with one [MASK] only (as Hugging
    Face's fill-mask pipeline does for one mask): repeating a text with many masks in every
    candidate would make the answer grow with masks^2 x top_k, so a text with several [MASK]s gets
    `{"token", "token_id", "score"}` per candidate. `top_k` is at most the vocabulary size and,
    with `limits` (the server's), `limits.max_top_k`; [MASK]s x top_k over the texts at most
    `limits.max_predictions`.
    """

    model_class = BertForMaskedLM
    extra_input_names = ("masked_positions",)
    output_names = ("logits",)
    output_axes = {"logits": {0: "batch", 1: "masks"}}
    request_options = {"top_k": (int,)}

    @classmethod
    def build_graph(cls, model):
        return FillMaskGraph(model)

    def check_options(self, top_k: int = 5, **_) -> None:
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise PipelineInputError(f"top_k must be a positive integer, got {top_k!r}")
        if self.limits is None:  # a library pipeline: the vocabulary is the only bound
            if top_k > len(self.tokenizer):
                raise PipelineInputError(f"top_k {top_k} is over the vocabulary's {len(self.tokenizer)} tokens")
            return
        limit = min(self.limits.max_top_k, len(self.tokenizer))
        if top_k > limit:
            raise PipelineInputError(f"top_k {top_k} is over the limit of {limit} (max_top_k "
                                     f"{self.limits.max_top_k}, vocabulary {len(self.tokenizer)} tokens)")

    def preprocess(self, texts, top_k: int = 5):
        for i, text in enumerate(texts):
            if MASK_TOKEN not in text:
                raise PipelineInputError(f"texts[{i}] has no {MASK_TOKEN} token")
        rows = self.tokenizer.encode_batch(texts, max_length=self.max_length, padding=False, return_offsets=True)
        features = []
        mask_id = self.tokenizer.mask_token_id
        for i, row in enumerate(rows):
            positions = [p for p, token in enumerate(row["input_ids"]) if token == mask_id]
            if not positions:
                raise PipelineInputError(f"texts[{i}]: every {MASK_TOKEN} lies beyond max_length={self.max_length} "
                                         "tokens")
            features.append(Feature(i, row["input_ids"], row["token_type_ids"], {"masked_positions": positions},
                                    {"spans": [row["offsets"][p] for p in positions]}))
        predictions = top_k * sum(len(f.extra_inputs["masked_positions"]) for f in features)
        if self.limits is not None and predictions > self.limits.max_predictions:
            raise PipelineInputError(f"the texts' [MASK]s x top_k make {predictions} predictions, over the limit "
                                     f"of {self.limits.max_predictions} per call (max_predictions)")
        return features

    def postprocess(self, inputs, features, outputs, top_k: int = 5):
        texts = inputs[0]
        results = []
        for feature, output in zip(features, outputs):
            text = texts[feature.example]
            probs = softmax(output["logits"][:len(feature.info["spans"])])
            k = min(top_k, probs.shape[-1])
            single = len(feature.info["spans"]) == 1
            per_mask = []
            for (start, end), p in zip(feature.info["spans"], probs):
                best = np.argpartition(-p, k - 1)[:k]
                best = best[np.argsort(-p[best], kind="stable")]
                candidates = []
                for token_id in best.tolist():
                    token = self.tokenizer.ids_to_tokens[token_id]
                    word = token[2:] if token.startswith("##") else token
                    candidate = {"token": token, "token_id": token_id, "score": float(p[token_id])}
                    if single:
                        candidate["sequence"] = text[:start] + word + text[end:]
                    candidates.append(candidate)
                per_mask.append(candidates)
            results.append(per_mask)
        return results

    def __call__(self, texts: Sequence[str], *, batch_size: int = 32, top_k: int = 5) -> list[list[list[dict]]]:
        return super().__call__(texts, batch_size=batch_size, top_k=top_k)


__all__ = ["FillMaskPipeline"]
