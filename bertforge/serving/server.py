"""The HTTP server: pipelines behind a JSON API with micro-batching, metrics, limits and a test page.

    bertforge serve --model runs/sst2/final --port 8000

Routes:
- `POST /v1/<pipeline>`: `{"texts": [...]}` (classify/embed also `"text_pairs"`; answer takes
  `"questions"` and `"contexts"`) plus the pipeline's options (`"top_k"`, `"pooling"`, ...) ->
  `{"pipeline": name, "results": [...]}`, one result per input.
- `GET /health`: status, model, backend and the pipelines served.
- `GET /metrics`: Prometheus text format: requests by pipeline and status code, request latency,
  texts per forward pass, forward-pass time, requests in flight, resident memory.
- `GET /`: a self-contained page to try the model (no external resources).

Micro-batching: a request's inputs join a queue; one collector takes whatever compatible requests
(same pipeline and options) arrive within `max_wait_ms` of the first, up to `max_batch_size` inputs,
and runs them as one pipeline call on the single model thread. The event loop never runs the model,
so it keeps accepting and validating requests meanwhile.

Errors: body over `max_body_bytes`, more than `max_texts` inputs or an input over `max_chars`
characters -> 413; a body that does not arrive whole within `body_timeout_s` -> 408 and the
connection is closed; JSON that cannot be used (unparsable, nested deeper than `MAX_JSON_DEPTH`, a
string holding a lone surrogate, which is not Unicode text) -> 400; a body of the wrong shape or
types, an empty text, an unknown option -> 422; all as `{"error": reason}`. No input gives a 500.
Shutdown (SIGINT/SIGTERM) stops accepting connections and finishes the requests in flight before
the process exits.

Needs the `serve` extra: `pip install 'bertforge[serve]'` (starlette, uvicorn).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import json
import logging
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Sequence

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..modeling.pretrained import resolve_model_dir
from .pipelines import PIPELINES, Pipeline, PipelineInputError, pipeline, resolve_task, task_for_checkpoint

logger = logging.getLogger("bertforge.serve")


@dataclass
class ServerSettings:
    """Batching and limits. `micro_batching=False` runs every request as its own forward pass."""

    max_batch_size: int = 32  # inputs per forward pass
    max_wait_ms: float = 5.0  # how long the first request of a batch waits for company
    micro_batching: bool = True
    max_body_bytes: int = 1 << 20
    max_texts: int = 64  # inputs per request
    max_chars: int = 10_000  # characters per input text
    body_timeout_s: float = 10.0  # to receive a request's whole body, however it trickles in
    model: str = ""
    backend: str = "torch"
    dtype: str = "fp32"


class ApiError(Exception):
    """A request the server refuses: `status` and the one-line `reason` the client gets. `close`: end
    the connection after answering (its body was not read to the end)."""

    def __init__(self, status: int, reason: str, close: bool = False):
        super().__init__(reason)
        self.status, self.reason, self.close = status, reason, close


# ---------------------------------------------------------------------------- metrics


class Histogram:
    def __init__(self, buckets: Sequence[float]):
        self.buckets = list(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last: above every bucket (+Inf only)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, name: str, labels: str = "") -> list[str]:
        lines, cumulative = [], 0
        prefix = labels + "," if labels else ""
        for bound, count in zip(self.buckets, self.counts):
            cumulative += count
            lines.append(f'{name}_bucket{{{prefix}le="{bound:g}"}} {cumulative}')
        lines.append(f'{name}_bucket{{{prefix}le="+Inf"}} {self.count}')
        suffix = f"{{{labels}}}" if labels else ""
        lines += [f"{name}_sum{suffix} {self.sum:.6f}", f"{name}_count{suffix} {self.count}"]
        return lines


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def resident_memory_bytes() -> int | None:
    """This process's resident set size, from /proc (Linux); None elsewhere."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class Metrics:
    """Counters and histograms, updated on the event loop only (so without locks)."""

    def __init__(self) -> None:
        self.requests: collections.Counter[tuple[str, int]] = collections.Counter()
        self.latency: dict[str, Histogram] = {}
        self.batch_size = Histogram(BATCH_BUCKETS)
        self.forward_seconds = Histogram(LATENCY_BUCKETS)
        self.in_flight = 0

    def record_request(self, route: str, status: int, seconds: float) -> None:
        self.requests[(route, status)] += 1
        self.latency.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def render(self) -> str:
        lines = ["# HELP bertforge_requests_total HTTP requests by route and status code.",
                 "# TYPE bertforge_requests_total counter"]
        for (route, status), count in sorted(self.requests.items()):
            lines.append(f'bertforge_requests_total{{route="{route}",code="{status}"}} {count}')
        lines += ["# HELP bertforge_request_duration_seconds Time from request to response.",
                  "# TYPE bertforge_request_duration_seconds histogram"]
        for route, histogram in sorted(self.latency.items()):
            lines += histogram.render("bertforge_request_duration_seconds", f'route="{route}"')
        lines += ["# HELP bertforge_batch_size Inputs per forward pass (after micro-batching).",
                  "# TYPE bertforge_batch_size histogram", *self.batch_size.render("bertforge_batch_size"),
                  "# HELP bertforge_forward_duration_seconds Time of one pipeline call on the model thread.",
                  "# TYPE bertforge_forward_duration_seconds histogram",
                  *self.forward_seconds.render("bertforge_forward_duration_seconds"),
                  "# HELP bertforge_requests_in_flight Requests being handled now.",
                  "# TYPE bertforge_requests_in_flight gauge", f"bertforge_requests_in_flight {self.in_flight}"]
        rss = resident_memory_bytes()
        if rss is not None:
            lines += ["# HELP process_resident_memory_bytes Resident memory size in bytes.",
                      "# TYPE process_resident_memory_bytes gauge", f"process_resident_memory_bytes {rss}"]
        return "\n".join(lines) + "\n"


