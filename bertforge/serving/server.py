"""The HTTP server: pipelines behind a JSON API with micro-batching, metrics, limits and a test page.

    bertforge serve --model runs/sst2/final --port 8000

Routes:
- `POST /v1/<pipeline>`: `{"texts": [...]}` (classify/embed also `"text_pairs"`; answer takes
  `"questions"` and `"contexts"`; multiple-choice `"contexts"`, `"endings"` (a list of endings per
  context) and optionally `"starts"`) plus the pipeline's options (`"top_k"`, `"pooling"`, ...) ->
  `{"pipeline": name, "results": [...]}`, one result per input.
- `GET /health`: status, model, backend and the pipelines served.
- `GET /metrics`: Prometheus text format: requests by pipeline and status code, request latency,
  texts per forward pass, forward-pass time, requests in flight, resident memory.
- `GET /`: a self-contained page to try the model (no external resources).

Micro-batching: a request's inputs join a queue; one collector takes whatever compatible requests
(same pipeline and options) arrive within `max_wait_ms` of the first, up to `max_batch_size` inputs,
and runs them as one pipeline call on the single model thread. The event loop never runs the model,
so it keeps accepting and validating requests meanwhile. The cheapest waiting request goes first, and
runs between two forward batches of a large call (`batching`), so a short request is not held up by
large ones.

Errors: body over `max_body_bytes`, more than `max_texts` inputs or an input over `max_chars`
characters -> 413 (a body refused unread is drained, within bounds, before the connection closes,
so that a plain client still reads the answer: `http_protocol`); a body that does not arrive whole
within `body_timeout_s` -> 408 and the connection is closed; a Content-Type other than
application/json -> 415 (a browser's cross-site form or text/plain POST included); JSON that cannot
be used (unparsable, nested deeper than `MAX_JSON_DEPTH`, a string holding a lone surrogate, which
is not Unicode text) -> 400; a body of the wrong shape or types, an empty text (also one that
tokenizes to nothing, such as "\u0000"), an unknown option, an option over its cost limit (`top_k`,
`stride`, rows per request: `bertforge.serving.limits`, checked before any forward pass) -> 422;
a method other than POST on `/v1/...` -> 405 with `Allow`; all as `{"error": reason}`. No input
gives a 500.

Connections (`http_protocol`): headers must arrive within `header_timeout_s`, at most
`max_connections` are open at once (more are answered 503 and closed).

Admission (`admission`): a request whose work in model tokens, with the queued work that would run
before it, exceeds `max_queued_tokens` is answered 429 with `Retry-After` before it is queued, so
that an admitted request starts after a bounded wait instead of outwaiting its client.

Shutdown (SIGINT/SIGTERM, `uvicorn_server`): the server stops accepting connections, answers every
queued request that has not started 503 with `Retry-After` at once (never computing it), lets the call
on the model thread finish within the graceful timeout (else answers its requests 503 just before it
and stops the call at its next forward batch), and exits: within the graceful timeout plus one
forward batch, with no 500.

The pieces: settings and errors (`server_settings`), metrics (`server_metrics`), micro-batching
(`batching`); this module reads and checks requests and builds the app.

Needs the `serve` extra: `pip install 'bertforge[serve]'` (starlette, uvicorn).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import resource
import sys
from importlib import resources
from typing import Any, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..modeling.pretrained import resolve_model_dir
from .batching import MicroBatcher
from .http_protocol import protocol_class
from .pipelines import Pipeline, PipelineInputError, pipeline, resolve_task
from .registry import served_for_checkpoint
from .server_metrics import Metrics, MetricsMiddleware
from .server_settings import ApiError, ServerSettings

logger = logging.getLogger("bertforge.serve")
# ---------------------------------------------------------------------------- request handling


# Deeper than any request needs (an object of lists of strings); Python's parser would otherwise
# recurse until RecursionError.
MAX_JSON_DEPTH = 16
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_ECHOED_NAME = 64  # characters of an unknown pipeline's name repeated in the 404


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


def _check_strings(values: list, name: str, settings: ServerSettings, pipe: Pipeline) -> None:
    """ApiError unless every item of `values` is a non-empty string within the size limit; a text
    that tokenizes to nothing is empty too (PipelineInputError, the pipeline's own check)."""
    for i, text in enumerate(values):
        if not isinstance(text, str):
            raise ApiError(422, f"{name}[{i}] must be a string, got {type(text).__name__}")
        if not text.strip():
            raise ApiError(422, f"{name}[{i}] is empty")
        if len(text) > settings.max_chars:
            raise ApiError(413, f"{name}[{i}] has {len(text)} characters, over the limit of {settings.max_chars}")
    pipe.check_tokens(values, name)


def _check_content_type(request: Request) -> None:
    """ApiError(415) unless the body is declared JSON: a browser sends a cross-site POST without
    asking first only as a form or text/plain, so refusing those keeps other sites' pages out."""
    declared = request.headers.get("content-type", "")
    if declared.split(";", 1)[0].strip().lower() != "application/json":
        raise ApiError(415, f"Content-Type must be application/json, got {declared[:80]!r}", close=True)


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
                _check_strings(row, f"{name}[{i}]", settings, pipe)
        else:
            _check_strings(value, name, settings, pipe)
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
    pipe.check_options(**options)  # the cost limits of the options (PipelineInputError -> 422), before queueing
    return inputs, options


def _error(status: int, reason: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": reason}, status_code=status, headers=headers)


def create_app(pipelines: dict[str, Pipeline], settings: ServerSettings | None = None) -> Starlette:
    """The ASGI application serving `pipelines` (task name -> pipeline)."""
    settings = settings or ServerSettings()
    pipelines = {task: pipe.with_limits(settings.limits) for task, pipe in pipelines.items()}
    for pipe in pipelines.values():  # copies: the caller's pipelines keep their own batching
        pipe.max_batch_tokens = settings.max_batch_tokens
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
            shown = name if len(name) <= MAX_ECHOED_NAME else name[:MAX_ECHOED_NAME] + "..."
            response = _error(404, f"no pipeline {shown!r} here; served: {', '.join(sorted(pipelines))}")
            response.headers["connection"] = "close"  # its body is not read
            return response
        pipe = pipelines[task]
        try:
            _check_content_type(request)
            raw = await _read_body(request, settings.max_body_bytes, settings.body_timeout_s)
            body = _parse_json(raw)
            inputs, options = _validate(pipe, body, settings)
            results = await batcher.submit(task, inputs, options)
        except ApiError as error:
            response = _error(error.status, error.reason, error.headers)
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
                                                           "body_timeout_s": settings.body_timeout_s,
                                                           "header_timeout_s": settings.header_timeout_s,
                                                           "max_connections": settings.max_connections,
                                                           "max_queued_tokens": settings.max_queued_tokens,
                                                           **dataclasses.asdict(settings.limits)}})

    async def metrics_endpoint(request: Request) -> Response:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def index(request: Request) -> Response:
        return HTMLResponse(page)

    async def http_error(request: Request, error: HTTPException) -> Response:
        return _error(error.status_code, error.detail, error.headers)

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
    names = [resolve_task(t) for t in (tasks or served_for_checkpoint(model))]
    if onnx_model is not None and len(names) > 1:
        raise ValueError("--onnx-model holds one task's graph: serve one --task with it")
    return {name: pipeline(name, model=model, backend=backend, device=device, max_length=max_length,
                           onnx_model=onnx_model, dtype=dtype) for name in dict.fromkeys(names)}


