"""benchmarks/serve_load.py --at-limits: its multi-head checkpoint serves every pipeline it loads, its
requests sit exactly at the server's limits (one more row, [MASK] or text is refused), and its slow
sockets are closed by the header timeout and opened again."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed (pip install 'bertforge[serve]')")
pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install 'bertforge[serve]')")

from starlette.testclient import TestClient  # noqa: E402

from bertforge.serving import pipeline  # noqa: E402
from bertforge.serving.limits import RequestLimits  # noqa: E402
from bertforge.serving.server import create_app  # noqa: E402
from bertforge.serving.server_settings import ServerSettings  # noqa: E402

from .conftest import WORDS  # noqa: E402
from .live import LiveServer  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import serve_load  # noqa: E402

sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def served(tiny_dirs, tmp_path_factory):
    model = serve_load.build_multi_head_checkpoint(tiny_dirs["embed"], tmp_path_factory.mktemp("multi") / "model")
    pipes = {task: pipeline(task, model=model) for task in serve_load.AT_LIMITS_TASKS}
    return model, pipes


def test_at_limit_requests_are_served_and_one_step_further_is_refused(served):
    model, pipes = served
    sentences = [" ".join(WORDS[i:i + 8]) for i in range(0, len(WORDS) - 8, 3)] * 4
    settings = ServerSettings(limits=RequestLimits(max_rows=12, max_predictions=120, max_top_k=20))
    with TestClient(create_app(pipes, settings)) as client:
        health = client.get("/health").json()
        bodies = serve_load.at_limit_bodies(health, model, sentences)
        assert set(bodies) == {"fill-mask", "tag", "answer", "embed"}
        headers = {"content-type": "application/json"}
        for name, body in bodies.items():
            r = client.post(f"/v1/{name}", content=body, headers=headers)
            assert r.status_code == 200, (name, r.text[:200])
        fill = json.loads(bodies["fill-mask"])
        assert fill["top_k"] == 20 and fill["texts"][0].count("[MASK]") == 6  # 6 x 20 = 120 predictions
        fill["texts"][0] += " [MASK]"
        assert "max_predictions" in client.post("/v1/fill-mask", json=fill).json()["error"]
        tag = json.loads(bodies["tag"])
        assert tag["stride"] == 16  # a quarter of the tiny models' 64 tokens
        tag["texts"].append(tag["texts"][0])
        assert "max_rows" in client.post("/v1/tag", json=tag).json()["error"]
        r = client.post("/v1/embed", json={"texts": [serve_load.SMALL_TEXT]})
        assert r.status_code == 200
        embed = json.loads(bodies["embed"])  # issue 61's load: max_texts texts of up to max_chars characters
        assert len(embed["texts"]) == health["limits"]["max_texts"]
        assert len(embed["texts"][0]) <= health["limits"]["max_chars"]
        tokens = serve_load.body_tokens(model, bodies, None)  # what the server counts for admission
        assert 0 < tokens["tag"] <= 12 * 64 and tokens["embed"] == 64 * 64  # rows x at most 64 tokens


def test_slow_sockets_are_closed_by_the_header_timeout_and_renewed(served):
    _, pipes = served
    app = create_app({"embed": pipes["embed"]}, ServerSettings(header_timeout_s=0.3))
    with LiveServer(app) as server, serve_load.SlowSockets(server.port, 3) as slow:
        time.sleep(1.2)
    summary = slow.summary()
    assert summary["slow_closed_by_server"]["408"] >= 6 and summary["slow_connect_errors"] == 0