class MetricsMiddleware:
    """Counts every HTTP response by route (the pipeline name for /v1/..., else a known path or
    "other": unknown paths must not create unbounded label values) and status code."""

    KNOWN = {"/", "/health", "/metrics"}

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if path.startswith("/v1/"):
            name = path[len("/v1/"):]
            route = name if name in PIPELINES else "unknown_pipeline"
        else:
            route = path if path in self.KNOWN else "other"
        status = 500
        start = time.perf_counter()

        async def send_wrapper(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_flight += 1
        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            self.metrics.in_flight -= 1
            self.metrics.record_request(route, status, time.perf_counter() - start)


# ---------------------------------------------------------------------------- micro-batching


@dataclass
class _Job:
    task: str
    key: tuple  # requests with equal keys may share a forward pass
    inputs: dict[str, list[str]]  # request_inputs and optional inputs present
    options: dict[str, Any]
    size: int
    future: asyncio.Future = field(repr=False)


def _freeze(value: Any) -> Any:
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


class MicroBatcher:
    """Groups compatible requests that arrive close together into one pipeline call on one thread."""

    def __init__(self, pipelines: dict[str, Pipeline], settings: ServerSettings, metrics: Metrics):
        self.pipelines, self.settings, self.metrics = pipelines, settings, metrics
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertforge-model")
        self.queue: asyncio.Queue[_Job] | None = None
        self.task: asyncio.Task | None = None
        self.pending: collections.deque[_Job] = collections.deque()
        self._busy = False  # a batch is on the model thread

    async def start(self) -> None:
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
        await self.queue.put(_Job(task, key, inputs, options, size, future))
        return await future

    async def _next_batch(self) -> list[_Job]:
        first = self.pending.popleft() if self.pending else await self.queue.get()
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
                    if job.future.done():  # the client went away
                        continue
                    if isinstance(result, Exception):
                        job.future.set_exception(result)
                    else:
                        job.future.set_result(result)
            finally:
                self._busy = False

    def _run_batch(self, batch: list[_Job]) -> list[Any]:
        """On the model thread: one pipeline call over the concatenated inputs, split back per job."""
        first = batch[0]
        pipe = self.pipelines[first.task]
        merged = {name: [text for job in batch for text in job.inputs[name]] for name in first.inputs}
        positional = [merged.pop(name) for name in pipe.request_inputs]
        results = pipe(*positional, batch_size=self.settings.max_batch_size, **merged, **first.options)
        out, start = [], 0
        for job in batch:
            part = results[start:start + job.size]
            out.append(part.tolist() if isinstance(part, np.ndarray) else part)
            start += job.size
        return out


# ---------------------------------------------------------------------------- request handling


# Deeper than any request needs (an object of lists of strings); Python's parser would otherwise
# recurse until RecursionError.
MAX_JSON_DEPTH = 16
_SURROGATE = re.compile("[\ud800-\udfff]")


async def _read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The whole body, at most `limit` bytes, within `timeout` seconds of the headers: a client whose
    body never finishes arriving must not hold a connection (and its memory) open."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise ApiError(413, f"request body of {int(declared)} bytes exceeds the limit of {limit} bytes",
                               close=True)
        except ValueError:
            raise ApiError(400, "invalid Content-Length header", close=True) from None

    async def read() -> bytes:
        chunks, total = [], 0
        async for chunk in request.stream():  # also bounds chunked bodies that declare no length
            total += len(chunk)
            if total > limit:
                raise ApiError(413, f"request body exceeds the limit of {limit} bytes", close=True)
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s", close=True) from None


