"""The `bertforge` command: sub-commands that wrap the foundation, and its error handling."""

import json
from pathlib import Path

from bertforge import BertForPreTraining
from bertforge.cli import main

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


def test_quickstart(tmp_path, capsys):
    assert main(["quickstart", "--output-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "Shakespeare" in printed and "features" in printed
    assert (tmp_path / "model" / "model.safetensors").is_file()
    assert (tmp_path / "features.jsonl").read_text().count("\n") == 3
