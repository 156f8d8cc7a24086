"""The HTTP server: endpoints, limits and error codes in-process; micro-batching, graceful shutdown and
start-up failure against a real uvicorn on loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed (pip install 'bertforge[serve]')")
pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'bertforge[serve]')")
httpx = pytest.importorskip("httpx", reason="httpx is needed for the server tests")

from starlette.testclient import TestClient  # noqa: E402

from bertforge.serving import pipeline  # noqa: E402
from bertforge.serving.server import create_app  # noqa: E402
from bertforge.serving.server_settings import ServerSettings  # noqa: E402

from .live import LiveServer  # noqa: E402


@pytest.fixture(scope="module")
def pipelines(tiny_dirs):
    return {task: pipeline(task, model=tiny_dirs[task]) for task in ("fill-mask", "classify", "tag", "answer", "embed")}


@pytest.fixture(scope="module")
def client(pipelines):
    settings = ServerSettings(max_body_bytes=4096, max_texts=4, max_chars=200, model="tiny")
    with TestClient(create_app(pipelines, settings)) as client:
        yield client


def test_health_page_and_metrics(client):
    health = client.get("/health").json()
    assert health["status"] == "ok" and set(health["pipelines"]) == {"fill-mask", "classify", "tag", "answer", "embed"}
    assert health["pipelines"]["classify"]["labels"] == ["negative", "positive"]
    assert health["backend"] == "torch" and health["dtype"] == "fp32"
    assert health["pipelines"]["answer"]["inputs"] == ["questions", "contexts"]
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "<script" in page.text and "http://" not in page.text and "https://" not in page.text  # self-contained
    client.post("/v1/classify", json={"texts": ["a good film"]})
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'bertforge_requests_total{route="classify",code="200"}' in text
    assert 'bertforge_request_duration_seconds_bucket{route="classify",le="+Inf"}' in text
    assert "bertforge_batch_size_count" in text and "process_resident_memory_bytes" in text


def test_every_pipeline_answers(client, pipelines):
    r = client.post("/v1/classify", json={"texts": ["a good film", "bad"], "text_pairs": ["x", "y"]})
    assert r.status_code == 200
    assert r.json()["results"] == json.loads(json.dumps(pipelines["classify"](["a good film", "bad"],
                                                                              text_pairs=["x", "y"])))
    r = client.post("/v1/fill-mask", json={"texts": ["Paris is the [MASK] of France."], "top_k": 2})
    assert r.status_code == 200 and len(r.json()["results"][0][0]) == 2
    r = client.post("/v1/tag", json={"texts": ["John Smith lives in Paris."]})
    assert r.status_code == 200 and isinstance(r.json()["results"][0], list)
    r = client.post("/v1/answer", json={"questions": ["where?"], "contexts": ["John lives in Paris."]})
    assert r.status_code == 200 and {"answer", "score", "start", "end"} <= set(r.json()["results"][0])
    r = client.post("/v1/embed", json={"texts": ["a", "b c"], "pooling": "cls", "layers": [-1, -2]})
    assert r.status_code == 200 and [len(v) for v in r.json()["results"]] == [64, 64]
    assert client.post("/v1/ner", json={"texts": ["John"]}).status_code == 200  # an alias


@pytest.mark.parametrize("body, status, reason", [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b'["a list"]', 422, "JSON object"),
    (b'{"texts": "one string"}', 422, "list of strings"),
    (b'{"texts": [1, 2]}', 422, "must be a string"),
    (b'{"texts": []}', 422, "is empty"),
    (b'{"texts": ["fine", "  "]}', 422, "texts[1] is empty"),
    (b'{}', 422, "missing field"),
    (b'{"texts": ["a"], "colour": "red"}', 422, "unknown field"),
    (b'{"texts": ["a"], "text_pairs": ["b", "c"]}', 422, "differ in length"),
    (b'{"texts": ["a", "b", "c", "d", "e"]}', 413, "limit of 4"),
    (json.dumps({"texts": ["x" * 201]}).encode(), 413, "201 characters"),
    (json.dumps({"texts": ["fine", "x" * 201]}).encode(), 413, "texts[1] has 201 characters, over the limit of 200"),
    (b'{"texts": ["fine", "a \\ud800b"]}', 400, "texts[1] holds a lone surrogate (U+D800) at character 2"),
    (b'{"texts": ["a"], "te\\udfffxts": ["b"]}', 400, "a field name in the body holds a lone surrogate"),
    (b'{"texts": ' + b"[" * 2000 + b"]" * 2000 + b"}", 400, "nests deeper than 16 levels"),
    (b'{"texts": ' + b"[" * 20 + b"]" * 20 + b"}", 400, "nests deeper than 16 levels"),
    (json.dumps({"texts": ["x " * 3000]}).encode(), 413, "exceeds the limit of 4096 bytes"),
])
def test_bad_requests(client, body, status, reason):
    r = client.post("/v1/classify", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert reason in r.json()["error"]


def test_unusable_json_is_400_not_500(pipelines):
    """JSON that parses into something no pipeline can take: answered 400 with the reason, and the
    server goes on serving."""
    app = create_app(pipelines, ServerSettings(model="tiny"))
    deep = {"texts": ["a"], "layers": [-1]}
    for _ in range(30):
        deep = {"x": [deep]}
    bodies = [
        (b'{"texts": ["a"], "top_k": ' + b"1" * 5000 + b"}", "not valid JSON"),  # Python caps int digits
        (b"[" * 100_000 + b"]" * 100_000, "nests deeper than 16 levels"),  # RecursionError in the parser
        (json.dumps(deep).encode(), "nests deeper than 16 levels"),
        (b'{"texts": ["ok"], "pooling": "\\udc00"}', "pooling holds a lone surrogate (U+DC00) at character 0"),
        (b'{"texts": ["ok"], "layers": [{"a": "\\ud83d"}]}', "layers[0].a holds a lone surrogate"),
    ]
    with TestClient(app) as http:
        for body, reason in bodies:
            for route in ("/v1/fill-mask", "/v1/embed"):
                r = http.post(route, content=body, headers={"content-type": "application/json"})
                assert r.status_code == 400 and reason in r.json()["error"], (route, body[:60], r.text[:200])
        # A surrogate pair escaped in JSON is one real character: fine.
        r = http.post("/v1/embed", content=b'{"texts": ["smile \\ud83d\\ude00"]}',
                      headers={"content-type": "application/json"})
        assert r.status_code == 200
        assert 'code="500"' not in http.get("/metrics").text


def _raw_request(port: int, head: bytes, body_parts: list[bytes], pause: float) -> tuple[bytes, float]:
    """Send `head`, then the body parts `pause` seconds apart (never the whole declared body), and read
    until the server closes the connection: (everything received, seconds from the head to the close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(head)
        start = time.monotonic()
        received = b""
        conn.settimeout(pause or 30)
        parts = list(body_parts)
        while True:
            if parts:
                try:
                    conn.sendall(parts.pop(0))
                except OSError:  # the server has closed it
                    parts = []
            try:
                chunk = conn.recv(65536)
            except socket.timeout:
                if time.monotonic() - start > 30:
                    raise AssertionError("the server kept the connection open for 30 s") from None
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        return received, time.monotonic() - start


def test_a_body_that_never_finishes_is_cut_off(pipelines):
    """A client that declares a body and never sends all of it (or trickles it in) gets 408 and a
    closed connection once body_timeout_s has passed since the request began, not never."""
    app = create_app(pipelines, ServerSettings(body_timeout_s=1.0))
    head = (b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n")
    with LiveServer(app) as server:
        stalled, stalled_s = _raw_request(server.port, head, [b'{"texts": ["a good'], 0)
        trickled, trickled_s = _raw_request(server.port, head, [b" "] * 40, 0.2)  # a byte every 0.2 s
        with httpx.Client(base_url=server.url, timeout=30) as http:  # and it still serves
            assert http.post("/v1/classify", json={"texts": ["a good film"]}).status_code == 200
    for received, seconds in ((stalled, stalled_s), (trickled, trickled_s)):
        assert received.startswith(b"HTTP/1.1 408 "), received[:200]
        assert b"did not arrive within 1 s" in received and b"connection: close" in received.lower()
        assert 0.9 <= seconds < 10, seconds


def test_other_errors(client):
    r = client.post("/v1/summarize", json={"texts": ["a"]})
    assert r.status_code == 404 and "served" in r.json()["error"]
    assert client.get("/v1/classify").status_code == 405
    r = client.post("/v1/fill-mask", json={"texts": ["no mask"]})
    assert r.status_code == 422 and "[MASK]" in r.json()["error"]
    r = client.post("/v1/fill-mask", json={"texts": ["a [MASK]"], "top_k": "5"})
    assert r.status_code == 422 and "top_k" in r.json()["error"]
    r = client.post("/v1/fill-mask", json={"texts": ["a [MASK]"], "top_k": True})
    assert r.status_code == 422
    r = client.post("/v1/embed", json={"texts": ["a"], "layers": [9]})
    assert r.status_code == 422 and "out of range" in r.json()["error"]
    # After all that, it still serves.
    assert client.post("/v1/classify", json={"texts": ["a good film"]}).status_code == 200


def _batch_count(server) -> int:
    return server.app.state.metrics.batch_size.count


def test_micro_batching_groups_concurrent_requests(pipelines):
    texts = ["a good film", "bad", "the story was fun", "John Smith lives in Paris.", "great", "boring movie"] * 2
    expected = pipelines["classify"](texts)
    app = create_app(pipelines, ServerSettings(max_batch_size=32, max_wait_ms=300))
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        with ThreadPoolExecutor(len(texts)) as pool:
            responses = list(pool.map(lambda t: http.post("/v1/classify", json={"texts": [t]}), texts))
        assert all(r.status_code == 200 for r in responses)
        for r, e in zip(responses, expected):
            assert r.json()["results"][0]["label"] == e["label"]
            assert r.json()["results"][0]["score"] == pytest.approx(e["score"], abs=1e-5)
        assert _batch_count(server) < len(texts)  # some requests shared a forward pass
        assert app.state.metrics.batch_size.sum == len(texts)


def test_without_micro_batching_each_request_runs_alone(pipelines):
    app = create_app(pipelines, ServerSettings(micro_batching=False))
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        with ThreadPoolExecutor(6) as pool:
            responses = list(pool.map(lambda t: http.post("/v1/classify", json={"texts": [t, t]}), ["a"] * 6))
        assert all(r.status_code == 200 for r in responses)
        assert _batch_count(server) == 6 and app.state.metrics.batch_size.sum == 12


def test_one_bad_input_does_not_fail_its_batch(pipelines):
    app = create_app(pipelines, ServerSettings(max_wait_ms=300))
    bodies = [{"texts": ["Paris is the [MASK] of France."]}, {"texts": ["the " * 100 + "[MASK]"]}] * 2
    with LiveServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        with ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(lambda b: http.post("/v1/fill-mask", json=b), bodies))
    assert [r.status_code for r in responses] == [200, 422, 200, 422]


def test_graceful_shutdown_finishes_requests_in_flight(pipelines):
    classify = pipelines["classify"]
    inner = classify.runner

    def slow(batch):
        time.sleep(1.0)
        return inner(batch)

    slow_pipe = pipeline("classify", model=classify.model_dir, runner=slow)
    app = create_app({"classify": slow_pipe}, ServerSettings())
    server = LiveServer(app).start()
    results = {}

    def request():
        with httpx.Client(base_url=server.url, timeout=30) as http:
            results["response"] = http.post("/v1/classify", json={"texts": ["a good film"]})

    thread = threading.Thread(target=request)
    thread.start()
    time.sleep(0.4)  # the request is on the model thread now
    server.stop()  # what SIGTERM does: stop accepting, finish in-flight requests, then exit
    thread.join(10)
    assert results["response"].status_code == 200
    assert results["response"].json()["results"][0]["label"] in ("negative", "positive")


def test_a_model_that_fails_to_load_exits_with_the_reason(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    for model in (str(tmp_path / "missing"), str(broken)):
        done = subprocess.run([sys.executable, "-m", "bertforge", "serve", "--model", model, "--port", "0"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0
        assert "cannot load" in done.stderr and model in done.stderr
