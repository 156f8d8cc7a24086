"""Issue 49's server cases, through the server: the cost of a request bounded before any forward pass
(top_k, masks x top_k, stride/doc_stride, rows), the same refusals from the pipelines' API, slow
headers timed out, connections capped, over-limit bodies answered 413 readably, blank texts,
Content-Type, 405's Allow and the 404's echo."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed (pip install 'bertforge[serve]')")
pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'bertforge[serve]')")
httpx = pytest.importorskip("httpx", reason="httpx is needed for the server tests")

from starlette.testclient import TestClient  # noqa: E402

from bertforge.serving import PipelineInputError, pipeline  # noqa: E402
from bertforge.serving.limits import RequestLimits  # noqa: E402
from bertforge.serving.server import create_app  # noqa: E402
from bertforge.serving.server_settings import ServerSettings  # noqa: E402

from .live import LiveServer  # noqa: E402

TASKS = ("fill-mask", "classify", "tag", "answer", "multiple-choice")
LONG = "john smith lives in paris and works for acme . " * 40  # ~400 tokens: many windows at 64 tokens


class CountingRunner:
    """The pipeline's own runner, counting the batches it runs: a refused request must run none."""

    def __init__(self, inner):
        self.inner, self.batches = inner, 0

    def __call__(self, batch):
        self.batches += 1
        return self.inner(batch)


@pytest.fixture(scope="module")
def pipes(tiny_dirs):
    out = {}
    for task in TASKS:
        pipe = pipeline(task, model=tiny_dirs[task])
        pipe.runner = CountingRunner(pipe.runner)
        out[task] = pipe
    return out


@pytest.fixture(scope="module")
def client(pipes):
    settings = ServerSettings(model="tiny", limits=RequestLimits(max_rows=32))
    with TestClient(create_app(pipes, settings)) as client:
        yield client


