"""Classification of inputs longer than max_seq_length: `--long-input windows` (overlapping windows, mean logits)."""

import json
import random
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from bertforge.cli import main
from bertforge.tasks.classify import classify_task, predict_examples, predict_file
from bertforge.tasks.classify_features import convert_examples_to_features, convert_examples_to_window_features
from bertforge.tasks.classify_reader import InputExample
from bertforge.tokenization import BertTokenizer
from bertforge.training.finetune import FinetuneArguments, finetune

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "cat", "dog", "sat", "ran", "on", "mat",
         "far", "and", "then", "good", "bad", "."]
FILLER = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "far", "and", "then", "."]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, save_tiny_checkpoint):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_long"), WORDS, preset="tiny", max_position_embeddings=64)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return BertTokenizer.from_pretrained(tiny_dir)


def _document(rng: random.Random, label: str, length: int = 40) -> str:
    """Filler words, with the label's word ("good"/"bad") only at the very end: past any 16-token window."""
    return " ".join(rng.choice(FILLER) for _ in range(length)) + f" {label}"


# ---------------------------------------------------------------------------- window features

def test_windows_cover_a_long_text_each_with_the_label(tokenizer):
    text = " ".join(FILLER * 3)  # 36 tokens
    (truncated,) = convert_examples_to_features([InputExample("t-0", text, None, "good")], tokenizer,
                                                ["bad", "good"], max_seq_length=16)
    features = convert_examples_to_window_features([InputExample("t-0", text, None, "good")], tokenizer,
                                                   ["bad", "good"], max_seq_length=16)
    content = tokenizer.encode(text, max_length=1000)["input_ids"][1:-1]
    assert len(content) == 36 and len(features) > 1
    assert features[0]["input_ids"] == truncated["input_ids"]  # the first window is the truncated input
    assert all(f["label"] == 1 and f["example"] == 0 and len(f["input_ids"]) <= 16 for f in features)
    assert all(f["input_ids"][0] == tokenizer.cls_token_id and f["input_ids"][-1] == tokenizer.sep_token_id
               for f in features)
    # default stride: half a window (14 tokens -> starts 7 apart), as run_squad's doc spans: the last
    # window holds what is left
    pieces = [f["input_ids"][1:-1] for f in features]
    assert [len(p) for p in pieces] == [14, 14, 14, 14, 8]
    assert pieces[1] == content[7:21] and pieces[-1] == content[28:]
    strided = convert_examples_to_window_features([InputExample("t-0", text, None, "good")], tokenizer,
                                                  ["bad", "good"], max_seq_length=16, stride=14)
    assert [f["input_ids"][1:-1] for f in strided] == [content[0:14], content[14:28], content[28:36]]


def test_short_inputs_give_one_window_equal_to_truncation(tokenizer):
    examples = [InputExample("s-0", "the cat sat", None, "bad"), InputExample("s-1", "a dog", "ran far", "good")]
    windowed = convert_examples_to_window_features(examples, tokenizer, ["bad", "good"], max_seq_length=16)
    plain = convert_examples_to_features(examples, tokenizer, ["bad", "good"], max_seq_length=16)
    assert [{k: v for k, v in f.items() if k != "example"} for f in windowed] == plain
    assert [f["example"] for f in windowed] == [0, 1]


def test_pairs_window_the_longer_text_and_keep_the_shorter(tokenizer):
    example = InputExample("p-0", "a dog ran", " ".join(FILLER * 2), "good")
    features = convert_examples_to_window_features([example], tokenizer, ["bad", "good"], max_seq_length=16)
    assert len(features) > 1
    for f in features:
        tokens = tokenizer.convert_ids_to_tokens(f["input_ids"])
        assert tokens[:5] == ["[CLS]", "a", "dog", "ran", "[SEP]"] and tokens[-1] == "[SEP]"
        assert f["token_type_ids"] == [0] * 5 + [1] * (len(tokens) - 5) and len(tokens) <= 16


# ---------------------------------------------------------------------------- aggregation

class KeywordModel(nn.Module):
    """A stand-in classifier: logit 1 is 10 when the window holds `keyword`, else 0. Logits (B, 2)."""

    def __init__(self, keyword: int):
        super().__init__()
        self.keyword = keyword
        self.anchor = nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, **_):
        hit = (input_ids == self.keyword).any(-1).float() * 10
        return SimpleNamespace(logits=torch.stack([torch.zeros_like(hit), hit], -1))


def test_a_long_documents_label_comes_from_its_windows_not_its_truncation(tokenizer):
    rng = random.Random(0)
    examples = [InputExample(f"d-{i}", _document(rng, label), None, label) for i, label in
                enumerate(["good", "bad", "good", "good", "bad"])]
    model = KeywordModel(tokenizer.vocab["good"])
    truncated = convert_examples_to_features(examples, tokenizer, ["bad", "good"], max_seq_length=16)
    windowed = convert_examples_to_window_features(examples, tokenizer, ["bad", "good"], max_seq_length=16)
    # truncation drops the last word: every document looks like "bad"
    assert predict_examples(model, truncated, batch_size=3).argmax(-1).tolist() == [0, 0, 0, 0, 0]
    logits = predict_examples(model, windowed, batch_size=3)  # batches mix windows of different documents
    assert logits.shape == (5, 2) and logits.argmax(-1).tolist() == [1, 0, 1, 1, 0]
    # the mean: a "good" document's keyword lies in the windows covering its end, out of all its windows
    count = [sum(f["example"] == 0 for f in windowed), sum(f["example"] == 0 and
             tokenizer.vocab["good"] in f["input_ids"] for f in windowed)]
    assert logits[0, 1] == pytest.approx(10 * count[1] / count[0])


