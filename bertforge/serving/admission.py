"""Admission control for the server: a request's work in model tokens, and the bound on queued work.

The micro-batcher's queue is otherwise bounded only by the connection cap, so under a load beyond
what the model serves, large requests wait minutes and clients time out without an answer. The
server instead measures each request's work before queueing it (`work_tokens`: the tokens of the
model rows it will run, counted with the pipeline's tokenizer) and refuses one with 429 and a
`Retry-After` when the work that would run before it, plus its own, exceeds `max_queued_tokens`
(`bertforge serve --max-queued-tokens`). The work "before it" follows the batcher's order: waiting
requests of the same or a cheaper size class (the batcher takes the cheapest first), so a small
request is not refused because large ones are queued; it does not wait for them either. Since cheaper
requests overtake, each waiting request keeps a budget (the bound less its own work and the work
before it), and a request larger than one forward batch that would overtake it by more is refused too.

A request alone in the queue is always admitted (its own size is bounded by the per-request limits),
so an admitted request starts after at most `max_queued_tokens` of queued work and the call already
running. `DEFAULT_MAX_QUEUED_TOKENS` is one request at the default limits (256 rows of 512 tokens);
the wait it means scales with the model's throughput (BENCHMARKS.md, the server's at-limits load), so
Retry-After uses the rate measured on the calls the server ran, not an assumed one.
"""

from __future__ import annotations

import math
from typing import Any

from ..tasks.windows import windows
from .pipelines import Pipeline

# One at-limit request (256 rows of 512 tokens).
DEFAULT_MAX_QUEUED_TOKENS = 131_072
# What the batcher assumes before it has measured its own rate (tokens/s), for Retry-After.
DEFAULT_TOKENS_PER_SECOND = 5_600.0
# Retry-After of a request refused because the server is shutting down: long enough for a restart.
SHUTDOWN_RETRY_AFTER_S = 5
MAX_RETRY_AFTER_S = 3600


def _token_counts(pipe: Pipeline, texts: list[str]) -> list[int]:
    """Word pieces of each text, no specials, not truncated."""
    rows = pipe.tokenizer.encode_batch(texts, padding=False, truncation=False)
    return [len(row["input_ids"]) - 2 for row in rows]  # less [CLS] and [SEP]


def _windowed(tokens: int, room: int, stride: int, overhead: int) -> int:
    """Tokens of the rows a text of `tokens` word pieces yields in windows of `room` at `stride`."""
    if room < 1 or stride < 1:
        return tokens + overhead
    return sum(end - start + overhead for start, end in windows(tokens, room, stride))


def work_tokens(pipe: Pipeline, inputs: dict[str, list], options: dict[str, Any]) -> int:
    """The model tokens a request will run (each row's length, specials included): its windows for
    tag and answer, one row per text (with its pair) cut to `max_length` for the others, one per
    context and ending for multiple choice. Runs the tokenizer: call it off the event loop."""
    length = pipe.max_length
    if pipe.task == "tag":
        stride = options.get("stride") or (length - 2) // 2
        return sum(_windowed(n, length - 2, stride, 2) for n in _token_counts(pipe, inputs["texts"]))
    if pipe.task == "answer":
        questions = [min(n, pipe.max_query_length) for n in _token_counts(pipe, inputs["questions"])]
        contexts = _token_counts(pipe, inputs["contexts"])
        stride = options.get("doc_stride", 128)
        return sum(_windowed(c, length - q - 3, stride, q + 3) for q, c in zip(questions, contexts))
    if pipe.nested_request_inputs:  # multiple choice: a row per (context, ending)
        contexts = _token_counts(pipe, inputs["contexts"])
        starts = _token_counts(pipe, inputs["starts"]) if "starts" in inputs else [0] * len(contexts)
        total = 0
        for context, start, endings in zip(contexts, starts, inputs["endings"]):
            total += sum(min(length, context + start + ending + 3) for ending in _token_counts(pipe, endings))
        return total
    first = _token_counts(pipe, inputs[pipe.request_inputs[0]])
    pairs = _token_counts(pipe, inputs["text_pairs"]) if "text_pairs" in inputs else None
    if pairs is None:
        return sum(min(length, n + 2) for n in first)
    return sum(min(length, n + p + 3) for n, p in zip(first, pairs))


def least_work_tokens(pipe: Pipeline, inputs: dict[str, list], options: dict[str, Any]) -> int:
    """A lower bound of `work_tokens` without the tokenizer (a split on whitespace: fast enough for
    the event loop), so that a request the bound refuses whatever its exact count is refused without
    tokenizing it: each whitespace-separated word is at least one token (a word made only of
    characters the tokenizer drops counts one too, so such a request may be refused a little early),
    windows cover every token of a text (tag) or context (answer), other rows are cut to `max_length`."""
    length = pipe.max_length

    def words(text: str) -> int:
        return len(text.split())

    if pipe.task == "tag":
        return sum(words(text) + 2 for text in inputs["texts"])
    if pipe.task == "answer":
        return sum(words(context) + 3 for context in inputs["contexts"])
    if pipe.nested_request_inputs:  # multiple choice: a row per (context, ending)
        return sum(min(length, words(context) + words(ending) + 3)
                   for context, endings in zip(inputs["contexts"], inputs["endings"]) for ending in endings)
    pairs = inputs.get("text_pairs")
    return sum(min(length, words(text) + (words(pairs[i]) + 3 if pairs else 2))
               for i, text in enumerate(inputs[pipe.request_inputs[0]]))


def retry_after(tokens: float, tokens_per_second: float) -> int:
    """Whole seconds (1 to MAX_RETRY_AFTER_S) for `tokens` of queued work to run at the measured rate."""
    seconds = math.ceil(tokens / max(tokens_per_second, 1.0))
    return max(1, min(MAX_RETRY_AFTER_S, seconds))


__all__ = ["DEFAULT_MAX_QUEUED_TOKENS", "DEFAULT_TOKENS_PER_SECOND", "SHUTDOWN_RETRY_AFTER_S", "least_work_tokens",
           "retry_after", "work_tokens"]
