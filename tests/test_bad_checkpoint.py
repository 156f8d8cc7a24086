"""Through the command line, a checkpoint that disagrees with itself (issue #49, items 4 and 8) ends in one
line naming the field and the file, exit 2, before the work starts: `finetune` refuses before it tokenizes
its data or creates its output directory, `extract-features` and `predict` before a model is built."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.modeling import BertConfig, BertForSequenceClassification
from bertforge.tokenization import BertTokenizer

TEXTS = ["a good film .", "a bad film .", "the film was good .", "the film was bad ."] * 4



@pytest.fixture
def classifier(tmp_path) -> Path:
    """A tiny fine-tuned-looking classifier (random weights) that `predict` accepts."""
    directory = tmp_path / "classifier"
    directory.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "a", "the", "film", "was", "good", "bad"]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    BertTokenizer(directory / "vocab.txt", do_lower_case=True).save_pretrained(directory)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, id2label={0: "bad", 1: "good"})
    config.extra["finetuning_task"] = "classify"
    BertForSequenceClassification(config).save_pretrained(directory)
    return directory


def _edit(path: Path, **changes) -> None:
    values = json.loads(path.read_text())
    values.update(changes)
    path.write_text(json.dumps(values))


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, no traceback
    return err


def _classify_data(tmp_path: Path) -> Path:
    data = tmp_path / "train.csv"
    data.write_text("text,label\n" + "".join(f"{t},{i % 2}\n" for i, t in enumerate(TEXTS)), encoding="utf-8")
    return data


@pytest.mark.parametrize("change, message", [
    ({"num_hidden_layers": 3}, "{config}: num_hidden_layers is 3 but {weights} holds 6 encoder layers"),
    ({"num_hidden_layers": 100_000}, "{config}: num_hidden_layers is 100000 but {weights} holds 6 encoder layers"),
    ({"num_attention_heads": 0}, "{config}: num_attention_heads must be a whole number of at least 1, got 0"),
    ({"vocab_size": -5}, "{config}: vocab_size must be a whole number of at least 1, got -5"),
])
def test_finetune_refuses_a_bad_checkpoint_before_tokenizing_or_writing(minilm_copy, tmp_path, capsys, change,
                                                                       message):
    _edit(minilm_copy / "config.json", **change)
    data, output = _classify_data(tmp_path), tmp_path / "out"
    start = time.perf_counter()
    code = main(["finetune", "classify", "--model", str(minilm_copy), "--train-file", str(data), "--dev-file",
                 str(data), "--output-dir", str(output), "--epochs", "1", "--no-progress"])
    elapsed = time.perf_counter() - start
    assert code == 2
    expected = message.format(config=minilm_copy / "config.json", weights=minilm_copy / "model.safetensors")
    assert f"bertforge finetune: error: {expected}" in _error(capsys)
    assert not output.exists()
    assert elapsed < 3, f"{elapsed:.1f} s"


def test_finetune_refuses_a_vocabulary_that_is_not_the_models(minilm_copy, tmp_path, capsys):
    vocab = minilm_copy / "vocab.txt"
    vocab.write_text("".join(line + "\n" for line in vocab.read_text(encoding="utf-8").splitlines()[:1000]),
                     encoding="utf-8")
    data = _classify_data(tmp_path)
    assert main(["finetune", "classify", "--model", str(minilm_copy), "--train-file", str(data), "--dev-file",
                 str(data), "--output-dir", str(tmp_path / "out")]) == 2
    assert (f"error: {vocab} holds 1,000 tokens but vocab_size in {minilm_copy / 'config.json'} is 30,522 "
            f"(29,522 rows without a token)") in _error(capsys)


def test_extract_features_refuses_a_config_that_is_a_device(minilm_copy, tmp_path, capsys):
    config = minilm_copy / "config.json"
    config.unlink()
    config.symlink_to("/dev/zero")
    data = tmp_path / "in.txt"
    data.write_text("a good film .\n", encoding="utf-8")
    assert main(["extract-features", "--model", str(minilm_copy), "--input-file", str(data), "--output-file",
                 str(tmp_path / "f.jsonl")]) == 2
    assert f"error: {config}: not a regular file" in _error(capsys)


def test_extract_features_refuses_a_layer_count_the_weights_lack(minilm_copy, tmp_path, capsys):
    _edit(minilm_copy / "config.json", num_hidden_layers=3)
    data = tmp_path / "in.txt"
    data.write_text("a good film .\n", encoding="utf-8")
    assert main(["extract-features", "--model", str(minilm_copy), "--input-file", str(data), "--output-file",
                 str(tmp_path / "f.jsonl")]) == 2
    assert "num_hidden_layers is 3 but" in _error(capsys)


@pytest.mark.parametrize("file, change, message", [
    ("config.json", {"id2label": {"0": "bad", "2": "good"}}, "id2label's ids must be 0 to 1 without gaps; 1 is missing"),
    ("config.json", {"id2label": ["bad", "good"]}, "id2label must be a non-empty object"),
    ("config.json", {"pad_token_id": 12}, "pad_token_id must be a token id, from 0 to vocab_size - 1 (11)"),
    ("config.json", {"hidden_size": 32.0}, "hidden_size must be a whole number of at least 1, got 32.0"),
    ("config.json", {"layer_norm_eps": "1e-12"}, 'layer_norm_eps must be a finite number above 0, got "1e-12"'),
    ("config.json", {"num_hidden_layers": True}, "num_hidden_layers must be a whole number of at least 1, got true"),
    ("tokenizer_config.json", {"do_lower_case": "yes"}, 'do_lower_case must be true, false or null, got "yes"'),
])
def test_predict_names_the_field_and_file(classifier, tmp_path, capsys, file, change, message):
    _edit(classifier / file, **change)
    data = tmp_path / "in.csv"
    data.write_text("text\na good film .\n", encoding="utf-8")
    code = main(["predict", "--model", str(classifier), "--input", str(data), "--output", str(tmp_path / "p.tsv")])
    assert code == 2
    assert f"bertforge predict: error: {classifier / file}: {message}" in _error(capsys)
    assert not (tmp_path / "p.tsv").exists()


def test_predict_refuses_a_repeated_vocabulary_entry(classifier, tmp_path, capsys):
    vocab = classifier / "vocab.txt"
    vocab.write_text(vocab.read_text(encoding="utf-8").replace("\nbad\n", "\ngood\n"), encoding="utf-8")
    data = tmp_path / "in.csv"
    data.write_text("text\na good film .\n", encoding="utf-8")
    assert main(["predict", "--model", str(classifier), "--input", str(data), "--output", str(tmp_path / "p.tsv")]) == 2
    assert f"error: {vocab}: line 12 repeats the token 'good' of line 11" in _error(capsys)


def test_predict_refuses_a_pickle_with_our_advice(classifier, tmp_path, capsys):
    class Code:
        def __reduce__(self):
            return (print, ("ran",))

    (classifier / "model.safetensors").unlink()
    torch.save({"classifier.weight": Code()}, classifier / "pytorch_model.bin")
    data = tmp_path / "in.csv"
    data.write_text("text\na good film .\n", encoding="utf-8")
    assert main(["predict", "--model", str(classifier), "--input", str(data), "--output", str(tmp_path / "p.tsv")]) == 2
    err = _error(capsys)
    assert f"error: {classifier / 'pytorch_model.bin'}: refused: the file holds pickled Python objects" in err
    assert "convert it to model.safetensors" in err and "weights_only" not in err
