"""Feature extraction (Google's extract_features.py format) and the CLI commands of the foundation."""

import json

import pytest
import torch

from bertforge import BertModel
from bertforge.cli import main
from bertforge.tasks.embed import extract_features, read_examples
from bertforge.tokenization import BertTokenizer

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "dog", ".", "a", "##s"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, save_tiny_checkpoint):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), WORDS, preset="tiny", num_hidden_layers=3)


def test_output_matches_hidden_states(tiny_dir, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("the cat sat on the mat .\nthe dog sat ||| a cats\n")
    out = tmp_path / "out.jsonl"
    assert extract_features(tiny_dir, source, out, layers=[-1, 0], batch_size=2, progress=False) == 2
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["linex_index"] for r in records] == [0, 1]
    assert [f["token"] for f in records[1]["features"]] == ["[CLS]", "the", "dog", "sat", "[SEP]", "a", "cat", "##s", "[SEP]"]

    model = BertModel.from_pretrained(tiny_dir)
    tokenizer = BertTokenizer.from_pretrained(tiny_dir)
    enc = tokenizer.encode("the dog sat", "a cats")
    with torch.no_grad():
        hidden = model(torch.tensor([enc["input_ids"]]), torch.tensor([enc["token_type_ids"]]),
                       output_hidden_states=True).hidden_states
    for t, feature in enumerate(records[1]["features"]):
        assert [layer["index"] for layer in feature["layers"]] == [-1, 0]
        # Google rounds to 6 decimals; -1 is the last encoder layer and 0 the first (not the embeddings).
        assert feature["layers"][0]["values"] == pytest.approx(hidden[-1][0, t].tolist(), abs=1e-5)
        assert feature["layers"][1]["values"] == pytest.approx(hidden[1][0, t].tolist(), abs=1e-5)


def test_batching_and_padding_do_not_change_features(tiny_dir, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("the cat sat on the mat .\nthe dog\na cats sat on a mat ||| the dog .\n")
    one, three = tmp_path / "one.jsonl", tmp_path / "three.jsonl"
    extract_features(tiny_dir, source, one, layers=[-1], batch_size=1, progress=False)
    extract_features(tiny_dir, source, three, layers=[-1], batch_size=3, progress=False)
    for a, b in zip(one.read_text().splitlines(), three.read_text().splitlines()):
        fa, fb = json.loads(a)["features"], json.loads(b)["features"]
        assert [f["token"] for f in fa] == [f["token"] for f in fb]
        for x, y in zip(fa, fb):
            assert x["layers"][0]["values"] == pytest.approx(y["layers"][0]["values"], abs=2e-6)


def test_bad_input_is_named(tiny_dir, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("the cat\n\nthe dog\n")
    with pytest.raises(ValueError, match=r"in.txt:2: empty line"):
        read_examples(source)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        read_examples(tmp_path / "missing.txt")
    source.write_text("the cat\n")
    with pytest.raises(ValueError, match="layer index 5 out of range for a 3-layer model"):
        extract_features(tiny_dir, source, tmp_path / "o.jsonl", layers=[5], progress=False)
    assert not (tmp_path / "o.jsonl").exists()  # no half-written output


def test_cli_extract_features_and_errors(tiny_dir, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("the cat sat\n")
    out = tmp_path / "f.jsonl"
    assert main(["extract-features", "--model", str(tiny_dir), "--input-file", str(source),
                 "--output-file", str(out), "--layers", "-1,-2"]) == 0
    assert len(json.loads(out.read_text())["features"][0]["layers"]) == 2
    assert main(["extract-features", "--model", str(tmp_path / "nope"), "--input-file", str(source),
                 "--output-file", str(out), "--overwrite"]) == 2
    assert "nope" in capsys.readouterr().err


def test_cli_vocab(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat. The dog sat on the log.\n" * 50)
    vocab = tmp_path / "vocab.txt"
    assert main(["vocab", "--input", str(tmp_path / "*.txt"), "--vocab-size", "60", "--output", str(vocab), "--cased"]) == 0
    tokens = vocab.read_text().splitlines()
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert "The" in tokens  # cased
    assert main(["vocab", "--input", str(tmp_path / "none*.txt"), "--output", str(vocab), "--overwrite"]) == 2
    assert "no file matches" in capsys.readouterr().err
