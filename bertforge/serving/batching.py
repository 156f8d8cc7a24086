"""Micro-batching for the server: requests that arrive close together share one pipeline call.

A request's inputs join a queue; one collector takes whatever compatible requests (same pipeline and
options) arrive within `max_wait_ms` of the first, up to `max_batch_size` inputs, and runs them as one
pipeline call on the single model thread, so the event loop never runs the model.

Which waiting request goes first: the cheapest by order of magnitude (the characters of its inputs,
in powers of two), the oldest among equals; large requests of one size keep their order. A call
already on the model thread lets a cheaper request in too: between two of its forward batches (each
at most `max_batch_tokens` padded tokens) the model thread runs the cheapest waiting request, alone,
if it is cheaper by a power of two. So a short request waits for one forward batch, not for the
large requests queued before it nor for the whole of a large call.

Admission (`admission`): a request whose work (in model tokens), with the work of the waiting
requests that would run before it, exceeds `max_queued_tokens` is refused with 429 and a
`Retry-After` from the measured rate, before it is queued.

Shutdown (`drain`, called when the server stops taking connections): every waiting request is
answered 503 with a `Retry-After` at once and dropped; the call on the model thread goes on until
shortly before the graceful timeout, then its requests are answered 503 too and the call ends at its
next forward batch. A request whose client was answered or went away is never computed: it is taken
out when a batch is formed, and a call all of whose requests are answered stops between two forward
batches.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .admission import (DEFAULT_TOKENS_PER_SECOND, SHUTDOWN_RETRY_AFTER_S, least_work_tokens, retry_after,
                        work_tokens)
from .pipelines import Pipeline, PipelineInputError
from .server_metrics import Metrics
from .server_settings import ApiError, ServerSettings

logger = logging.getLogger("bertforge.serve")

# ---------------------------------------------------------------------------- micro-batching

# A request of at most these characters has its tokens counted on the event loop (well under a
# millisecond); a larger one on the admission thread, so that the loop keeps serving meanwhile.
INLINE_COUNT_CHARACTERS = 4096


@dataclass
class _Job:
    task: str
    key: tuple  # requests with equal keys may share a forward pass
    inputs: dict[str, list[str]]  # request_inputs and optional inputs present
    options: dict[str, Any]
    size: int
    future: asyncio.Future = field(repr=False)
    cost: int = 0  # characters of its inputs: how much work it brings, roughly
    order: int = 0  # arrival
    tokens: int = 0  # model tokens it will run (`admission.work_tokens`)
    waiting: bool = True  # queued, not yet taken into a call (its tokens count as queued work)
    budget: int = 0  # tokens that jobs admitted later may still put before it (cheaper ones overtake it)

    @property
    def priority(self) -> tuple[int, int]:
        """Cheaper by a power of two first; then first come, first served."""
        return self.cost.bit_length(), self.order


def _characters(value: Any) -> int:
    return len(value) if isinstance(value, str) else sum(_characters(v) for v in value)


def _freeze(value: Any) -> Any:
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


class _Abandoned(Exception):
    """Raised on the model thread between two forward batches of a call whose requests were all
    answered already (shutdown, or clients gone): the rest of the call is not computed."""


def _shutting_down(reason: str) -> ApiError:
    return ApiError(503, reason, headers={"Retry-After": str(SHUTDOWN_RETRY_AFTER_S)})


def _deliver(job: _Job, result: Any) -> None:
    """A job's result (or exception) to its waiting request, unless the client went away."""
    if job.future.done():
        return
    if isinstance(result, Exception):
        job.future.set_exception(result)
    else:
        job.future.set_result(result)


