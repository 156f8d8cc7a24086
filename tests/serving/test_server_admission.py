"""Issue 61's server findings: admission control by queued work (429 with Retry-After past
`max_queued_tokens`) and a shutdown that drains on time (queued requests answered 503 at once and
never computed, the running call bounded by the graceful timeout, no 500, no traceback).

The queues are made deterministic with a deliberately slow runner (each forward batch sleeps);
traffic stays on loopback and every wait is bounded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed (pip install 'bertforge[serve]')")
pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'bertforge[serve]')")
httpx = pytest.importorskip("httpx", reason="httpx is needed for the server tests")

from bertforge.serving import pipeline  # noqa: E402
from bertforge.serving import batching  # noqa: E402
from bertforge.serving.admission import least_work_tokens, work_tokens  # noqa: E402
from bertforge.serving.server import create_app  # noqa: E402
from bertforge.serving.server_settings import ServerSettings  # noqa: E402
from bertforge.tokenization import BertTokenizer  # noqa: E402

from .live import LiveServer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_work_is_counted_in_model_tokens(tiny_dirs):
    classify = pipeline("classify", model=tiny_dirs["classify"])
    assert work_tokens(classify, {"texts": ["a good film", "bad"]}, {}) == (3 + 2) + (1 + 2)
    assert work_tokens(classify, {"texts": ["a good film " * 40]}, {}) == classify.max_length  # cut to 64
    tag = pipeline("tag", model=tiny_dirs["tag"])
    long = "john smith lives in paris . " * 20  # 120 word pieces: windows (0, 62), (31, 93), (62, 120)
    assert work_tokens(tag, {"texts": [long]}, {"stride": 31}) == 62 + 62 + 58 + 2 * 3
    answer = pipeline("answer", model=tiny_dirs["answer"])
    assert work_tokens(answer, {"questions": ["who ?"], "contexts": ["john smith"]}, {}) == 2 + 2 + 3
    assert work_tokens(classify, {"texts": ["a good film"], "text_pairs": ["bad"]}, {}) == 3 + 1 + 3
    # Similarity: a row per query and per candidate, each alone; multiple choice: a row per ending.
    similarity = pipeline("similarity", model=tiny_dirs["embed"])
    ranked = {"queries": ["a good film"], "texts": [["a good film", "bad"]]}
    assert work_tokens(similarity, ranked, {}) == (3 + 2) + (3 + 2) + (1 + 2)
    choice = pipeline("multiple-choice", model=tiny_dirs["multiple-choice"])
    endings = {"contexts": ["a good film"], "endings": [["bad", "a good film"]]}
    assert work_tokens(choice, endings, {}) == (3 + 1 + 3) + (3 + 3 + 3)
    # The lower bound counted without the tokenizer (words), never above the count.
    for pipe, inputs, options in ((classify, {"texts": ["a good film", "unbelievably, bad!"]}, {}),
                                  (classify, {"texts": ["a good film " * 40]}, {}),
                                  (tag, {"texts": [long]}, {"stride": 31}),
                                  (answer, {"questions": ["who ?"], "contexts": [long]}, {}),
                                  (similarity, ranked, {}), (choice, endings, {})):
        assert 0 < least_work_tokens(pipe, inputs, options) <= work_tokens(pipe, inputs, options)


def _slow_classify(tiny_dirs, seconds: float):
    base = pipeline("classify", model=tiny_dirs["classify"])

    def slow(batch):
        time.sleep(seconds)
        return base.runner(batch)

    return pipeline("classify", model=base.model_dir, runner=slow)


def test_a_request_past_the_queued_work_bound_gets_429_with_retry_after(tiny_dirs, monkeypatch):
    """One request runs, one waits (admitted: nothing waits before it), the next of the same size
    would put the queued work over the bound: 429 with Retry-After, refused on its words alone (not
    tokenized), while both admitted ones succeed. A small request is admitted still: no waiting work
    goes before it."""
    counted = []
    monkeypatch.setattr(batching, "work_tokens", lambda *args: counted.append(args) or work_tokens(*args))
    pipe = _slow_classify(tiny_dirs, 0.8)
    texts = ["a good film " * 4] * 4  # 4 rows of 12 + 2 tokens: 56 tokens
    tokens = work_tokens(pipe, {"texts": texts}, {})
    app = create_app({"classify": pipe}, ServerSettings(micro_batching=False, max_queued_tokens=tokens + tokens // 2))
    responses: dict[str, httpx.Response] = {}

    def send(name: str, body_texts: list[str]) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            responses[name] = http.post("/v1/classify", json={"texts": body_texts})

    with LiveServer(app) as server:
        threads = []
        for name in ("running", "waiting"):
            threads.append(threading.Thread(target=send, args=(name, texts)))
            threads[-1].start()
            time.sleep(0.3)  # the first is on the model thread; the second waits behind it
        send("refused", texts)
        send("small", ["bad"])  # cheaper: it runs before the waiting one, so nothing waits before it
        for thread in threads:
            thread.join(30)
    refused = responses["refused"]
    assert refused.status_code == 429, refused.text
    assert int(refused.headers["retry-after"]) >= 1
    assert "max_queued_tokens" in refused.json()["error"]
    assert [responses[n].status_code for n in ("running", "waiting", "small")] == [200, 200, 200]
    assert len(responses["waiting"].json()["results"]) == 4
    assert len(counted) == 3  # running, waiting and small: the refused one was not tokenized


def test_a_cheaper_request_may_not_overtake_a_waiting_one_past_the_bound(tiny_dirs):
    """The batcher runs cheaper requests first, so a large waiting request would wait for every
    cheaper one admitted after it: one larger than a forward batch is refused when it would overtake
    a waiting request by more than that one's budget (the bound less its own work and the work before
    it); one of a forward batch or less still overtakes it."""
    pipe = _slow_classify(tiny_dirs, 0.6)
    waiting = ["a good film " * 30] * 4  # 1,440 characters, 4 rows of 64 tokens: 256
    overtaking = ["a " * 30] * 4  # 240 characters (a cheaper class), 4 rows of 32 tokens: 128
    assert work_tokens(pipe, {"texts": waiting}, {}) == 256 and work_tokens(pipe, {"texts": overtaking}, {}) == 128
    settings = ServerSettings(micro_batching=False, max_batch_tokens=64, max_queued_tokens=256 + 100)
    app = create_app({"classify": pipe}, settings)
    responses: dict[str, httpx.Response] = {}

    def send(name: str, body_texts: list[str]) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            responses[name] = http.post("/v1/classify", json={"texts": body_texts})

    with LiveServer(app) as server:
        threads = []
        for name, texts in (("running", ["a good film"]), ("waiting", waiting)):
            threads.append(threading.Thread(target=send, args=(name, texts)))
            threads[-1].start()
            time.sleep(0.25)
        send("overtaking", overtaking)  # nothing of its class or cheaper waits, but 128 > the budget of 100
        send("small", ["bad"])  # one forward batch: overtakes freely
        for thread in threads:
            thread.join(30)
    assert responses["overtaking"].status_code == 429, responses["overtaking"].text
    assert "may wait for 100 more" in responses["overtaking"].json()["error"]
    assert int(responses["overtaking"].headers["retry-after"]) >= 1
    assert [responses[n].status_code for n in ("running", "waiting", "small")] == [200, 200, 200]


def test_settings_refuse_a_bound_that_is_not_positive():
    with pytest.raises(ValueError, match="max_queued_tokens must be positive, got 0"):
        ServerSettings(max_queued_tokens=0)


# -- SIGTERM with a queue of slow jobs, in a real `serve` process

CHILD = textwrap.dedent("""
    import json, sys, time
    from bertforge.serving import pipeline, server
    from bertforge.serving.server_settings import ServerSettings

    model_dir, port, log, graceful = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    base = pipeline("classify", model=model_dir)

    def slow(batch):  # one forward batch: its start logged (ids, monotonic time), then 0.4 s
        with open(log, "a") as handle:
            handle.write(json.dumps({"ids": batch["input_ids"].tolist(), "t": time.monotonic()}) + "\\n")
        time.sleep(0.4)
        return base.runner(batch)

    slow_pipe = pipeline("classify", model=model_dir, runner=slow)
    server.load_pipelines = lambda *args, **kwargs: {"classify": slow_pipe}
    server.serve(model_dir, port=port, settings=ServerSettings(micro_batching=False, max_batch_size=1),
                 graceful_timeout=graceful)
