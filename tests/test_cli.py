"""The `bertforge` command: sub-commands that wrap the foundation, and its error handling."""

import json
import sys
from pathlib import Path

from bertforge import BertForPreTraining
from bertforge.cli import main
from bertforge.quickstart import run_quickstart

FIXTURE = Path(__file__).parent / "fixtures" / "tf_bert_tiny"


def test_convert_tf(tmp_path, capsys):
    out = tmp_path / "converted"
    assert main(["convert-tf", str(FIXTURE / "bert_model.ckpt"), str(out)]) == 0
    assert "converted" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"}
    model = BertForPreTraining.from_pretrained(out)
    assert model.load_report.newly_initialized == []
    assert json.loads((out / "config.json").read_text())["hidden_size"] == model.config.hidden_size


def test_convert_tf_missing_checkpoint(tmp_path, capsys):
    assert main(["convert-tf", str(tmp_path / "nothing" / "bert_model.ckpt"), str(tmp_path / "out")]) == 2
    assert "nothing" in capsys.readouterr().err


def test_quickstart_pipeline_learns(tmp_path, capsys):
    # The real pipeline, shortened: the held-out masked-LM loss must fall from its first evaluation.
    run_quickstart(tmp_path, vocab_size=3000, max_steps=60, batch_size=16, genre_epochs=1, genre_max_examples=256)
    printed = capsys.readouterr().out
    for stage in ("corpus:", "vocab:", "instances:", "pre-training:", "plots:", "fill-mask", "features:",
                  "fine-tuning:"):
        assert stage in printed
    report = json.loads((tmp_path / "report.json").read_text())
    genre = report["genre"]
    assert 0.3 < genre["majority_class"] < 0.5  # three genres, one held-out play each
    assert set(genre) == {"majority_class", "pre-trained", "random init"}
    assert (tmp_path / "genre_pre_trained" / "eval_results.json").is_file()
    assert report["held_out_last_eval"]["eval_mlm_loss"] < report["held_out_first_eval"]["eval_mlm_loss"]
    assert (tmp_path / "pretrain" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "features.jsonl").read_text().count("\n") == 2


def test_serve_without_the_serve_extra_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    # starlette made unimportable (None in sys.modules), the server module forgotten so it is imported again.
    monkeypatch.setitem(sys.modules, "starlette", None)
    monkeypatch.delitem(sys.modules, "bertforge.serving.server", raising=False)
    assert main(["serve", "--model", str(tmp_path)]) == 2
    assert capsys.readouterr().err == ("bertforge serve: error: starlette is not installed: "
                                       "pip install 'bertforge[serve]' (starlette and uvicorn)\n")
