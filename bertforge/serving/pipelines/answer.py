"""The `answer` pipeline: extractive question answering (SQuAD v1.1 / v2.0)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ...modeling import BertForQuestionAnswering
from ...tasks.arrays import softmax
from ...tasks.windows import max_context_window
from ..graphs import SpanGraph
from ..registry import register_pipeline
from .base import Feature, Pipeline, PipelineInputError, windowed_tokens, windows, word_count

DOC_STRIDE = 128  # tokens between window starts when a context outgrows the input (Google's run_squad default)


@register_pipeline("answer")
class AnswerPipeline(Pipeline):
    """Extractive question answering (SQuAD): the best span of each context for its question.

    `pipe(questions, contexts, doc_stride=128, max_answer_length=30)` -> for each pair
    `{"answer", "score", "start", "end"}` with character offsets into the context. Contexts longer
    than the model's input run as windows `doc_stride` tokens apart (Google's run_squad), each
    candidate start scored only in its max-context window. With `handle_impossible_answer` (default:
    the checkpoint's `config.json` key `version_2_with_negative`, written for SQuAD 2.0 models) the
    answer is empty (`start`/`end` None) when the [CLS] "no answer" score beats the best span by more
    than `null_threshold`. `score` is P(start) x P(end) of the chosen span (or of [CLS]).
    With `limits` (the server's), `doc_stride` is at least `limits.min_stride_fraction` of `max_length`,
    and the windows of a call at most `limits.max_rows`.
    """

    model_class = BertForQuestionAnswering
    output_names = ("start_logits", "end_logits")
    output_axes = {"start_logits": {0: "batch", 1: "sequence"}, "end_logits": {0: "batch", 1: "sequence"}}
    request_inputs = ("questions", "contexts")
    request_options = {"doc_stride": (int,), "max_answer_length": (int,), "handle_impossible_answer": (bool,),
                       "null_threshold": (int, float)}
    n_best = 20
    max_query_length = 64

    @classmethod
    def build_graph(cls, model):
        return SpanGraph(model)

    def check_options(self, doc_stride=DOC_STRIDE, max_answer_length=30, **_) -> None:
        if not isinstance(max_answer_length, int) or isinstance(max_answer_length, bool) or max_answer_length < 1:
            raise PipelineInputError(f"max_answer_length must be a positive integer, got {max_answer_length!r}")
        self.check_stride("doc_stride", doc_stride)

    def preprocess(self, questions, contexts, doc_stride=DOC_STRIDE, max_answer_length=30,
                   handle_impossible_answer=None, null_threshold=0.0):
        if len(questions) != len(contexts):
            raise PipelineInputError(f"{len(questions)} questions but {len(contexts)} contexts")
        question_rows = self.tokenizer.encode_batch(questions, max_length=self.max_query_length + 2, padding=False)
        context_rows = self.tokenizer.encode_batch(contexts, max_length=self.max_length, truncation=False,
                                                   padding=False, return_offsets=True)
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        spans_of = [windows(len(c["input_ids"]) - 2, self.max_length - (len(q["input_ids"]) - 2) - 3, doc_stride)
                    for q, c in zip(question_rows, context_rows)]
        self.check_rows(sum(map(len, spans_of)), "contexts x windows")
        features = []
        for i, (q, c, spans) in enumerate(zip(question_rows, context_rows, spans_of)):
            question = q["input_ids"][1:-1]
            ids, offsets = c["input_ids"][1:-1], c["offsets"][1:-1]
            for w, (start, end) in enumerate(spans):
                input_ids = [cls, *question, sep, *ids[start:end], sep]
                token_types = [0] * (len(question) + 2) + [1] * (end - start + 1)
                features.append(Feature(i, input_ids, token_types, info={
                    "offsets": offsets, "spans": spans, "window": w, "context_start": len(question) + 2}))
        return features

    def postprocess(self, inputs, features, outputs, doc_stride=DOC_STRIDE, max_answer_length=30,
                    handle_impossible_answer=None, null_threshold=0.0):
        if handle_impossible_answer is None:
            handle_impossible_answer = bool(self.config.extra.get("version_2_with_negative", False))
        per_example: dict[int, list] = {}
        for feature, output in zip(features, outputs):
            per_example.setdefault(feature.example, []).append((feature, output))
        results = []
        for i, context in enumerate(inputs[1]):
            best = None  # (logit sum, probability, start char, end char)
            null = None  # (logit sum, probability): the lowest over windows, as Google's run_squad
            for feature, output in per_example.get(i, []):
                info = feature.info
                start_window, end_window = info["spans"][info["window"]]
                offset = info["context_start"]
                length = end_window - start_window
                # Softmax over [CLS] and this window's context tokens (not the question).
                valid = np.r_[0, offset:offset + length]
                start_logits, end_logits = output["start_logits"], output["end_logits"]
                p_start = np.zeros_like(start_logits)
                p_end = np.zeros_like(end_logits)
                p_start[valid] = softmax(start_logits[valid])
                p_end[valid] = softmax(end_logits[valid])
                null_logit = float(start_logits[0] + end_logits[0])
                if null is None or null_logit < null[0]:
                    null = (null_logit, float(p_start[0] * p_end[0]))
                context_positions = np.arange(offset, offset + length)
                top_starts = context_positions[np.argsort(-start_logits[context_positions], kind="stable")[:self.n_best]]
                top_ends = context_positions[np.argsort(-end_logits[context_positions], kind="stable")[:self.n_best]]
                for s in top_starts.tolist():
                    token = start_window + s - offset  # index into the whole context's tokens
                    if max_context_window(token, info["spans"]) != info["window"]:
                        continue
                    for e in top_ends.tolist():
                        if e < s or e - s + 1 > max_answer_length:
                            continue
                        logit = float(start_logits[s] + end_logits[e])
                        if best is None or logit > best[0]:
                            best = (logit, float(p_start[s] * p_end[e]), info["offsets"][token][0],
                                    info["offsets"][start_window + e - offset][1])
            no_answer = {"answer": "", "score": null[1] if null else 0.0, "start": None, "end": None}
            if best is None or (handle_impossible_answer and null is not None
                                and null[0] - best[0] > null_threshold):
                results.append(no_answer)
            else:
                _, score, start, end = best
                results.append({"answer": context[start:end], "score": score, "start": start, "end": end})
        return results

    def work_tokens(self, inputs, options) -> int:
        """Each context's windows (`preprocess`'s), each row with its question (cut to
        `max_query_length`) and three specials."""
        questions = [min(n, self.max_query_length) for n in self.token_counts(inputs["questions"])]
        contexts = self.token_counts(inputs["contexts"])
        stride = options.get("doc_stride", DOC_STRIDE)
        return sum(windowed_tokens(c, self.max_length - q - 3, stride, q + 3) for q, c in zip(questions, contexts))

    def least_work_tokens(self, inputs, options) -> int:
        """Windows cover every token of a context: at least its words and one row's specials."""
        return sum(word_count(context) + 3 for context in inputs["contexts"])

    def __call__(self, questions: Sequence[str], contexts: Sequence[str], *, batch_size: int = 32,
                 doc_stride: int = DOC_STRIDE, max_answer_length: int = 30, handle_impossible_answer: bool | None = None,
                 null_threshold: float = 0.0) -> list[dict]:
        return super().__call__(questions, contexts, batch_size=batch_size, doc_stride=doc_stride,
                                max_answer_length=max_answer_length,
                                handle_impossible_answer=handle_impossible_answer, null_threshold=null_threshold)


__all__ = ["AnswerPipeline"]