def _parse_json(raw: bytes) -> Any:
    """The parsed body, or ApiError(400) for JSON this server cannot use: unparsable (also numbers
    Python will not convert), nested deeper than MAX_JSON_DEPTH, or a string (key or value) holding
    a lone surrogate, which the JSON escape `\\ud800` can produce but which is no Unicode text (no
    tokenizer or response can encode it)."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError(400, f"the body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, over-long integers
        raise ApiError(400, f"the body is not valid JSON: {error}") from None
    stack: list[tuple[Any, tuple, int]] = [(body, (), 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            found = _SURROGATE.search(value)
            if found:
                where = _json_path(path) or "the body"
                raise ApiError(400, f"{where} holds a lone surrogate (U+{ord(found.group()):04X}) at character "
                                    f"{found.start()}: not valid Unicode text")
        elif isinstance(value, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise ApiError(400, f"the body nests deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(value, dict):
                for key, item in value.items():
                    if _SURROGATE.search(key):
                        raise ApiError(400, f"a field name in {_json_path(path) or 'the body'} holds a lone "
                                            "surrogate: not valid Unicode text")
                    if isinstance(item, (str, list, dict)):  # numbers, booleans and null need no look
                        stack.append((item, path + (key,), depth + 1))
            else:
                stack.extend((item, path + (i,), depth + 1) for i, item in enumerate(value)
                             if isinstance(item, (str, list, dict)))
    return body


def _json_path(path: tuple) -> str:
    """("texts", 3) -> "texts[3]"."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _check_strings(values: list, name: str, settings: ServerSettings) -> None:
    """ApiError unless every item of `values` is a non-empty string within the size limit."""
    for i, text in enumerate(values):
        if not isinstance(text, str):
            raise ApiError(422, f"{name}[{i}] must be a string, got {type(text).__name__}")
        if not text.strip():
            raise ApiError(422, f"{name}[{i}] is empty")
        if len(text) > settings.max_chars:
            raise ApiError(413, f"{name}[{i}] has {len(text)} characters, over the limit of {settings.max_chars}")


def _validate(pipe: Pipeline, body: Any, settings: ServerSettings) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """The request's inputs and options, or ApiError with the reason (413 for sizes, 422 otherwise)."""
    if not isinstance(body, dict):
        raise ApiError(422, f"the body must be a JSON object, got {type(body).__name__}")
    allowed = set(pipe.request_inputs) | set(pipe.optional_request_inputs) | set(pipe.request_options)
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(422, f"unknown field(s) {', '.join(unknown)} for {pipe.task}; allowed: {', '.join(sorted(allowed))}")
    inputs: dict[str, list[str]] = {}
    for name in (*pipe.request_inputs, *pipe.optional_request_inputs):
        if name not in body or (body[name] is None and name in pipe.optional_request_inputs):
            if name in pipe.request_inputs:
                raise ApiError(422, f"missing field {name!r} (a list of strings)")
            continue
        value = body[name]
        if not isinstance(value, list):
            raise ApiError(422, f"{name!r} must be a list of strings, got {type(value).__name__}")
        if not value:
            raise ApiError(422, f"{name!r} is empty")
        if len(value) > settings.max_texts:
            raise ApiError(413, f"{len(value)} items in {name!r} exceed the limit of {settings.max_texts} per request")
        if name in pipe.nested_request_inputs:  # a list of lists of strings (multiple choice)
            for i, row in enumerate(value):
                if not isinstance(row, list) or not row:
                    raise ApiError(422, f"{name}[{i}] must be a non-empty list of strings")
                if len(row) > settings.max_texts:
                    raise ApiError(413, f"{len(row)} items in {name}[{i}] exceed the limit of {settings.max_texts}")
                _check_strings(row, f"{name}[{i}]", settings)
        else:
            _check_strings(value, name, settings)
        inputs[name] = value
    lengths = {len(v) for v in inputs.values()}
    if len(lengths) > 1:
        raise ApiError(422, "the input lists differ in length: " + ", ".join(f"{k}={len(v)}" for k, v in inputs.items()))
    options = {}
    for name, types in pipe.request_options.items():
        if name in body:
            value = body[name]
            if isinstance(value, bool) and bool not in types or not isinstance(value, types):
                raise ApiError(422, f"{name!r} must be {' or '.join(t.__name__ for t in types)}, "
                                    f"got {type(value).__name__}")
            options[name] = value
    return inputs, options


def _error(status: int, reason: str) -> JSONResponse:
    return JSONResponse({"error": reason}, status_code=status)