def post(client, route, body):
    return client.post(route, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


# -- 1. the cost model: (route, body, pipeline call, the error's words); the tiny models read 64 tokens
COSTLY = [
    # The 720-byte request that answered 2.38 GB: top_k over the cap (50) and the vocabulary.
    ("fill-mask", {"texts": ["[MASK] " * 100], "top_k": 100000},
     lambda p: p(["[MASK] " * 100], top_k=100000), "top_k 100000 is over the limit of 50 (max_top_k 50"),
    # Within top_k, the masks x top_k of the texts: 62 masks fit 64 tokens, x 50 = 3100 > 2048.
    ("fill-mask", {"texts": ["[MASK] " * 100], "top_k": 50},
     lambda p: p(["[MASK] " * 100], top_k=50), "make 3100 predictions, over the limit of 2048"),
    ("tag", {"texts": [LONG], "stride": 1},
     lambda p: p([LONG], stride=1), "stride 1 is under the limit of 16 tokens (0.25 of max_length 64)"),
    ("answer", {"questions": ["who?"], "contexts": [LONG], "doc_stride": 1},
     lambda p: p(["who?"], [LONG], doc_stride=1), "doc_stride 1 is under the limit of 16 tokens"),
    # Rows: texts x windows at the smallest stride allowed, over max_rows (32 here).
    ("tag", {"texts": [LONG] * 2, "stride": 16},
     lambda p: p([LONG] * 2, stride=16), "model rows (texts x windows), over the limit of 32 per call"),
    ("answer", {"questions": ["who?"] * 2, "contexts": [LONG] * 2, "doc_stride": 16},
     lambda p: p(["who?"] * 2, [LONG] * 2, doc_stride=16), "model rows (contexts x windows), over the limit of 32"),
    # The 64 contexts x 64 endings = 4,096 rows per request.
    ("multiple-choice", {"contexts": ["a"] * 64, "endings": [["b"] * 64] * 64},
     lambda p: p(["a"] * 64, [["b"] * 64] * 64), "need 4096 model rows (contexts x endings), over the limit of 32"),
]


@pytest.mark.parametrize("task, body, call, reason", COSTLY, ids=[f"{c[0]}-{i}" for i, c in enumerate(COSTLY)])
def test_costly_requests_are_refused_before_any_forward_pass(client, pipes, task, body, call, reason):
    runner = pipes[task].runner
    before = runner.batches
    r = post(client, f"/v1/{task}", body)
    assert r.status_code == 422, r.text[:300]
    assert reason in r.json()["error"]
    assert runner.batches == before  # no forward pass ran
    # The pipelines' public API refuses the same call with the same message (its limits are the defaults
    # but for max_rows, which the server set to 32: give the pipeline the same).
    with pytest.raises(PipelineInputError) as refused:
        call(pipes[task].with_limits(RequestLimits(max_rows=32)))
    assert str(refused.value) == r.json()["error"]
    assert client.post("/v1/classify", json={"texts": ["a good film"]}).status_code == 200  # still serving


def test_top_k_is_bounded_by_the_vocabulary(pipes):
    app = create_app(pipes, ServerSettings(limits=RequestLimits(max_top_k=100_000)))
    with TestClient(app) as http_client:
        r = post(http_client, "/v1/fill-mask", {"texts": ["a [MASK]"], "top_k": 138})
        assert r.status_code == 422 and "top_k 138 is over the limit of 137" in r.json()["error"]
        r = post(http_client, "/v1/fill-mask", {"texts": ["a [MASK]"], "top_k": 137})
        assert r.status_code == 200 and len(r.json()["results"][0][0]) == 137


def test_fill_mask_answers_stay_small_within_the_limits(client):
    """At the limits (top_k 50, 40 masks = 2000 predictions), the answer grows with masks x top_k, not
    masks^2 x top_k: a text with several masks does not repeat itself in every candidate."""
    r = post(client, "/v1/fill-mask", {"texts": ["[MASK] " * 40], "top_k": 50})
    assert r.status_code == 200
    per_mask = r.json()["results"][0]
    assert len(per_mask) == 40 and all(len(c) == 50 for c in per_mask)
    assert all(set(c) == {"token", "token_id", "score"} for candidates in per_mask for c in candidates)
    assert len(r.content) < 2000 * 100  # ~70 bytes per prediction
    one = post(client, "/v1/fill-mask", {"texts": ["paris is the [MASK] of france ."], "top_k": 3}).json()
    assert [c["sequence"] for c in one["results"][0][0]] == [
        f"paris is the {c['token'].removeprefix('##')} of france ." for c in one["results"][0][0]]


def test_limits_within_bounds_answer(client):
    assert post(client, "/v1/tag", {"texts": [LONG], "stride": 16}).status_code == 200
    assert post(client, "/v1/answer", {"questions": ["who?"], "contexts": [LONG], "doc_stride": 16}).status_code == 200
    r = post(client, "/v1/multiple-choice", {"contexts": ["a"] * 8, "endings": [["b", "c", "d", "e"]] * 8})
    assert r.status_code == 200 and len(r.json()["results"]) == 8
    limits = client.get("/health").json()["limits"]
    assert limits["max_top_k"] == 50 and limits["max_rows"] == 32 and limits["min_stride_fraction"] == 0.25


# -- 4. smaller items

@pytest.mark.parametrize("text", ["\u0000", "\u200b", "\u200b \u0000\ufeff"])
def test_a_text_that_tokenizes_to_nothing_is_empty(client, pipes, text):
    for route, body in (("/v1/classify", {"texts": ["fine", text]}),
                        ("/v1/classify", {"texts": ["fine", "fine"], "text_pairs": ["ok", text]})):
        r = post(client, route, body)
        assert r.status_code == 422, r.text
        what = "text_pairs" if "text_pairs" in body else "texts"
        assert r.json()["error"] == f"{what}[1] is empty (nothing in it is a token)"
    with pytest.raises(PipelineInputError, match=r"texts\[0\] is empty"):
        pipes["classify"]([text])


@pytest.mark.parametrize("content_type, status", [
    ("application/json", 200), ("application/json; charset=utf-8", 200), ("Application/JSON", 200),
    ("text/plain", 415), ("application/x-www-form-urlencoded", 415), ("multipart/form-data; boundary=x", 415),
    (None, 415),
])
def test_the_body_must_be_declared_json(client, content_type, status):
    headers = {} if content_type is None else {"content-type": content_type}
    r = client.post("/v1/classify", content=b'{"texts": ["a good film"]}', headers=headers)
    assert r.status_code == status, r.text
    if status == 415:
        assert r.json()["error"].startswith("Content-Type must be application/json")


def test_405_says_what_is_allowed_and_404_does_not_echo_a_long_path(client):
    r = client.get("/v1/classify")
    assert r.status_code == 405 and r.headers["allow"] == "POST" and "error" in r.json()
    r = client.post("/v1/" + "x" * 10_000, json={"texts": ["a"]})
    assert r.status_code == 404 and len(r.content) < 300
    assert "'" + "x" * 64 + "...'" in r.json()["error"]


# -- 2. slow headers and the connection cap, 3. readable 413s: against a real uvicorn

def _until_closed(conn: socket.socket, limit: float = 10.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes `conn`, and the seconds that took."""
    start, received = time.monotonic(), b""
    conn.settimeout(limit)
    while True:
        try:
            chunk = conn.recv(65536)
        except ConnectionResetError:
            break
        except socket.timeout:
            raise AssertionError(f"the connection stayed open {limit} s") from None
        if not chunk:
            break
        received += chunk
    return received, time.monotonic() - start


@pytest.fixture(scope="module")
def classify_only(pipes):
    return {"classify": pipes["classify"]}


def test_slow_headers_are_timed_out(classify_only):
    """A connection that sends half a header, or nothing, is closed after header_timeout_s (a 408
    for the half header); so is a keep-alive connection whose next request never completes."""
    app = create_app(classify_only, ServerSettings(header_timeout_s=0.5))
    with LiveServer(app) as server:
        half = socket.create_connection(("127.0.0.1", server.port))
        half.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Ty")
        silent = socket.create_connection(("127.0.0.1", server.port))
        received, seconds = _until_closed(half)
        assert received.startswith(b"HTTP/1.1 408 ") and b"headers did not arrive within 0.5 s" in received
        assert 0.4 <= seconds < 3
        received, seconds = _until_closed(silent)
        assert received == b"" and seconds < 3
        half.close(), silent.close()
        with socket.create_connection(("127.0.0.1", server.port)) as kept:
            body = b'{"texts": ["a good film"]}'
            kept.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            kept.settimeout(10)
            first = kept.recv(65536)
            while b"\r\n\r\n" not in first or len(first.split(b"\r\n\r\n", 1)[1]) < int(
                    first.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0]):
                first += kept.recv(65536)  # the whole answer, before the next request
            assert first.startswith(b"HTTP/1.1 200 ")
            kept.sendall(b"GET /health HTTP/1.1\r\nHo")  # the next request, half sent
            received, seconds = _until_closed(kept)
            assert received.startswith(b"HTTP/1.1 408 ") and seconds < 3
        # The body keeps its own timeout once the headers are in.
        with httpx.Client(base_url=server.url, timeout=10) as http_client:
            assert http_client.post("/v1/classify", json={"texts": ["a good film"]}).status_code == 200


def test_connections_beyond_the_cap_are_refused_until_slow_ones_time_out(classify_only):
    app = create_app(classify_only, ServerSettings(header_timeout_s=1.0, max_connections=4))
    with LiveServer(app) as server:
        slow = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
        for conn in slow:
            conn.sendall(b"GET /health HTTP/1.1\r\n")  # half a header each
        time.sleep(0.3)  # all four accepted
        extra = socket.create_connection(("127.0.0.1", server.port))
        received, seconds = _until_closed(extra)
        assert received.startswith(b"HTTP/1.1 503 ") and b"max_connections" in received and seconds < 1.0
        extra.close()
        for conn in slow:  # the header timeout frees their places
            assert _until_closed(conn)[0].startswith(b"HTTP/1.1 408 ")
            conn.close()
        with httpx.Client(base_url=server.url, timeout=10) as http_client:
            assert http_client.post("/v1/classify", json={"texts": ["a good film"]}).status_code == 200


def _chunks(total: int, size: int = 65536):
    for start in range(0, total, size):
        yield b"x" * min(size, total - start)


def test_an_over_limit_body_is_answered_413_readably(classify_only):
    """A plain client (http.client, urllib: no Expect: 100-continue) sends its whole body before
    reading: the server answers 413 and reads the rest before closing, so the client reads the 413
    instead of a reset, for a declared length and for a chunked body."""
    app = create_app(classify_only, ServerSettings(max_body_bytes=1 << 20))
    with LiveServer(app) as server:
        for size in (3 << 20, 12 << 20, 3 << 20):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            conn.request("POST", "/v1/classify", body=b"x" * size, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            assert response.status == 413
            assert json.loads(response.read())["error"] == (
                f"request body of {size} bytes exceeds the limit of {1 << 20} bytes")
            conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("POST", "/v1/classify", body=_chunks(2 << 20), encode_chunked=True,
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 413 and "exceeds the limit of 1048576 bytes" in json.loads(response.read())["error"]
        conn.close()
        request = urllib.request.Request(server.url + "/v1/classify", data=b"x" * (5 << 20),
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 413 and b"exceeds the limit" in refused.value.read()
        with httpx.Client(base_url=server.url, timeout=10) as http_client:
            assert http_client.post("/v1/classify", json={"texts": ["a good film"]}).status_code == 200


def test_a_short_request_does_not_wait_for_every_large_one_queued_before_it(pipes):
    """The issue's 10-word request queued behind four large ones: the batcher takes the cheapest
    waiting request first, so it waits only for the call already on the model thread."""
    classify = pipes["classify"]

    def slow(batch):
        time.sleep(1.0)  # long enough for every request below to be queued during the first
        return classify.runner(batch)

    app = create_app({"classify": pipeline("classify", model=classify.model_dir, runner=slow)},
                     ServerSettings(micro_batching=False))
    done: dict[str, float] = {}

    def send(name: str, texts: list[str]) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as http_client:
            assert http_client.post("/v1/classify", json={"texts": texts}).status_code == 200
        done[name] = time.monotonic()

    large = ["a good film " * 30] * 4
    with LiveServer(app) as server:
        threads = []
        for name, texts, pause in (("large0", large, 0.2), ("large1", large, 0.05), ("large2", large, 0.05),
                                   ("large3", large, 0.05), ("short", ["a good film"], 0)):
            threads.append(threading.Thread(target=send, args=(name, texts)))
            threads[-1].start()
            time.sleep(pause)
        for thread in threads:
            thread.join(60)
    assert done["short"] < min(done[f"large{i}"] for i in (1, 2, 3)), done


def test_settings_out_of_range_are_refused_in_one_line():
    with pytest.raises(ValueError, match="header_timeout_s must be positive, got 0"):
        ServerSettings(header_timeout_s=0)
    with pytest.raises(ValueError, match="max_rows must be a positive integer, got 0"):
        RequestLimits(max_rows=0)
    with pytest.raises(ValueError, match=r"min_stride_fraction must lie in \[0, 1\]"):
        RequestLimits(min_stride_fraction=2)


def test_a_short_request_is_run_between_the_forward_batches_of_a_large_call(pipes):
    """A large call on the model thread lets a cheaper request run between two of its forward
    batches: the short request is answered long before the large one."""
    classify = pipes["classify"]
    batches: list[int] = []

    def slow(batch):
        batches.append(len(batch["input_ids"]))
        time.sleep(0.3)
        return classify.runner(batch)

    app = create_app({"classify": pipeline("classify", model=classify.model_dir, runner=slow)},
                     ServerSettings(max_batch_size=2, max_wait_ms=0))
    done: dict[str, float] = {}

    def send(name: str, texts: list[str]) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as http_client:
            r = http_client.post("/v1/classify", json={"texts": texts})
            assert r.status_code == 200 and len(r.json()["results"]) == len(texts)
        done[name] = time.monotonic()

    with LiveServer(app) as server:
        large = threading.Thread(target=send, args=("large", ["a good film " * 20] * 10))  # 5 batches of 2
        large.start()
        time.sleep(0.45)  # the large call is in its second batch
        send("short", ["a good film"])
        large.join(60)
    assert done["large"] - done["short"] > 0.5, done
    assert sorted(batches) == [1] + [2] * 5  # the short request ran alone, between two of the large call's


def test_forward_batches_hold_at_most_max_batch_tokens(pipes):
    classify = pipes["classify"]
    shapes: list[tuple[int, int]] = []

    def recording(batch):
        shapes.append(batch["input_ids"].shape)
        return classify.runner(batch)

    pipe = pipeline("classify", model=classify.model_dir, runner=recording)
    texts = ["a good film " * 30] * 5 + ["bad"] * 3  # five rows of 64 tokens, three of 3
    expected = pipe(texts)
    shapes.clear()
    pipe.max_batch_tokens = 128
    got = pipe(texts)
    assert [r["label"] for r in got] == [r["label"] for r in expected]
    assert [r["score"] for r in got] == pytest.approx([r["score"] for r in expected], abs=1e-5)
    assert shapes == [(3, 3), (2, 64), (2, 64), (1, 64)]  # shortest first; 2 x 64 = 128 tokens at most
