"""benchmarks/gpu.py in its `--device cpu --tiny` mode: every part runs, in seconds, and prints one JSON
line with every row the GPU run reports, so that the one device call measures instead of debugging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu.py"

pytest.importorskip("transformers")  # the peer: a dev dependency


def run_tiny(*extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", *extra], capture_output=True,
                          text=True, env=env, timeout=300)


def test_the_tiny_mode_runs_every_part_and_prints_one_json_line():
    done = run_tiny()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["device"] == "cpu" and result["preset"] == "tiny" and result["precision"] == "bf16"
    assert result["failed_parts"] == []
    assert result["peak_bf16_tflops"] is None and "CPU" in result["peak_source"]
    for seq in ("seq32", "seq64"):
        row = result["pretrain"][seq]
        assert row["batch"] >= 1 and 0 <= row["padding_share"] < 1
        for side in ("bertforge", "transformers"):
            assert row[side]["tokens_per_second"] > 0 and row[side]["mfu"] is None  # no peak on a CPU
        assert row["speedup"] > 0
    for task in ("sst2", "mrpc"):
        row = result["finetune"][task]
        for side in ("bertforge", "transformers_dynamic_padding", "transformers_group_by_length"):
            assert row[side]["examples_per_second"] > 0
        assert row["padding_share_grouped"] < row["padding_share_dynamic"]  # grouping by length pads less
        assert row["speedup_vs_dynamic_padding"] > 0 and row["speedup_vs_group_by_length"] > 0
    for size in ("batch4", "batch8"):
        assert result["inference"][size]["speedup"] > 0 and result["inference"][size]["dtype"] == "bf16"
    loss = result["correctness"]["first_step_loss"]
    assert loss["ok"] and loss["abs_diff"] <= 1e-4 and loss["dtype"] == "float32"
    attention = result["correctness"]["packed_attention"]
    assert attention["ok"] and attention["varlen"].startswith("skipped: ")
    assert attention["packed_vs_fp32_reference"]["output_max_abs"] <= 1e-5


def test_an_unknown_part_is_refused_in_one_line():
    done = run_tiny("--parts", "pretrain,warp")
    assert done.returncode == 2 and "--parts: unknown part(s) warp" in done.stderr and not done.stdout


def test_the_peak_is_read_from_the_device_name():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu
    finally:
        sys.path.remove(str(SCRIPT.parent))
    names = {"NVIDIA H100 80GB HBM3": 989.0, "NVIDIA H200": 989.0, "NVIDIA H100 PCIe": 756.0,
             "NVIDIA H100 NVL": 835.0, "NVIDIA A100-SXM4-80GB": 312.0}
    for name, tflops in names.items():
        assert next(value for key, value, _ in gpu.PEAK_BF16 if key in name) == tflops
    assert not any(key in "Tesla T4" for key, _, _ in gpu.PEAK_BF16)


def test_profile_appends_each_sides_top_operators(tmp_path):
    profile = tmp_path / "profile.txt"
    done = run_tiny("--parts", "inference", "--profile", str(profile))
    assert done.returncode == 0, done.stderr
    text = profile.read_text()
    for size in (4, 8):
        for side in ("bertforge", "transformers"):
            assert f"== inference batch {size} / {side}: 1 steps" in text
    assert "aten::" in text  # an operator table, not only headers