def uvicorn_config(app: Starlette, host: str, port: int, **kwargs: Any) -> "uvicorn.Config":
    """uvicorn's configuration for an app of `create_app`: its connections guarded by
    `http_protocol` (header timeout, connection cap, lingering close) with the app's settings."""
    import uvicorn  # optional extra

    kwargs = {"log_level": "info", "access_log": False, "lifespan": "on", **kwargs}
    return uvicorn.Config(app, host=host, port=port, http=protocol_class(app.state.settings), **kwargs)


def uvicorn_server(app: Starlette, host: str, port: int, graceful_timeout: float | None = 30.0,
                   **kwargs: Any) -> "uvicorn.Server":
    """A uvicorn server for an app of `create_app` whose shutdown drains the app's batcher first: the
    queued requests are answered 503 at once and the running call gets `graceful_timeout` seconds
    (see the module docstring), so that uvicorn never has to cancel a request (a 500 and a traceback)."""
    import uvicorn  # optional extra

    batcher = app.state.batcher

    class DrainingServer(uvicorn.Server):
        async def shutdown(self, sockets: list | None = None) -> None:
            batcher.drain(self.config.timeout_graceful_shutdown)
            await super().shutdown(sockets)

    config = uvicorn_config(app, host, port, timeout_graceful_shutdown=graceful_timeout, **kwargs)
    return DrainingServer(config)


FILES_IN_RESERVE = 64  # descriptors the process needs besides its connections (model files, pipes, logs)


def _fit_connections_to_files(settings: ServerSettings) -> None:
    """Make room for `max_connections` sockets under the open-file limit (raising the soft limit up
    to the hard one), or lower `max_connections` to what fits, saying so."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = settings.max_connections + FILES_IN_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
        if soft < need:
            fitted = max(1, soft - FILES_IN_RESERVE)
            logger.warning("the open-file limit is %d: serving at most %d connections, not %d", soft, fitted,
                           settings.max_connections)
            settings.max_connections = fitted


def serve(model: str, tasks: Sequence[str] | None = None, host: str = "127.0.0.1", port: int = 8000,
          settings: ServerSettings | None = None, backend: str = "torch", device: str | None = None,
          max_length: int | None = None, onnx_model: str | None = None, log_level: str = "info",
          graceful_timeout: float = 30.0, dtype: str | None = None) -> None:
    """Load the model (exiting non-zero with the reason if it cannot) and serve until SIGINT/SIGTERM,
    then drain within `graceful_timeout` seconds (`uvicorn_server`)."""
    settings = settings or ServerSettings()
    settings.model, settings.backend, settings.dtype = str(model), backend, dtype or "fp32"
    try:
        pipelines = load_pipelines(model, tasks, backend, device, max_length, onnx_model, dtype)
    except Exception as error:  # noqa: BLE001 - any failure to load ends the process with the reason
        print(f"bertforge serve: error: cannot load {model}: {type(error).__name__}: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    logger.info("serving %s (%s, %s) on http://%s:%d", ", ".join(pipelines), backend, settings.dtype, host, port)
    app = create_app(pipelines, settings)
    _fit_connections_to_files(settings)
    server = uvicorn_server(app, host, port, graceful_timeout=graceful_timeout, log_level=log_level)
    server.run()
    if not server.started:  # could not bind, or startup failed: uvicorn logged why
        raise SystemExit(1)


__all__ = ["create_app", "load_pipelines", "serve", "uvicorn_server"]