""")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_sigterm_answers_the_queue_503_and_exits_within_the_graceful_timeout(tiny_dirs, tmp_path):
    """A call of 8 slow forward batches (3.2 s) runs, three more of its size wait; SIGTERM with a
    2 s graceful timeout: the waiting ones are answered 503 (Retry-After) at once and never computed,
    the running one 503 before the timeout and its call stops at its next forward batch; the process
    exits within the timeout plus a margin, with no 500 and no traceback in its log."""
    model, port, log, graceful = tiny_dirs["classify"], _free_port(), tmp_path / "batches.jsonl", 2.0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(model), str(port), str(log), str(graceful)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert child.poll() is None, child.stdout.read()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        answers: dict[str, tuple[int, dict, float]] = {}

        def send(name: str, word: str) -> None:
            with httpx.Client(base_url=url, timeout=60) as http:
                r = http.post("/v1/classify", json={"texts": [f"{word} film"] * 8})
                answers[name] = (r.status_code, dict(r.headers), time.monotonic())

        threads = [threading.Thread(target=send, args=("running", "great"))]
        threads[0].start()
        time.sleep(0.3)
        for i in range(3):  # the same size class as the running call: they wait, none runs in its gaps
            threads.append(threading.Thread(target=send, args=(f"queued{i}", "boring")))
            threads[-1].start()
        time.sleep(0.5)
        sigterm = time.monotonic()
        child.send_signal(signal.SIGTERM)
        output, _ = child.communicate(timeout=60)
        exited = time.monotonic() - sigterm
        for thread in threads:
            thread.join(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    assert exited < graceful + 3.0, (exited, output)
    assert "Traceback" not in output and "CancelledError" not in output, output
    statuses = {name: answer[0] for name, answer in answers.items()}
    assert statuses == {"running": 503, "queued0": 503, "queued1": 503, "queued2": 503}, (statuses, output)
    assert all(int(answer[1]["retry-after"]) >= 1 for answer in answers.values())
    for i in range(3):  # the queued ones at once, not after the running call
        assert answers[f"queued{i}"][2] - sigterm < 1.0, answers
    assert answers["running"][2] - sigterm < graceful, answers
    tokenizer = BertTokenizer.from_pretrained(model)
    boring = tokenizer.convert_tokens_to_ids(["boring"])[0]
    batches = [json.loads(line) for line in log.read_text().splitlines()]
    assert not any(boring in row for batch in batches for row in batch["ids"])  # no queued job computed
    assert len(batches) < 8  # the running call stopped early
    # No forward batch began after its client was answered.
    assert max(batch["t"] for batch in batches) < answers["running"][2], (batches, answers)
