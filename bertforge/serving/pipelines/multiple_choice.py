"""The `multiple-choice` pipeline: which ending completes a context (SWAG, §4.4), with probabilities.

Each (context, ending) pair is one model row, `[CLS] context [SEP] start ending [SEP]` as in
fine-tuning (`bertforge.tasks.multiple_choice.convert_examples_to_features`, so truncation and segments
match what the model was trained on); the head scores every row and the K scores of an input are
turned into probabilities with a softmax over its endings. Rows of different inputs share batches,
so inputs may have different numbers of endings.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from ...modeling import BertForMultipleChoice
from ...tasks.arrays import softmax
from ...tasks.multiple_choice import ChoiceExample, convert_examples_to_features
from ..graphs import ChoiceGraph
from ..registry import register_pipeline
from .base import Feature, Pipeline, PipelineInputError, check_texts, word_count


@register_pipeline("multiple-choice")
class MultipleChoicePipeline(Pipeline):
    """The most likely ending for each context.

    `pipe(contexts, endings, starts=None)` -> for each input `{"label": k, "ending": endings[i][k],
    "score": P(k), "scores": [P(0), ..., P(K-1)]}`: `endings[i]` is the list of candidate endings of
    `contexts[i]` (at least two); `starts[i]` (optional, SWAG's `sent2`) begins the second segment,
    each ending following it after a space. With `limits` (the server's), the endings of a
    call, one model row each, number at most `limits.max_rows`.
    """

    model_class = BertForMultipleChoice
    output_names = ("logits",)
    output_axes = {"logits": {0: "batch"}}
    request_inputs = ("contexts", "endings")
    optional_request_inputs = ("starts",)
    nested_request_inputs = ("endings",)

    @classmethod
    def build_graph(cls, model):
        return ChoiceGraph(model)

    def check_inputs(self, inputs: tuple) -> tuple:
        if len(inputs) != 2:
            raise PipelineInputError("multiple-choice takes contexts and endings")
        contexts = check_texts(inputs[0], "contexts")
        endings = inputs[1]
        if isinstance(endings, str) or not isinstance(endings, Sequence):
            raise PipelineInputError("endings must be a list with one list of endings per context")
        if len(endings) != len(contexts):
            raise PipelineInputError(f"{len(contexts)} contexts but {len(endings)} lists of endings")
        # One model row per (context, ending): counted before any text is tokenized.
        self.check_rows(sum(len(row) if isinstance(row, (list, tuple)) else 1 for row in endings), "contexts x endings")
        self.check_tokens(contexts, "contexts")
        endings = [self.check_tokens(check_texts(row, f"endings[{i}]", allow_empty_list=False), f"endings[{i}]")
                   for i, row in enumerate(endings)]
        for i, row in enumerate(endings):
            if len(row) < 2:
                raise PipelineInputError(f"endings[{i}] has {len(row)} ending; a choice needs at least 2")
        return contexts, endings

    def preprocess(self, contexts, endings, starts=None):
        if starts is not None:
            starts = self.check_tokens(check_texts(starts, "starts"), "starts")
            if len(starts) != len(contexts):
                raise PipelineInputError(f"{len(contexts)} contexts but {len(starts)} starts")
        examples = [ChoiceExample(str(i), context, starts[i] if starts is not None else "", list(options))
                    for i, (context, options) in enumerate(zip(contexts, endings))]
        # convert_examples_to_features needs one K per call: group the inputs by their number of endings.
        features: list[Feature] = []
        for k in sorted({len(e.endings) for e in examples}):
            group = [(i, e) for i, e in enumerate(examples) if len(e.endings) == k]
            rows = convert_examples_to_features([e for _, e in group], self.tokenizer, self.max_length)
            for (i, _), row in zip(group, rows):
                for choice, (ids, types) in enumerate(zip(row["input_ids"], row["token_type_ids"])):
                    features.append(Feature(i, ids, types, info={"choice": choice}))
        return features

    def postprocess(self, inputs, features, outputs, starts=None):
        contexts, endings = inputs
        scores = [np.zeros(len(row), dtype=np.float32) for row in endings]
        for feature, output in zip(features, outputs):
            scores[feature.example][feature.info["choice"]] = output["logits"]
        results = []
        for options, logits in zip(endings, scores):
            probs = softmax(logits)
            best = int(probs.argmax())
            results.append({"label": best, "ending": options[best], "score": float(probs[best]),
                            "scores": [float(p) for p in probs]})
        return results

    def work_tokens(self, inputs, options) -> int:
        """One row per (context, ending): the context, the ending's start if given, the ending, three
        specials, cut to `max_length`."""
        contexts = self.token_counts(inputs["contexts"])
        starts = self.token_counts(inputs["starts"]) if inputs.get("starts") else [0] * len(contexts)
        return sum(min(self.max_length, context + start + ending + 3)
                   for context, start, endings in zip(contexts, starts, inputs["endings"])
                   for ending in self.token_counts(endings))

    def least_work_tokens(self, inputs, options) -> int:
        return sum(min(self.max_length, word_count(context) + word_count(ending) + 3)
                   for context, endings in zip(inputs["contexts"], inputs["endings"]) for ending in endings)

    def __call__(self, contexts: Sequence[str], endings: Sequence[Sequence[str]], *, batch_size: int = 32,
                 starts: Sequence[str] | None = None) -> list[dict]:
        return super().__call__(contexts, endings, batch_size=batch_size, starts=starts)


def predict_multiple_choice(model: str | os.PathLike, contexts: Sequence[str], endings: Sequence[Sequence[str]], *,
                            starts: Sequence[str] | None = None, batch_size: int = 32, dtype: str | None = None,
                            max_length: int | None = None, **kwargs: Any) -> list[dict]:
    """The chosen ending of each context for a fine-tuned multiple-choice checkpoint (for
    `bertforge predict --question`-style use): `MultipleChoicePipeline`'s results, see there."""
    pipe = MultipleChoicePipeline(model, dtype=dtype, max_length=max_length, **kwargs)
    return pipe(contexts, endings, batch_size=batch_size, starts=starts)


__all__ = ["MultipleChoicePipeline", "predict_multiple_choice"]