# ---------------------------------------------------------------------------- end to end

def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_tiny_finetune_with_windows_learns_what_truncation_cannot(tiny_dir, tmp_path):
    rng = random.Random(1)
    labels = ["good", "bad"] * 24
    # 20 filler tokens + the keyword: two 14-token windows, the keyword only in the second
    train = _write_jsonl(tmp_path / "train.jsonl", [{"text": _document(rng, y, 20), "label": y} for y in labels])
    dev = _write_jsonl(tmp_path / "dev.jsonl", [{"text": _document(rng, y, 20), "label": y} for y in labels[:20]])
    args = dict(lr=2e-3, epochs=6, batch_size=16, warmup_ratio=0.0, progress=False, log_every=1000, device="cpu")

    windows = classify_task(tiny_dir, train, dev, max_seq_length=16, long_input="windows")
    assert len(windows.train_features) == 2 * 48  # two windows per document, each a training feature
    result = finetune(windows, FinetuneArguments(tmp_path / "win", **args))
    assert result["metrics"]["accuracy"] >= 0.9
    truncate = classify_task(tiny_dir, train, dev, max_seq_length=16)
    assert finetune(truncate, FinetuneArguments(tmp_path / "cut", **args))["metrics"]["accuracy"] <= 0.7

    config = json.loads((tmp_path / "win" / "config.json").read_text())
    assert config["long_input"] == "windows"
    records = [json.loads(line) for line in (tmp_path / "win" / "dev_predictions.jsonl").read_text().splitlines()]
    assert len(records) == 20  # one prediction per document, not per window

    # predict windows by default (the model's config), and the CLI can say so or override it
    unlabelled = _write_jsonl(tmp_path / "test.jsonl", [{"text": r["text_a"]} for r in records])
    path = predict_file(tmp_path / "win", unlabelled, tmp_path / "pred.tsv", max_seq_length=16)
    predicted = [line.split("\t")[1] for line in path.read_text().splitlines()[1:]]
    assert predicted == [r["prediction"] for r in records]
    assert main(["predict", "--model", str(tmp_path / "win"), "--input", str(unlabelled), "--output",
                 str(tmp_path / "cut.tsv"), "--max-seq-length", "16", "--long-input", "truncate"]) == 0
    cut = [line.split("\t")[1] for line in (tmp_path / "cut.tsv").read_text().splitlines()[1:]]
    assert len(cut) == 20 and cut != predicted


def test_cli_classify_long_input_flags(tiny_dir, tmp_path, capsys):
    rng = random.Random(2)
    rows = [{"text": _document(rng, y, 20), "label": y} for y in ["good", "bad"] * 4]
    train = _write_jsonl(tmp_path / "train.jsonl", rows)
    code = main(["finetune", "classify", "--train-file", str(train), "--dev-file", str(train), "--model",
                 str(tiny_dir), "--output-dir", str(tmp_path / "out"), "--epochs", "1", "--no-progress",
                 "--max-seq-length", "16", "--long-input", "windows", "--doc-stride", "5",
                 "--test-file", str(train)])
    assert code == 0, capsys.readouterr().err
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["long_input"], config["window_stride"]) == ("windows", 5)
    assert len((tmp_path / "out" / "test_predictions.tsv").read_text().splitlines()) == 9
    with pytest.raises(SystemExit):
        main(["finetune", "classify", "--train-file", "t", "--dev-file", "d", "--model", "m", "--output-dir", "o",
              "--long-input", "chunks"])


def test_cli_glue_long_input_windows_and_its_submission(tiny_dir, tmp_path):
    rng = random.Random(3)
    task_dir = tmp_path / "glue" / "SST-2"
    task_dir.mkdir(parents=True)
    for split, count in (("train", 16), ("dev", 8)):
        rows = [(_document(rng, y, 20), "1" if y == "good" else "0") for y in ["good", "bad"] * (count // 2)]
        (task_dir / f"{split}.tsv").write_text("\n".join(["sentence\tlabel"] + [f"{s}\t{y}" for s, y in rows]) + "\n")
    test = ["index\tsentence"] + [f"{i}\t{_document(rng, 'good', 20)}" for i in range(5)]
    (task_dir / "test.tsv").write_text("\n".join(test) + "\n")
    out = tmp_path / "out"
    assert main(["finetune", "glue", "--task", "SST-2", "--data-dir", str(tmp_path / "glue"), "--model", str(tiny_dir),
                 "--output-dir", str(out), "--epochs", "1", "--max-seq-length", "16", "--long-input", "windows",
                 "--no-progress"]) == 0
    assert json.loads((out / "config.json").read_text())["long_input"] == "windows"
    assert len((out / "dev_predictions.jsonl").read_text().splitlines()) == 8  # per sentence, not per window
    submission = (out / "SST-2.tsv").read_text()
    assert len(submission.splitlines()) == 6
    assert main(["predict", "--model", str(out), "--input", str(task_dir / "test.tsv"), "--output",
                 str(tmp_path / "again.tsv"), "--max-seq-length", "16"]) == 0
    assert (tmp_path / "again.tsv").read_text() == submission
