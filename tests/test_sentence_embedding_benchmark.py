"""benchmarks/sentence_embedding.py --quick: both sides (bertforge's CLI and sentence-transformers' own loss in a
plain loop) fine-tune the same tiny checkpoint on a toy STS task at the same recipe and report their dev scores."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sentence_transformers")

REPO = Path(__file__).resolve().parents[1]


def test_quick_runs_both_sides_at_one_recipe():
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "sentence_embedding.py"), "--quick"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["recipe"]["batch_size"] == 16 and result["recipe"]["loss"] == "cosine"
    for side in ("ours", "peer"):
        run, = result["sides"][side]["runs"]
        assert math.isfinite(run["spearman"]) and -1 <= run["spearman"] <= 1 and run["wall_s"] > 0