class MicroBatcher:
    """Groups compatible requests that arrive close together into one pipeline call on one thread."""

    def __init__(self, pipelines: dict[str, Pipeline], settings: ServerSettings, metrics: Metrics):
        self.pipelines, self.settings, self.metrics = pipelines, settings, metrics
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertforge-model")
        self.queue: asyncio.Queue[_Job] | None = None
        self.task: asyncio.Task | None = None
        self.pending: collections.deque[_Job] = collections.deque()
        self._busy = False  # a batch is on the model thread
        self._arrivals = itertools.count()
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._inline = False  # the model thread is running a request between two batches of another
        # Counting a request's tokens runs the tokenizer: on its own thread, off the event loop.
        self.admission = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertforge-admission")
        self.waiting_tokens: collections.Counter[int] = collections.Counter()  # size class -> queued tokens
        self.waiting: dict[int, _Job] = {}  # arrival -> job, of the jobs admitted and not yet taken
        self.tokens_per_second = DEFAULT_TOKENS_PER_SECOND  # measured on the calls run, for Retry-After
        self.draining = False  # shutting down: nothing more is taken
        self.running: list[_Job] = []  # the jobs of the call on the model thread
        self._abandon_timer: asyncio.TimerHandle | None = None
        self._inline_job: _Job | None = None  # the job the model thread runs between two batches of another

    async def start(self) -> None:
        self._event_loop = asyncio.get_running_loop()
        self.queue = asyncio.Queue()
        self.task = asyncio.create_task(self._loop(), name="bertforge-batcher")

    def drain(self, timeout: float | None) -> None:
        """Shutdown begins (on the event loop): answer every waiting job 503 and drop it, take no
        more, and answer the running call's jobs 503 `timeout` seconds from now less a margin (so
        before the server gives up on its connections), which ends that call at its next forward
        batch. `timeout` None: the running call may take as long as it takes."""
        if self.draining:
            return
        self.draining = True
        if self.queue is not None:
            self._collect()
        refused = _shutting_down("the server is shutting down: the request was not started")
        for job in self.pending:
            self._leave(job)
            _deliver(job, refused)
        if self.pending:
            logger.info("shutting down: %d queued request(s) answered 503", len(self.pending))
        self.pending.clear()
        if timeout is not None and self._event_loop is not None:
            margin = min(1.0, timeout / 4)
            self._abandon_timer = self._event_loop.call_later(max(0.0, timeout - margin), self.abandon_running)

    def abandon_running(self) -> None:
        """Answer the jobs of the running call 503: the call stops at its next forward batch."""
        inline = self._inline_job
        late = [job for job in (*self.running, *([inline] if inline else [])) if not job.future.done()]
        for job in late:
            _deliver(job, _shutting_down("the server is shutting down: the request did not finish within "
                                         "the graceful timeout"))
        if late:
            logger.info("shutting down: %d running request(s) answered 503 at the graceful timeout", len(late))

    async def stop(self) -> None:
        """Drain (if the server did not already), end the running call within one forward batch,
        then stop the collector, the model thread and the admission thread."""
        self.drain(None)
        self.abandon_running()
        if self._abandon_timer is not None:
            self._abandon_timer.cancel()
        if self.task is not None:
            while self._busy:  # the call ends at its next forward batch: every job of it is answered
                await asyncio.sleep(0.01)
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        self.executor.shutdown(wait=True)
        self.admission.shutdown(wait=True)

    def queued_before(self, size_class: int) -> int:
        """Tokens of the waiting jobs that the batcher would take before a new one of `size_class`."""
        return sum(tokens for cls, tokens in self.waiting_tokens.items() if cls <= size_class)

    def _refusal(self, size_class: int, own: int, at_least: bool = False) -> ApiError | None:
        """The 429 (with Retry-After) for a new job of `size_class` and `own` tokens (`at_least`: a
        lower bound), or None to admit it. Refused when the work queued before it plus its own exceeds
        `max_queued_tokens` (a job with nothing queued before it is always admitted), or when it is
        larger than one forward batch (`max_batch_tokens`) and would overtake a waiting job of a
        larger size class by more than that job's budget: so the work run before any admitted job
        stays within the bound, cheaper jobs admitted after it included (a job of one forward batch
        or less overtakes freely: a short request is not refused because large ones wait)."""
        bound = self.settings.max_queued_tokens
        if not bound:
            return None
        mine = f"at least {own}" if at_least else str(own)
        ahead = self.queued_before(size_class)
        if ahead and ahead + own > bound:
            return self._busy_error(ahead + own - bound, f"{ahead} tokens of work are queued before this "
                                                         f"request's {mine}, over the bound of {bound}")
        if own > self.settings.max_batch_tokens:
            for other in self.waiting.values():
                if other.priority[0] > size_class and other.budget < own:
                    return self._busy_error(self.queued_before(other.priority[0]),
                                            f"this request's {mine} tokens would run before a waiting request "
                                            f"that may wait for {other.budget} more, within the bound of {bound}")
        return None

    def _admit(self, job: _Job) -> None:
        """Queue `job`'s work (`_refusal` says when not: ApiError 429), and take it from the budget of
        the waiting jobs it will overtake."""
        size_class = job.priority[0]
        refusal = self._refusal(size_class, job.tokens)
        if refusal is not None:
            raise refusal
        bound = self.settings.max_queued_tokens
        if bound:
            job.budget = max(0, bound - job.tokens - self.queued_before(size_class))
            if job.tokens > self.settings.max_batch_tokens:
                for other in self.waiting.values():
                    if other.priority[0] > size_class:
                        other.budget -= job.tokens
        self.waiting[job.order] = job
        self.waiting_tokens[size_class] += job.tokens

    def _busy_error(self, excess: int, reason: str) -> ApiError:
        """The 429: `reason`, and Retry-After the seconds for `excess` tokens to run at the measured rate."""
        wait = retry_after(excess, self.tokens_per_second)
        return ApiError(429, f"the server is busy: {reason} (max_queued_tokens); retry in {wait} s",
                        headers={"Retry-After": str(wait)})

    def _leave(self, job: _Job) -> None:
        """`job` no longer waits (taken into a call, answered or dropped): its tokens leave the queued work."""
        if job.waiting:
            job.waiting = False
            self.waiting_tokens[job.priority[0]] -= job.tokens
            self.waiting.pop(job.order, None)

    async def submit(self, task: str, inputs: dict[str, list[str]], options: dict[str, Any]) -> Any:
        """The request's results once its call has run; ApiError 429 (queue over its bound) or 503
        (shutting down) instead, with Retry-After."""
        if self.draining:
            raise _shutting_down("the server is shutting down")
        pipe = self.pipelines[task]
        size = len(inputs[pipe.request_inputs[0]])
        key = (task, tuple(sorted(inputs)), tuple(sorted((k, _freeze(v)) for k, v in options.items())))
        loop = asyncio.get_running_loop()
        cost = sum(_characters(value) for value in inputs.values())
        size_class = cost.bit_length()
        if self.settings.max_queued_tokens and self.waiting:  # refused on a lower bound of its work: not tokenized
            refusal = self._refusal(size_class, least_work_tokens(pipe, inputs, options), at_least=True)
            if refusal is not None:
                raise refusal
        try:
            if cost <= INLINE_COUNT_CHARACTERS:  # a small request is counted at once, not behind large ones
                tokens = work_tokens(pipe, inputs, options)
            else:
                tokens = await loop.run_in_executor(self.admission, work_tokens, pipe, inputs, options)
        except Exception:  # noqa: BLE001 - inputs the pipeline will refuse itself: counted at their most
            tokens = size * pipe.max_length
        if self.draining:
            raise _shutting_down("the server is shutting down")
        future = loop.create_future()
        job = _Job(task, key, inputs, options, size, future, cost, next(self._arrivals), tokens)
        self._admit(job)
        self.queue.put_nowait(job)
        try:
            return await future
        except asyncio.CancelledError:  # the request's task was cancelled: the job is dropped, not computed
            self._leave(job)
            future.cancel()
            raise

    def _collect(self) -> None:
        """Every job waiting in the queue joins `pending`, where the cheapest is picked; jobs
        already answered (their client went away) are dropped."""
        while True:
            try:
                job = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                break
            self.pending.append(job)
        if any(job.future.done() for job in self.pending):
            for job in [job for job in self.pending if job.future.done()]:
                self._leave(job)
                self.pending.remove(job)

    async def _take_cheaper(self, priority: tuple[int, int]) -> _Job | None:
        """The cheapest waiting job if it is cheaper than `priority` by a power of two, taken off the queue."""
        if self.draining:
            return None
        self._collect()
        if not self.pending:
            return None
        job = min(self.pending, key=lambda waiting: waiting.priority)
        if job.priority[0] >= priority[0]:
            return None
        self.pending.remove(job)
        self._leave(job)
        return job

    def _settle(self, job: _Job, result: Any, seconds: float) -> None:
        """On the event loop: a job run between the batches of another gets its result."""
        self.metrics.forward_seconds.observe(seconds)
        self.metrics.batch_size.observe(job.size)
        _deliver(job, result)

    def _run_cheaper(self, priority: tuple[int, int]) -> None:
        """On the model thread, between two forward batches of a call of `priority`: run the
        cheapest waiting job first if it is cheaper by a power of two (one per gap, never nested)."""
        job = asyncio.run_coroutine_threadsafe(self._take_cheaper(priority), self._event_loop).result()
        if job is None:
            return
        start = time.perf_counter()
        self._inline, self._inline_job = True, job
        try:
            result = self._run_batch([job])[0]
        except Exception as error:  # noqa: BLE001 - handed to the request
            result = error
        finally:
            self._inline, self._inline_job = False, None
        self._event_loop.call_soon_threadsafe(self._settle, job, result, time.perf_counter() - start)

    def _start(self, batch: list[_Job]) -> list[_Job]:
        """The jobs of `batch` still to compute, taken off the queued work; none when shutting down
        (they are answered 503)."""
        for job in batch:
            self._leave(job)
        if self.draining:
            for job in batch:
                _deliver(job, _shutting_down("the server is shutting down: the request was not started"))
            return []
        return [job for job in batch if not job.future.done()]

    async def _next_batch(self) -> list[_Job]:
        self._collect()
        if not self.pending:
            self.pending.append(await self.queue.get())
        first = min(self.pending, key=lambda job: job.priority)
        self.pending.remove(first)
        batch, size = [first], first.size
        if not self.settings.micro_batching:
            return batch
        limit = self.settings.max_batch_size
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.max_wait_ms / 1000
        # Compatible jobs deferred earlier come first; then whatever arrives before the deadline.
        for job in list(self.pending):
            if size >= limit:
                break
            if job.key == first.key and size + job.size <= limit:
                self.pending.remove(job)
                batch.append(job)
                size += job.size
        while size < limit:
            try:
                job = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self.queue.get(), timeout)
                except asyncio.TimeoutError:
                    break
            if job.key == first.key and size + job.size <= limit:
                batch.append(job)
                size += job.size
            else:
                self.pending.append(job)
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = self._start(await self._next_batch())
            if not batch:
                continue
            self._busy = True
            self.running = batch
            try:
                start = time.perf_counter()
                try:
                    results = await loop.run_in_executor(self.executor, self._run_batch, batch)
                except _Abandoned:  # every job of the call was answered already
                    results = [None] * len(batch)
                except PipelineInputError:
                    # One request's input broke the shared call (e.g. a [MASK] truncated away):
                    # run each alone so that only that request fails.
                    results = []
                    for job in batch:
                        if job.future.done() or self.draining:
                            results.append(_shutting_down("the server is shutting down: the request was not "
                                                          "started"))
                            continue
                        try:
                            results.append(await loop.run_in_executor(self.executor, self._run_batch, [job]))
                        except Exception as error:  # noqa: BLE001 - handed to the request
                            results.append(error)
                    results = [r if isinstance(r, Exception) else r[0] for r in results]
                except Exception as error:  # noqa: BLE001 - every request of the batch gets it
                    logger.exception("pipeline %s failed", batch[0].task)
                    results = [error] * len(batch)
                seconds = time.perf_counter() - start
                self.metrics.forward_seconds.observe(seconds)
                self.metrics.batch_size.observe(sum(job.size for job in batch))
                tokens = sum(job.tokens for job in batch)
                if tokens and seconds > 0 and not any(isinstance(r, Exception) for r in results):
                    self.tokens_per_second = 0.8 * self.tokens_per_second + 0.2 * tokens / seconds
                for job, result in zip(batch, results):
                    _deliver(job, result)
            finally:
                self._busy = False
                self.running = []

    def _between_batches(self, batch: list[_Job], priority: tuple[int, int]) -> None:
        """On the model thread, between two forward batches of the call of `batch`: end the call when
        every job of it is answered already (_Abandoned); else let a cheaper waiting job run (not
        from a job run inline: never nested)."""
        if all(job.future.done() for job in batch):
            raise _Abandoned()
        if not self._inline and not self.draining:
            self._run_cheaper(priority)

    def _run_batch(self, batch: list[_Job]) -> list[Any]:
        """On the model thread: one pipeline call over the concatenated inputs, split back per job."""
        first = batch[0]
        pipe = self.pipelines[first.task]
        merged = {name: [text for job in batch for text in job.inputs[name]] for name in first.inputs}
        positional = [merged.pop(name) for name in pipe.request_inputs]
        previous = pipe.between_batches  # a job run inline may use the pipeline of the call it interrupts
        pipe.between_batches = functools.partial(self._between_batches, batch, first.priority)
        try:
            results = pipe(*positional, batch_size=self.settings.max_batch_size, **merged, **first.options)
        finally:
            pipe.between_batches = previous
        out, start = [], 0
        for job in batch:
            part = results[start:start + job.size]
            out.append(part.tolist() if isinstance(part, np.ndarray) else part)
            start += job.size
        return out


__all__ = ["MicroBatcher"]
