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

from .pipelines import Pipeline, PipelineInputError
from .server_metrics import Metrics
from .server_settings import ServerSettings

logger = logging.getLogger("bertforge.serve")

# ---------------------------------------------------------------------------- micro-batching


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

    @property
    def priority(self) -> tuple[int, int]:
        """Cheaper by a power of two first; then first come, first served."""
        return self.cost.bit_length(), self.order


def _characters(value: Any) -> int:
    return len(value) if isinstance(value, str) else sum(_characters(v) for v in value)


def _freeze(value: Any) -> Any:
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


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

    async def start(self) -> None:
        self._event_loop = asyncio.get_running_loop()
        self.queue = asyncio.Queue()
        self.task = asyncio.create_task(self._loop(), name="bertforge-batcher")

    async def stop(self) -> None:
        """Finish every queued job, then stop the collector and the model thread."""
        if self.task is not None:
            while self.queue.qsize() or self.pending or self._busy:
                await asyncio.sleep(0.01)
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        self.executor.shutdown(wait=True)

    async def submit(self, task: str, inputs: dict[str, list[str]], options: dict[str, Any]) -> Any:
        pipe = self.pipelines[task]
        size = len(inputs[pipe.request_inputs[0]])
        key = (task, tuple(sorted(inputs)), tuple(sorted((k, _freeze(v)) for k, v in options.items())))
        future = asyncio.get_running_loop().create_future()
        cost = sum(_characters(value) for value in inputs.values())
        await self.queue.put(_Job(task, key, inputs, options, size, future, cost, next(self._arrivals)))
        return await future

    def _collect(self) -> None:
        """Every job waiting in the queue joins `pending`, where the cheapest is picked."""
        while True:
            try:
                self.pending.append(self.queue.get_nowait())
            except asyncio.QueueEmpty:
                return

    async def _take_cheaper(self, priority: tuple[int, int]) -> _Job | None:
        """The cheapest waiting job if it is cheaper than `priority` by a power of two, taken off the queue."""
        self._collect()
        if not self.pending:
            return None
        job = min(self.pending, key=lambda waiting: waiting.priority)
        if job.priority[0] >= priority[0]:
            return None
        self.pending.remove(job)
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
        self._inline = True
        try:
            result = self._run_batch([job])[0]
        except Exception as error:  # noqa: BLE001 - handed to the request
            result = error
        finally:
            self._inline = False
        self._event_loop.call_soon_threadsafe(self._settle, job, result, time.perf_counter() - start)

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
            batch = await self._next_batch()
            self._busy = True
            try:
                start = time.perf_counter()
                try:
                    results = await loop.run_in_executor(self.executor, self._run_batch, batch)
                except PipelineInputError:
                    # One request's input broke the shared call (e.g. a [MASK] truncated away):
                    # run each alone so that only that request fails.
                    results = []
                    for job in batch:
                        try:
                            results.append(await loop.run_in_executor(self.executor, self._run_batch, [job]))
                        except Exception as error:  # noqa: BLE001 - handed to the request
                            results.append(error)
                    results = [r if isinstance(r, Exception) else r[0] for r in results]
                except Exception as error:  # noqa: BLE001 - every request of the batch gets it
                    logger.exception("pipeline %s failed", batch[0].task)
                    results = [error] * len(batch)
                self.metrics.forward_seconds.observe(time.perf_counter() - start)
                self.metrics.batch_size.observe(sum(job.size for job in batch))
                for job, result in zip(batch, results):
                    _deliver(job, result)
            finally:
                self._busy = False

    def _run_batch(self, batch: list[_Job]) -> list[Any]:
        """On the model thread: one pipeline call over the concatenated inputs, split back per job."""
        first = batch[0]
        pipe = self.pipelines[first.task]
        merged = {name: [text for job in batch for text in job.inputs[name]] for name in first.inputs}
        positional = [merged.pop(name) for name in pipe.request_inputs]
        previous = pipe.between_batches  # a job run inline may use the pipeline of the call it interrupts
        pipe.between_batches = None if self._inline else functools.partial(self._run_cheaper, first.priority)
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