def create_app(pipelines: dict[str, Pipeline], settings: ServerSettings | None = None) -> Starlette:
    """The ASGI application serving `pipelines` (task name -> pipeline)."""
    settings = settings or ServerSettings()
    metrics = Metrics()
    batcher = MicroBatcher(pipelines, settings, metrics)
    page = resources.files("bertforge.serving").joinpath("static/index.html").read_text(encoding="utf-8")

    async def predict(request: Request) -> Response:
        name = request.path_params["pipeline"]
        try:
            task = resolve_task(name)
        except ValueError:
            task = None
        if task not in pipelines:
            return _error(404, f"no pipeline {name!r} here; served: {', '.join(sorted(pipelines))}")
        pipe = pipelines[task]
        try:
            raw = await _read_body(request, settings.max_body_bytes, settings.body_timeout_s)
            body = _parse_json(raw)
            inputs, options = _validate(pipe, body, settings)
            results = await batcher.submit(task, inputs, options)
        except ApiError as error:
            response = _error(error.status, error.reason)
            if error.close:
                response.headers["connection"] = "close"
            return response
        except ClientDisconnect:  # nobody reads this answer; it keeps the metrics honest (not a 500)
            return _error(400, "the client disconnected before sending the whole body")
        except PipelineInputError as error:
            return _error(422, str(error))
        except Exception as error:  # noqa: BLE001 - a bug or a model failure: 500, logged by the batcher
            return _error(500, f"{type(error).__name__}: {error}")
        return JSONResponse({"pipeline": task, "results": results})

    async def health(request: Request) -> Response:
        info = {}
        for task, pipe in pipelines.items():
            entry = {"inputs": list(pipe.request_inputs), "optional_inputs": list(pipe.optional_request_inputs),
                     "options": sorted(pipe.request_options), "max_length": pipe.max_length}
            if pipe.config.id2label and task in ("classify", "tag"):
                entry["labels"] = [pipe.config.id2label[i] for i in sorted(pipe.config.id2label)]
            info[task] = entry
        return JSONResponse({"status": "ok", "model": settings.model, "backend": settings.backend,
                             "dtype": settings.dtype,
                             "pipelines": info, "limits": {"max_body_bytes": settings.max_body_bytes,
                                                           "max_texts": settings.max_texts,
                                                           "max_chars": settings.max_chars,
                                                           "body_timeout_s": settings.body_timeout_s}})

    async def metrics_endpoint(request: Request) -> Response:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    async def http_error(request: Request, error: HTTPException) -> Response:
        return _error(error.status_code, error.detail)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await batcher.start()
        yield
        await batcher.stop()

    app = Starlette(
        routes=[Route("/", index), Route("/health", health), Route("/metrics", metrics_endpoint),
                Route("/v1/{pipeline}", predict, methods=["POST"])],
        exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.state.metrics, app.state.batcher, app.state.settings = metrics, batcher, settings
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def load_pipelines(model: str, tasks: Sequence[str] | None = None, backend: str = "torch", device: str | None = None,
                   max_length: int | None = None, onnx_model: str | None = None,
                   dtype: str | None = None) -> dict[str, Pipeline]:
    """The pipelines to serve (default: the one the checkpoint was trained for); `dtype`: see `Pipeline`."""
    model = str(resolve_model_dir(model))  # a Hub id: fetched once, for every pipeline
    names = [resolve_task(t) for t in (tasks or [task_for_checkpoint(model)])]
    if onnx_model is not None and len(names) > 1:
        raise ValueError("--onnx-model holds one task's graph: serve one --task with it")
    return {name: pipeline(name, model=model, backend=backend, device=device, max_length=max_length,
                           onnx_model=onnx_model, dtype=dtype) for name in dict.fromkeys(names)}


def serve(model: str, tasks: Sequence[str] | None = None, host: str = "127.0.0.1", port: int = 8000,
          settings: ServerSettings | None = None, backend: str = "torch", device: str | None = None,
          max_length: int | None = None, onnx_model: str | None = None, log_level: str = "info",
          graceful_timeout: float = 30.0, dtype: str | None = None) -> None:
    """Load the model (exiting non-zero with the reason if it cannot) and serve until SIGINT/SIGTERM."""
    import uvicorn

    settings = settings or ServerSettings()
    settings.model, settings.backend, settings.dtype = str(model), backend, dtype or "fp32"
    try:
        pipelines = load_pipelines(model, tasks, backend, device, max_length, onnx_model, dtype)
    except Exception as error:  # noqa: BLE001 - any failure to load ends the process with the reason
        print(f"bertforge serve: error: cannot load {model}: {type(error).__name__}: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    logger.info("serving %s (%s, %s) on http://%s:%d", ", ".join(pipelines), backend, settings.dtype, host, port)
    app = create_app(pipelines, settings)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=graceful_timeout, lifespan="on")
    server = uvicorn.Server(config)
    server.run()
    if not server.started:  # could not bind, or startup failed: uvicorn logged why
        raise SystemExit(1)


__all__ = ["ServerSettings", "Metrics", "MicroBatcher", "create_app", "load_pipelines", "serve"]
