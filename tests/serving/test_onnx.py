"""ONNX export: parity with PyTorch for every pipeline, dynamic axes, the CLI, backend="onnx"."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("onnx", reason="the onnx extra is not installed (pip install 'bertforge[onnx]')")
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed (pip install 'bertforge[onnx]')")

from bertforge.cli import main  # noqa: E402
from bertforge.serving import pipeline  # noqa: E402
from bertforge.modeling import BertForTokenClassification  # noqa: E402
from bertforge.serving.graphs import LogitsGraph  # noqa: E402
from bertforge.serving.onnx import OnnxParityError, OnnxRunner, export_onnx, export_onnx_bytes, parity  # noqa: E402
from bertforge.serving.pipelines import BASE_INPUTS  # noqa: E402

TASKS = ["fill-mask", "classify", "tag", "answer", "embed", "multiple-choice"]


@pytest.mark.parametrize("task", TASKS)
def test_export_matches_torch_on_dynamic_shapes(tiny_dirs, tmp_path, task):
    report = export_onnx(tiny_dirs[task], tmp_path / f"{task}.onnx")
    assert report.task == task and report.path.is_file()
    assert report.max_abs_diff <= 1e-4 and report.batches_checked == 3
    pipe = pipeline(task, model=tiny_dirs[task])
    runner = OnnxRunner(report.path, pipe.input_names, pipe.output_names, task=task)
    # Shapes the export never saw: batch 7, 50 tokens, padding.
    worst, _ = parity(pipe, pipe.runner, runner, [pipe.sample_batch(7, 50, seed=9)])
    assert worst <= 1e-4


def test_pipelines_agree_across_backends(tiny_dirs):
    texts = ["John Smith lives in Paris, France.", "a good film", "the story was fun and the movie great"]
    torch_pipe = pipeline("classify", model=tiny_dirs["classify"])
    onnx_pipe = pipeline("classify", model=tiny_dirs["classify"], backend="onnx")
    for a, b in zip(torch_pipe(texts, text_pairs=texts[::-1]), onnx_pipe(texts, text_pairs=texts[::-1])):
        assert a["label"] == b["label"] and a["score"] == pytest.approx(b["score"], abs=1e-5)
    a = pipeline("tag", model=tiny_dirs["tag"])(texts)
    b = pipeline("tag", model=tiny_dirs["tag"], backend="onnx")(texts)
    assert [[(e["entity"], e["start"], e["end"]) for e in r] for r in a] == \
        [[(e["entity"], e["start"], e["end"]) for e in r] for r in b]
    fill = ["Paris is the [MASK] of France."]
    assert [c["token"] for c in pipeline("fill-mask", model=tiny_dirs["fill-mask"])(fill)[0][0]] == \
        [c["token"] for c in pipeline("fill-mask", model=tiny_dirs["fill-mask"], backend="onnx")(fill)[0][0]]


def test_a_tag_model_exported_before_word_positions_still_runs(tiny_dirs):
    """An ONNX tag file from before the graph took `word_positions` (logits at every token, (B, S, K)):
    the runner gathers its logits at the words, and the answers are torch's."""
    torch_pipe = pipeline("tag", model=tiny_dirs["tag"])
    old = SimpleNamespace(task="tag", input_names=BASE_INPUTS, extra_input_names=(), output_names=("logits",),
                          output_axes={"logits": {0: "batch", 1: "sequence"}}, rows_selected_by={},
                          build_graph=LogitsGraph, sample_batch=torch_pipe.sample_batch)
    data = export_onnx_bytes(old, BertForTokenClassification.from_pretrained(tiny_dirs["tag"]))
    onnx_pipe = pipeline("tag", model=tiny_dirs["tag"], backend="onnx", onnx_model=data)
    assert onnx_pipe.runner.gathered == {"word_positions": "logits"}
    texts = ["John Smith lives in Paris, France.", " ".join(["the film was fun"] * 30) + " Mary Jones."]
    for a, b in zip(torch_pipe(texts, aggregation="none", stride=20), onnx_pipe(texts, aggregation="none", stride=20)):
        assert [(w["label"], w["start"], w["end"]) for w in a] == [(w["label"], w["start"], w["end"]) for w in b]
        assert [w["score"] for w in a] == pytest.approx([w["score"] for w in b], abs=1e-5)


def test_onnx_file_for_the_wrong_task_is_refused(tiny_dirs, tmp_path):
    path = export_onnx(tiny_dirs["classify"], tmp_path / "c.onnx").path
    with pytest.raises(ValueError, match="classify"):
        pipeline("embed", model=tiny_dirs["classify"], backend="onnx", onnx_model=path)
    assert pipeline("classify", model=tiny_dirs["classify"], backend="onnx", onnx_model=path)(["a"])[0]["label"]


def test_parity_failure_is_loud(tiny_dirs, tmp_path, monkeypatch):
    import bertforge.serving.onnx as onnx_module

    monkeypatch.setattr(onnx_module, "parity", lambda *args, **kwargs: (0.5, 3))
    with pytest.raises(OnnxParityError, match="0.5"):
        export_onnx(tiny_dirs["classify"], tmp_path / "bad.onnx")
    assert not (tmp_path / "bad.onnx").exists()
    with pytest.raises(SystemExit, match="differs from PyTorch"):
        main(["export-onnx", "--model", str(tiny_dirs["classify"]), "--output", str(tmp_path / "bad.onnx")])


def test_cli_export(tiny_dirs, tmp_path, capsys):
    output = tmp_path / "tag.onnx"
    assert main(["export-onnx", "--model", str(tiny_dirs["tag"]), "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    assert "tag pipeline" in printed and "max |torch - onnxruntime|" in printed and output.is_file()


def test_minilm_embed_export(minilm_dir, tmp_path):
    report = export_onnx(minilm_dir, tmp_path / "minilm.onnx", task="embed")
    assert report.max_abs_diff <= 1e-4
    sentences = ["A man is eating food.", "The new movie is awesome and I loved every minute of it."]
    expected = pipeline("embed", model=minilm_dir)(sentences)
    actual = pipeline("embed", model=minilm_dir, backend="onnx", onnx_model=report.path)(sentences)
    np.testing.assert_allclose(actual, expected, atol=1e-5)
