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
the wait it means scales with the model's throughput (docs/results/serve_load/README.md, "Server at its
limits"), so Retry-After uses the rate measured on the calls the server ran, not an assumed one.
"""

from __future__ import annotations

import math
from typing import Any

from .pipelines import Pipeline

# One at-limit request (256 rows of 512 tokens).
DEFAULT_MAX_QUEUED_TOKENS = 131_072
# What the batcher assumes before it has measured its own rate (tokens/s), for Retry-After.
DEFAULT_TOKENS_PER_SECOND = 5_600.0
# Retry-After of a request refused because the server is shutting down: long enough for a restart.
SHUTDOWN_RETRY_AFTER_S = 5
MAX_RETRY_AFTER_S = 3600


def work_tokens(pipe: Pipeline, inputs: dict[str, list], options: dict[str, Any]) -> int:
    """The model tokens a request will run (each row's length, specials included): the pipeline's own
    count (`Pipeline.work_tokens`: one row per text cut to `max_length`, windows for tag and answer, a
    row per choice for multiple choice). Runs the tokenizer: call it off the event loop."""
    return pipe.work_tokens(inputs, options)


def least_work_tokens(pipe: Pipeline, inputs: dict[str, list], options: dict[str, Any]) -> int:
    """A lower bound of `work_tokens` without the tokenizer (`Pipeline.least_work_tokens`: words, fast
    enough for the event loop), so that a request the bound refuses whatever its exact count is refused
    without tokenizing it."""
    return pipe.least_work_tokens(inputs, options)


def retry_after(tokens: float, tokens_per_second: float) -> int:
    """Whole seconds (1 to MAX_RETRY_AFTER_S) for `tokens` of queued work to run at the measured rate."""
    seconds = math.ceil(tokens / max(tokens_per_second, 1.0))
    return max(1, min(MAX_RETRY_AFTER_S, seconds))


__all__ = ["DEFAULT_MAX_QUEUED_TOKENS", "DEFAULT_TOKENS_PER_SECOND", "SHUTDOWN_RETRY_AFTER_S", "least_work_tokens",
           "retry_after", "work_tokens"]
