"""Multi-label classification: the head against transformers' (loss and gradients), metrics and threshold
tuning against known answers and scikit-learn, the readers and their bad inputs, the pipeline's output, and
`bertforge finetune multi-label` + `bertforge predict` end to end (a learnable toy task and GoEmotions rows)."""

from __future__ import annotations

import importlib.util
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score, precision_score, recall_score

from bertforge.cli import main
from bertforge.modeling import BertForSequenceClassification, plans
from bertforge.serving import pipeline
from bertforge.tasks.multi_label import (THRESHOLD_GRID, collate, label_thresholds, multi_hot, multi_label_metrics,
                                         multi_label_task, sigmoid, tune_thresholds)
from bertforge.training.finetune import FinetuneArguments, finetune
from bertforge.tasks.multi_label_reader import read_label_names, read_multi_label_file
from bertforge.tokenization import BertTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

EMOTIONS = ["joy", "anger", "fear", "neutral"]
CUES = {"joy": ["happy", "glad"], "anger": ["angry", "mad"], "fear": ["scared", "afraid"]}
FILLER = ["the", "day", "was", "a", "and", "it", "very", "so", "we", "they", "felt", "today"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", '"'] + FILLER + \
    [word for cues in CUES.values() for word in cues]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, save_tiny_checkpoint) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), VOCAB)


def rows(count: int, seed: int) -> list[tuple[str, list[str]]]:
    """(text, labels): each emotion's cue word appears with probability 0.35; no cue is "neutral"."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        labels = [name for name in CUES if rng.random() < 0.35]
        words = rng.choices(FILLER, k=rng.randint(2, 7)) + [rng.choice(CUES[name]) for name in labels]
        rng.shuffle(words)
        out.append((" ".join(words) + " .", labels or ["neutral"]))
    return out


def write_goemotions(path: Path, data) -> Path:
    """GoEmotions' layout: text<TAB>ids<TAB>comment id, no header."""
    path.write_text("".join(f"{text}\t{','.join(str(EMOTIONS.index(n)) for n in names)}\tc{i}\n"
                            for i, (text, names) in enumerate(data)), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- the head against transformers

def _peer_and_ours(tiny_model: Path, tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    ours = BertForSequenceClassification.from_pretrained(tiny_model, num_labels=4, id2label=dict(enumerate(EMOTIONS)),
                                                         problem_type="multi_label_classification")
    thresholds = {"joy": 0.4, "anger": 0.3, "fear": 0.25, "neutral": 0.5}
    ours.config.extra.update(multi_label_threshold=0.35, multi_label_thresholds=thresholds)
    ours.save_pretrained(tmp_path / "ours")
    peer = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "ours")
    assert peer.config.problem_type == "multi_label_classification" and peer.config.num_labels == 4
    assert peer.config.id2label == dict(enumerate(EMOTIONS)) and peer.config.multi_label_thresholds == thresholds
    return ours.eval(), peer.eval()


@pytest.mark.parametrize("unpad", [False, True])
def test_loss_and_gradients_equal_transformers(tiny_model, tmp_path, unpad):
    """The same checkpoint, batch and multi-hot labels: sigmoid + BCE loss and every gradient equal the
    peer's (dropout off); `unpad` (the fine-tuning fast path) changes nothing beyond rounding."""
    ours, peer = _peer_and_ours(tiny_model, tmp_path)
    tokenizer = BertTokenizer.from_pretrained(tiny_model)
    data = rows(8, 0)
    batch = tokenizer.encode_batch([t for t, _ in data], max_length=32, padding="longest", return_tensors="pt")
    labels = torch.from_numpy(multi_hot([[EMOTIONS.index(n) for n in names] for _, names in data], 4)
                              .astype(np.float32))
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    assert int(batch["attention_mask"].sum()) < batch["attention_mask"].numel()  # some padding
    out = ours(**inputs, labels=labels, unpad=unpad)
    reference = peer(**inputs, labels=labels)
    assert out.loss.item() == pytest.approx(reference.loss.item(), abs=1e-5)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(out.logits, labels)
    assert out.loss.item() == pytest.approx(expected.item(), abs=1e-6)
    out.loss.backward()
    reference.loss.backward()
    peer_grads = dict(peer.named_parameters())
    checked = 0
    for name, parameter in ours.named_parameters():
        if parameter.grad is None:
            continue
        torch.testing.assert_close(parameter.grad, peer_grads[name].grad, atol=1e-5, rtol=0, msg=name)
        checked += 1
    assert checked > 20 and ours.classifier.weight.grad.abs().sum() > 0


def _mean_gradient(model, inputs: dict, labels: torch.Tensor, draws: int, **kwargs):
    """Every parameter's gradient (flattened, float64) averaged over `draws` dropout masks, and its variance."""
    model.train()
    total = square = None
    for _ in range(draws):
        model.zero_grad()
        model(**inputs, labels=labels, **kwargs).loss.backward()
        grad = torch.cat([p.grad.flatten() for _, p in sorted(model.named_parameters()) if p.grad is not None]).double()
        total = grad if total is None else total + grad
        square = grad * grad if square is None else square + grad * grad
    mean = total / draws
    return mean, square / draws - mean * mean


def test_dropout_trains_as_transformers_in_distribution(tiny_model, tmp_path):
    """With dropout on (as fine-tuning runs), the gradient bertforge's unpadded path gives, averaged over
    many dropout masks, equals the peer's within sampling noise: dropout sits at the same places with the
    same rate (issue 64's bisection: the one part of a training step the trajectory tests run without).
    Measured as z-scores of the difference of the two mean gradients, whose root mean square is 1 when
    the two are equally distributed; a peer with another dropout rate is far from it (the test can fail)."""
    torch.manual_seed(0)
    ours, peer = _peer_and_ours(tiny_model, tmp_path)
    tokenizer = BertTokenizer.from_pretrained(tiny_model)
    data = rows(8, 1)
    batch = tokenizer.encode_batch([t for t, _ in data], max_length=32, padding="longest", return_tensors="pt")
    labels = torch.from_numpy(multi_hot([[EMOTIONS.index(n) for n in names] for _, names in data], 4)
                              .astype(np.float32))
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():  # a head that is not near zero, so that its input's dropout shows in the gradients
        for model in (ours, peer):
            torch.manual_seed(1)
            model.classifier.weight.normal_(0, 1.0)
    draws = 400

    def z_rms(a, b) -> float:
        (mean_a, var_a), (mean_b, var_b) = a, b
        z = (mean_a - mean_b) / torch.sqrt((var_a + var_b) / draws + 1e-30)
        return float(z.pow(2).mean().sqrt())

    torch.manual_seed(2)
    bertforge_side = _mean_gradient(ours, inputs, labels, draws, unpad=True)
    peer_side = _mean_gradient(peer, inputs, labels, draws)
    assert 0.85 < z_rms(bertforge_side, peer_side) < 1.2
    peer.config.hidden_dropout_prob = 0.3  # the negative control: dropout at another rate in every layer
    for module in peer.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.3
    assert z_rms(bertforge_side, _mean_gradient(peer, inputs, labels, draws)) > 1.5


def test_a_transformers_multi_label_checkpoint_loads_and_config_round_trips(tiny_model, tmp_path):
    ours, peer = _peer_and_ours(tiny_model, tmp_path)
    peer.config.update({"multi_label_threshold": 0.3, "multi_label_thresholds": None})
    peer.save_pretrained(tmp_path / "peer")
    loaded = BertForSequenceClassification.from_pretrained(tmp_path / "peer").eval()
    assert loaded.problem_type() == "multi_label_classification"
    assert loaded.config.id2label == dict(enumerate(EMOTIONS))
    assert label_thresholds(loaded.config).tolist() == [0.3] * 4
    ids = torch.tensor([[2, 8, 21, 3]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, peer(ids).logits, atol=1e-5, rtol=0)
    # Float labels without a problem_type are multi-label, integer labels single-label (transformers' rule).
    plain = BertForSequenceClassification.from_pretrained(tiny_model, num_labels=4).eval()
    assert plain.problem_type(torch.zeros(1, 4)) == "multi_label_classification"
    assert plain.problem_type(torch.zeros(1, dtype=torch.long)) == "single_label_classification"


# ---------------------------------------------------------------------------- metrics and thresholds

def test_metrics_equal_scikit_learn():
    rng = np.random.default_rng(0)
    gold = rng.random((200, 6)) < 0.3
    predicted = rng.random((200, 6)) < 0.3
    predicted[:, 5] = False  # a label never predicted: precision 0 by convention
    scores = multi_label_metrics(predicted, gold)
    for average in ("macro", "micro"):
        assert scores[f"f1_{average}"] == pytest.approx(f1_score(gold, predicted, average=average, zero_division=0))
        assert scores[f"precision_{average}"] == pytest.approx(
            precision_score(gold, predicted, average=average, zero_division=0))
        assert scores[f"recall_{average}"] == pytest.approx(
            recall_score(gold, predicted, average=average, zero_division=0))
    np.testing.assert_allclose(scores["per_label"]["f1"], f1_score(gold, predicted, average=None, zero_division=0))
    assert scores["per_label"]["support"].tolist() == gold.sum(0).tolist()


def test_threshold_tuning_on_a_known_case():
    # Label 0 is separated by any threshold in (0.6, 0.8], label 1 by any in (0.1, 0.3]: no single threshold
    # separates both. The best global one keeps label 1 perfect and costs label 0 one false positive.
    probabilities = np.array([[0.9, 0.30], [0.8, 0.35], [0.6, 0.10], [0.2, 0.05]])
    gold = np.array([[1, 1], [1, 1], [0, 0], [0, 0]], dtype=bool)
    global_ = tune_thresholds(probabilities, gold)
    assert global_.tolist() == [0.3, 0.3]  # F1 0.8 and 1 from 0.21 to 0.30: of those, the nearest to 0.5
    assert multi_label_metrics(probabilities >= global_, gold)["f1_macro"] == pytest.approx(0.9)
    per_label = tune_thresholds(probabilities, gold, per_label=True)
    assert per_label.tolist() == [0.61, 0.3]
    assert multi_label_metrics(probabilities >= per_label, gold)["f1_macro"] == 1.0
    # Nothing to learn from (no positives): 0.5, the grid's first candidate.
    assert tune_thresholds(np.full((3, 1), 0.7), np.zeros((3, 1), dtype=bool)).tolist() == [0.5]
    assert THRESHOLD_GRID[0] == 0.5 and len(THRESHOLD_GRID) == 99
    assert sigmoid(np.array([-1000.0, 0.0, 1000.0])).tolist() == [0.0, 0.5, 1.0]


# ---------------------------------------------------------------------------- readers

def test_reader_formats(tmp_path):
    labels = tmp_path / "emotions.txt"
    labels.write_text("\n".join(EMOTIONS))  # no newline after the last name, as GoEmotions' file
    assert read_label_names(labels) == EMOTIONS
    # GoEmotions' TSV: quotes are not special (an unbalanced one must not swallow the next rows).
    tsv = tmp_path / "train.tsv"
    tsv.write_text('"So happy"" today\t0,1\teeibobj\nangry and "scared\t1, 2\tx2\nthe day\t3\tx3\n'
                   'no labels at all\t\tx4\n')
    examples, label_list = read_multi_label_file(tsv, label_list=EMOTIONS, training=True)
    assert label_list == EMOTIONS
    assert [(e.text_a, e.labels, e.line) for e in examples] == [
        ('"So happy"" today', (0, 1), 1), ('angry and "scared', (1, 2), 2), ("the day", (3,), 3),
        ("no labels at all", (), 4)]
    # CSV: names separated by ';', the label set read from the file (sorted).
    csv = tmp_path / "train.csv"
    csv.write_text('text,labels\n"happy, and mad",joy;anger\nthe day,neutral\nscared,fear\n')
    examples, label_list = read_multi_label_file(csv, training=True)
    assert label_list == ["anger", "fear", "joy", "neutral"]
    assert [e.labels for e in examples] == [(0, 2), (3,), (1,)] and examples[0].text_a == "happy, and mad"
    # JSON lines: a list, or a ';' string; a dev file is read against the training file's list.
    jsonl = tmp_path / "dev.jsonl"
    jsonl.write_text(json.dumps({"text": "glad", "labels": ["joy", "fear"]}) + "\n\n" +
                     json.dumps({"text": "mad", "labels": "anger"}) + "\n" + json.dumps({"text": "x", "labels": []}))
    examples, _ = read_multi_label_file(jsonl, label_list=label_list)
    assert [(e.labels, e.line) for e in examples] == [((1, 2), 1), ((0,), 3), ((), 4)]
    # Unlabelled inputs to predict.
    plain = tmp_path / "input.tsv"
    plain.write_text("one text\nanother\n")
    examples, _ = read_multi_label_file(plain, label_list=EMOTIONS, require_labels=False)
    assert [(e.text_a, e.labels) for e in examples] == [("one text", None), ("another", None)]
    # The collate builds the multi-hot targets per batch.
    batch = collate([{"input_ids": [2, 5, 3], "token_type_ids": [0, 0, 0], "label": (0, 2)},
                     {"input_ids": [2, 3], "token_type_ids": [0, 0], "label": ()}], num_labels=4)
    assert batch["labels"].tolist() == [[1, 0, 1, 0], [0, 0, 0, 0]] and batch["labels"].dtype == torch.float32
    assert batch["input_ids"].tolist() == [[2, 5, 3], [2, 3, 0]]


BAD_INPUTS = {
    "unknown label name": ("dev.csv", "text,labels\nfine,joy\nworse,joy;rage\n", r"dev\.csv:3: unknown label 'rage'"),
    "id out of range": ("dev.tsv", "fine\t0\tx\nworse\t1,28\ty\n", r"dev\.tsv:2: label id 28 is out of range"),
    "id not a number": ("dev.tsv", "fine\tjoy\tx\n", r"dev\.tsv:1: label id 'joy' is not an integer"),
    "row with no text (tsv)": ("dev.tsv", "fine\t0\tx\n  \t1\ty\n", r"dev\.tsv:2: no text"),
    "row with no text (jsonl)": ("dev.jsonl", '{"text": "", "labels": ["joy"]}\n', r"dev\.jsonl:1: no text"),
    "no labels column": ("dev.csv", "text,label_ids\nfine,joy\n", r"dev\.csv:2: no 'labels' column"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_dev_input_is_one_line_naming_file_and_line(tiny_model, tmp_path, capsys, case):
    name, text, message = BAD_INPUTS[case]
    if name.endswith(".tsv"):
        train = write_goemotions(tmp_path / "train.tsv", rows(16, 1))
    else:
        train = tmp_path / "train.csv"
        train.write_text("text,labels\nhappy,joy\nmad,anger;joy\nday,neutral;fear\n")
    labels = tmp_path / "emotions.txt"
    labels.write_text("\n".join(EMOTIONS) + "\n" + "\n".join(f"e{i}" for i in range(4, 28)) + "\n")
    (tmp_path / name).write_text(text)
    command = ["finetune", "multi-label", "--train-file", str(train), "--dev-file", str(tmp_path / name),
               "--model", str(tiny_model), "--output-dir", str(tmp_path / "out"), "--max-seq-length", "32"]
    if name.endswith(".tsv"):
        command += ["--labels", str(labels)]
    assert main(command) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("bertforge finetune: error: ") and "\n" not in error
    assert re.search(message, error), error
    assert not (tmp_path / "out").exists()  # refused before any work


def test_bad_training_files(tiny_model, tmp_path, capsys):
    single = tmp_path / "single.csv"
    single.write_text("text,label\nhappy,joy\nmad,anger\n\nscared,fear\n")
    dev = tmp_path / "dev.csv"
    dev.write_text("text,labels\nhappy,joy\n")
    base = ["finetune", "multi-label", "--dev-file", str(dev), "--model", str(tiny_model),
            "--output-dir", str(tmp_path / "out"), "--max-seq-length", "32"]
    assert main(base + ["--train-file", str(single)]) == 2
    error = capsys.readouterr().err.strip()
    assert "single.csv:2-5: every row has exactly one label" in error and "finetune classify" in error
    ids = write_goemotions(tmp_path / "train.tsv", rows(4, 2))
    assert main(base + ["--train-file", str(ids)]) == 2  # ids need --labels
    assert "pass --labels FILE" in capsys.readouterr().err
    labels = tmp_path / "labels.txt"
    labels.write_text("joy\nanger\njoy\n")
    assert main(base + ["--train-file", str(ids), "--labels", str(labels)]) == 2
    assert "labels.txt:3: label 'joy' given twice" in capsys.readouterr().err


# ---------------------------------------------------------------------------- pipeline

def test_pipeline_returns_every_label_over_the_threshold(tiny_model, tmp_path):
    model = BertForSequenceClassification.from_pretrained(tiny_model, num_labels=4, id2label=dict(enumerate(EMOTIONS)),
                                                          problem_type="multi_label_classification")
    torch.manual_seed(3)
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor([4.0, -4.0, 2.0, -2.0]))  # joy and fear in, the others out
    model.config.extra["multi_label_threshold"] = 0.5
    model.save_pretrained(tmp_path / "m")
    BertTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path / "m")
    texts = ["happy day .", "so mad and afraid"]
    pipe = pipeline("classify", model=tmp_path / "m")
    results = pipe(texts)
    reference = BertForSequenceClassification.from_pretrained(tmp_path / "m").eval()
    tokenizer = BertTokenizer.from_pretrained(tmp_path / "m")
    for text, result in zip(texts, results):
        batch = tokenizer.encode_batch([text], return_tensors="pt")
        with torch.no_grad():
            probs = torch.sigmoid(reference(batch["input_ids"], batch["token_type_ids"]).logits[0]).tolist()
        assert result["scores"] == pytest.approx(dict(zip(EMOTIONS, probs)), abs=1e-5)
        assert [r["label"] for r in result["labels"]] == ["joy", "fear"]  # most probable first
        assert [r["score"] for r in result["labels"]] == pytest.approx([probs[0], probs[2]], abs=1e-5)
    if importlib.util.find_spec("onnxruntime") is not None:  # the ONNX backend postprocesses the same way
        onnx = pipeline("classify", model=tmp_path / "m", backend="onnx")(texts)
        assert [[r["label"] for r in result["labels"]] for result in onnx] == [["joy", "fear"]] * 2
    # The stored per-label thresholds win over the global one.
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["multi_label_thresholds"] = {"joy": 0.999, "anger": 0.001, "fear": 0.999, "neutral": 0.999}
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    results = pipeline("classify", model=tmp_path / "m")(texts)
    assert [[r["label"] for r in result["labels"]] for result in results] == [["anger"], ["anger"]]
    config["multi_label_thresholds"] = {"joy": 0.999, "anger": 0.999, "fear": 0.999, "neutral": 0.999}
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    assert [result["labels"] for result in pipeline("classify", model=tmp_path / "m")(texts)] == [[], []]
    # A single-label model's output is unchanged: the top label.
    single = BertForSequenceClassification.from_pretrained(tiny_model, num_labels=2, id2label={0: "neg", 1: "pos"})
    single.save_pretrained(tmp_path / "s")
    BertTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path / "s")
    assert set(pipeline("classify", model=tmp_path / "s")(texts)[0]) == {"label", "score", "scores"}


def test_the_server_answers_as_the_pipeline(tiny_model, tmp_path):
    pytest.importorskip("starlette", reason="the serve extra is not installed")
    from starlette.testclient import TestClient

    from bertforge.serving.server import ServerSettings, create_app

    model = BertForSequenceClassification.from_pretrained(tiny_model, num_labels=4, id2label=dict(enumerate(EMOTIONS)),
                                                          problem_type="multi_label_classification")
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor([4.0, -4.0, 2.0, -2.0]))
    model.save_pretrained(tmp_path / "m")
    BertTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path / "m")
    pipe = pipeline("classify", model=tmp_path / "m")
    with TestClient(create_app({"classify": pipe}, ServerSettings(model="m"))) as client:
        answer = client.post("/v1/classify", json={"texts": ["happy day .", "so mad"]}).json()
        assert client.get("/health").json()["pipelines"]["classify"]["labels"] == EMOTIONS
    assert [[r["label"] for r in result["labels"]] for result in answer["results"]] == [["joy", "fear"]] * 2
    for got, want in zip(answer["results"], pipe(["happy day .", "so mad"])):
        assert got["scores"] == pytest.approx(want["scores"], abs=1e-6)


# ---------------------------------------------------------------------------- end to end

def test_finetune_and_predict_a_learnable_task(tiny_model, tmp_path, capsys):
    """Cue words decide the labels: a few epochs learn them well above chance; the threshold tuned on dev
    is in config.json and `predict` writes one row per input row with the names over it."""
    write_goemotions(tmp_path / "train.tsv", rows(256, 1))
    write_goemotions(tmp_path / "dev.tsv", rows(64, 2))
    (tmp_path / "emotions.txt").write_text("\n".join(EMOTIONS))
    out = tmp_path / "out"
    assert main(["finetune", "multi-label", "--train-file", str(tmp_path / "train.tsv"), "--dev-file",
                 str(tmp_path / "dev.tsv"), "--labels", str(tmp_path / "emotions.txt"), "--model", str(tiny_model),
                 "--output-dir", str(out), "--lr", "3e-3", "--epochs", "12", "--batch-size", "16",
                 "--max-seq-length", "32", "--group-by-length", "--per-label-thresholds", "--no-progress",
                 "--test-file", str(tmp_path / "dev.tsv")]) == 0
    results = json.loads((out / "eval_results.json").read_text())
    assert results["task"] == "multi-label" and results["metrics"]["f1_macro"] > 0.7  # predicting every label: 0.51
    config = json.loads((out / "config.json").read_text())
    assert config["problem_type"] == "multi_label_classification" and config["finetuning_task"] == "multi-label"
    assert set(config["multi_label_thresholds"]) == set(EMOTIONS) and 0 < config["multi_label_threshold"] < 1
    per_label = json.loads((out / "dev_label_metrics.json").read_text())
    assert set(per_label) == set(EMOTIONS) and all(0 <= v["f1"] <= 1 for v in per_label.values())
    capsys.readouterr()
    assert main(["predict", "--model", str(out), "--input", str(tmp_path / "dev.tsv"),
                 "--output", str(tmp_path / "p.tsv")]) == 0
    printed = capsys.readouterr().out
    assert f"f1_macro {results['metrics']['f1_macro']:.4f}" in printed  # the dev score again, from the file
    lines = (tmp_path / "p.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 65
    assert [line.split("\t")[0] for line in lines[1:]] == [str(i) for i in range(64)]
    predicted = [line.split("\t")[1] for line in lines[1:]]
    assert all(set(p.split(",")) <= set(EMOTIONS) for p in predicted if p)
    assert (out / "test_predictions.tsv").read_text() == (tmp_path / "p.tsv").read_text()  # --test-file's
    dev = [json.loads(line) for line in (out / "dev_predictions.jsonl").read_text().splitlines()]
    assert predicted == [",".join(record["prediction"]) for record in dev]  # the best evaluation's, in label order
    assert [record["label"] for record in dev] == [sorted(names, key=EMOTIONS.index) for _, names in rows(64, 2)]


def test_finetune_and_predict_on_goemotions_rows(shared_data, uncased_vocab, save_tiny_checkpoint, tmp_path, capsys):
    """GoEmotions' own files as released (a few rows, written to tmp_path): a tiny encoder over BERT's uncased
    vocabulary trains through the CLI, and `predict` names emotions.txt's labels, one row per input row."""
    source = shared_data / "goemotions"
    model = save_tiny_checkpoint(tmp_path / "tiny", uncased_vocab.read_text(encoding="utf-8").splitlines())
    for name, count in (("train.tsv", 96), ("dev.tsv", 40)):
        with open(source / name, encoding="utf-8") as handle:
            (tmp_path / name).write_text("".join(next(handle) for _ in range(count)), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["finetune", "multi-label", "--train-file", str(tmp_path / "train.tsv"), "--dev-file",
                 str(tmp_path / "dev.tsv"), "--labels", str(source / "emotions.txt"), "--model", str(model),
                 "--output-dir", str(out), "--epochs", "1", "--max-seq-length", "64", "--no-progress"]) == 0
    assert "multi-label: best at epoch 1" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    emotions = (source / "emotions.txt").read_text(encoding="utf-8").split("\n")
    assert [config["id2label"][str(i)] for i in range(28)] == emotions
    assert main(["predict", "--model", str(out), "--input", str(tmp_path / "dev.tsv"),
                 "--output", str(tmp_path / "p.tsv"), "--threshold", "0.01"]) == 0
    lines = (tmp_path / "p.tsv").read_text().splitlines()
    assert len(lines) == 41 and lines[1].split("\t")[1].split(",") == emotions  # every label over 0.01


def test_training_takes_the_unpadded_fast_path(tiny_model, tmp_path, monkeypatch):
    """`finetune multi-label` trains as `finetune classify` does: the encoder on the real tokens only
    (unpad, the CLI's default), batches grouped by length when asked. Without dropout the losses of every
    step equal the padded path's to rounding."""
    model_dir = tmp_path / "no_dropout"
    model_dir.mkdir()
    for file in tiny_model.iterdir():
        (model_dir / file.name).write_bytes(file.read_bytes())
    config = json.loads((model_dir / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (model_dir / "config.json").write_text(json.dumps(config))
    write_goemotions(tmp_path / "train.tsv", rows(64, 1))
    write_goemotions(tmp_path / "dev.tsv", rows(16, 2))
    packed_calls = []
    packed_plan = plans.PackedPlan
    monkeypatch.setattr(plans, "PackedPlan", lambda *a, **k: packed_calls.append(1) or packed_plan(*a, **k))
    losses = {}
    for unpad in (False, True):
        task = multi_label_task(model_dir, tmp_path / "train.tsv", tmp_path / "dev.tsv", max_seq_length=32,
                                labels_file=_labels(tmp_path))
        out = tmp_path / f"unpad_{unpad}"
        finetune(task, FinetuneArguments(output_dir=out, lr=1e-3, epochs=2, batch_size=16, progress=False,
                                         log_every=1, unpad=unpad, group_by_length=True))
        assert bool(packed_calls) == unpad
        losses[unpad] = [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()
                         if "loss" in json.loads(line)]
    assert len(losses[True]) == 8 and losses[True] == pytest.approx(losses[False], abs=1e-5)


def _labels(tmp_path: Path) -> Path:
    path = tmp_path / "emotions.txt"
    path.write_text("\n".join(EMOTIONS))
    return path


@pytest.mark.parametrize("per_label", [False, True])
def test_a_run_stopped_after_an_evaluation_resumes_to_the_uninterrupted_weights(tiny_model, tmp_path,
                                                                                stopped_and_resumed, per_label):
    """Issue 61 (1): evaluation writes the tuned threshold(s) into the model's config; a run stopped after one
    resumes (the config's run-defining keys are compared, not what evaluation learned) and ends with the
    weights, thresholds and best model of a run never stopped."""
    write_goemotions(tmp_path / "train.tsv", rows(64, 1))  # 4 steps an epoch at batch 16
    write_goemotions(tmp_path / "dev.tsv", rows(16, 2))
    labels = _labels(tmp_path)

    def make_task():
        return multi_label_task(tiny_model, tmp_path / "train.tsv", tmp_path / "dev.tsv", labels_file=labels,
                                max_seq_length=32, per_label_thresholds=per_label)

    out = tmp_path / "out"
    args = FinetuneArguments(output_dir=out, lr=1e-3, epochs=3, batch_size=16, progress=False, log_every=1,
                             save_every=2)
    # Evaluations at steps 4, 8, 12 (each epoch); stopped in the one at step 8: resumed from step 6's checkpoint.
    straight, resumed, resumed_from = stopped_and_resumed(make_task, args, stop_at_evaluation=2)
    assert 0 < resumed_from["multi_label_threshold"] < 1 and ("multi_label_thresholds" in resumed_from) == per_label
    assert resumed["step"] == straight["step"] == 12
    assert resumed["model"].keys() == straight["model"].keys()
    for name, tensor in straight["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name
    assert resumed["config"] == straight["config"]  # the last evaluation's thresholds too
    for name in ("config.json", "eval_results.json", "dev_label_metrics.json"):
        mine, theirs = (json.loads((directory / name).read_text()) for directory in (out, tmp_path / "out_straight"))
        if name == "eval_results.json":
            mine.pop("wall_seconds"), theirs.pop("wall_seconds")
        assert mine == theirs, name


def test_resume_still_refuses_a_config_that_defines_another_run(tiny_model, tmp_path):
    """What defines the run is still compared on resume: the same data under other label names is refused."""
    write_goemotions(tmp_path / "train.tsv", rows(32, 1))
    write_goemotions(tmp_path / "dev.tsv", rows(16, 2))
    args = FinetuneArguments(output_dir=tmp_path / "out", lr=1e-3, epochs=1, batch_size=16, progress=False,
                             save_every=1)
    finetune(multi_label_task(tiny_model, tmp_path / "train.tsv", tmp_path / "dev.tsv", labels_file=_labels(tmp_path),
                              max_seq_length=32), args)
    renamed = tmp_path / "renamed.txt"
    renamed.write_text("\n".join(EMOTIONS[:-1] + ["calm"]))
    task = multi_label_task(tiny_model, tmp_path / "train.tsv", tmp_path / "dev.tsv", labels_file=renamed,
                            max_seq_length=32)
    with pytest.raises(ValueError, match=r"model config differs from this run's in id2label .*label2id") as error:
        finetune(task, FinetuneArguments(**{**vars(args), "resume": True}))
    assert "threshold" not in str(error.value)


# ---------------------------------------------------------------------------- issue 61 (9, 10): questionable data

QUESTIONABLE = {
    # GoEmotions ids that Python's int() reads (as 10, 3, 1): ASCII digits only.
    "underscore id": ("train.tsv", "fine\t0\tx\nworse\t1_0\ty\n",
                      r"train\.tsv:2: label id '1_0' is not an integer in ASCII digits 0-9"),
    "arabic-indic id": ("train.tsv", "fine\t0,1\tx\nworse\t\u0663\ty\n",
                        r"train\.tsv:2: label id '\u0663' is not an integer in ASCII digits 0-9"),
    "signed id": ("train.tsv", "fine\t0,1\tx\nworse\t+1\ty\n", r"train\.tsv:2: label id '\+1' is not an integer"),
    # JSON labels that would silently become the names "1" and "2".
    "float label": ("train.jsonl", '{"text": "a", "labels": [1, 2.0, "2"]}\n',  # the row
                    r"train\.jsonl:1: label 2\.0 is a floating-point number: a label is a name \(a string\) or an "
                    "integer"),
    "mixed in a row": ("train.jsonl", '{"text": "a", "labels": [1, "2"]}\n',
                       r"train\.jsonl:1: label \"2\" is a string, but the file's labels are integers \(from "
                       r".*train\.jsonl:1\): give every label the same way"),
    "mixed across rows": ("train.jsonl", '{"text": "a", "labels": ["1", "2"]}\n{"text": "b", "labels": [2]}\n',
                          r"train\.jsonl:2: label 2 is an integer, but the file's labels are names \(strings\)"),
    # Nothing to learn: no row has a label.
    "no label at all (tsv)": ("train.tsv", "fine\t\tx\nworse\t\ty\n",
                              r"train\.tsv: no row has a label \(lines 1-2\): there is nothing to learn"),
    "no label at all (csv)": ("train.csv", "text,labels\nfine,\nworse,\n",
                              r"train\.csv: no row has a label \(lines 2-3\): there is nothing to learn"),
}


@pytest.mark.parametrize("case", sorted(QUESTIONABLE))
def test_questionable_training_data_is_one_line_naming_file_and_line(tiny_model, tmp_path, capsys, case):
    """Issue 61 (9): data that used to train silently (ids read by int()'s leniency, float or mixed JSON labels,
    a file without a single label) is refused before any work, in one line naming the file (and line)."""
    name, text, message = QUESTIONABLE[case]
    (tmp_path / name).write_text(text, encoding="utf-8")
    dev = write_goemotions(tmp_path / "dev.tsv", rows(8, 2))
    labels = tmp_path / "emotions.txt"
    labels.write_text("\n".join(EMOTIONS) + "\n")
    command = ["finetune", "multi-label", "--train-file", str(tmp_path / name), "--dev-file", str(dev),
               "--labels", str(labels), "--model", str(tiny_model), "--output-dir", str(tmp_path / "out"),
               "--max-seq-length", "32"]
    assert main(command) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("bertforge finetune: error: ") and "\n" not in error
    assert re.search(message, error), error
    assert not (tmp_path / "out").exists()


def test_integer_json_labels_of_one_kind_still_read(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "a", "labels": [1, 2]}\n{"text": "b", "labels": 3}\n{"text": "c", "labels": []}\n')
    examples, label_list = read_multi_label_file(path, training=True)
    assert label_list == ["1", "2", "3"] and [e.labels for e in examples] == [(0, 1), (2,), ()]


def test_a_goemotions_row_whose_text_is_text_is_a_row_not_a_header(tmp_path):
    """Issue 61 (10): GoEmotions' TSV has no header; a first row `text<TAB>27<TAB>id` was taken for one (and
    an error then pointed at line 2). A header's second field names a column; this one holds label ids."""
    path = tmp_path / "train.tsv"
    path.write_text("text\t3\teeibobj\nso happy\t0,1\tx2\n")
    examples, _ = read_multi_label_file(path, label_list=EMOTIONS, training=True)
    assert [(e.text_a, e.labels, e.line) for e in examples] == [("text", (3,), 1), ("so happy", (0, 1), 2)]
    path.write_text("text\t\teeibobj\nworse\t1,x\ty\n")  # a row without labels, then a bad id: line 2 named
    with pytest.raises(ValueError, match=r"train\.tsv:2: label id 'x' is not an integer"):
        read_multi_label_file(path, label_list=EMOTIONS)
    # A real header still reads as one.
    path.write_text("text\tlabels\nso happy\tjoy;anger\n")
    examples, _ = read_multi_label_file(path, label_list=EMOTIONS)
    assert [(e.text_a, e.labels, e.line) for e in examples] == [("so happy", (0, 1), 2)]


def test_per_label_thresholds_of_labels_missing_from_dev_are_the_global_one_and_said(tiny_model, tmp_path, caplog):
    """Issue 61 (9): with --per-label-thresholds, a label no dev row has cannot be tuned: it gets the global
    threshold tuned on dev (not the grid's first candidate, 0.5, passed off as tuned), the log names those
    labels, and dev_label_metrics.json says where each threshold came from."""
    write_goemotions(tmp_path / "train.tsv", rows(32, 1))
    dev = [(text, names) for text, names in rows(40, 2) if "fear" not in names and "neutral" not in names]
    write_goemotions(tmp_path / "dev.tsv", dev)
    task = multi_label_task(tiny_model, tmp_path / "train.tsv", tmp_path / "dev.tsv", labels_file=_labels(tmp_path),
                            max_seq_length=32, per_label_thresholds=True)
    assert "has no example of 2 of the 4 labels (fear, neutral): their thresholds cannot be tuned per label; " \
           "they get the global threshold tuned on dev" in caplog.text
    out = tmp_path / "out"
    finetune(task, FinetuneArguments(output_dir=out, lr=1e-3, epochs=1, batch_size=16, progress=False))
    config = json.loads((out / "config.json").read_text())
    overall, thresholds = config["multi_label_threshold"], config["multi_label_thresholds"]
    table = json.loads((out / "dev_label_metrics.json").read_text())
    assert {name: row["threshold_from"] for name, row in table.items()} == {
        "joy": "label", "anger": "label", "fear": "global: no dev example", "neutral": "global: no dev example"}
    assert thresholds["fear"] == thresholds["neutral"] == overall == table["fear"]["threshold"]
    # The function itself: a label without a positive example takes the global threshold.
    probabilities = np.array([[0.9, 0.30, 0.2], [0.8, 0.35, 0.9], [0.6, 0.10, 0.1], [0.2, 0.05, 0.3]])
    gold = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 0], [0, 0, 0]], dtype=bool)
    per_label = tune_thresholds(probabilities, gold, per_label=True)
    assert per_label.tolist() == [0.61, 0.3, float(tune_thresholds(probabilities, gold)[0])]


def test_multi_label_recipe_sets_adam_epsilon_for_finetune_and_distill():
    """Multi-label's AdamW ε is torch's 1e-8 (its recipe: issue 64), the paper's 1e-6 stays every other family's,
    and a given --adam-epsilon wins; distill resolves the teacher family's recipe the same way."""
    from bertforge.cli import build_parser
    from bertforge.cli.finetune import _arguments
    from bertforge.tasks.multi_label import RECIPE

    parser = build_parser()
    common = ["--model", "m", "--output-dir", "o"]
    multi = ["finetune", "multi-label", "--train-file", "a", "--dev-file", "b", *common]
    assert _arguments(parser.parse_args(multi)).adam_epsilon == RECIPE["adam_epsilon"] == 1e-8
    assert _arguments(parser.parse_args([*multi, "--adam-epsilon", "1e-6"])).adam_epsilon == 1e-6
    assert _arguments(parser.parse_args(["finetune", "glue", "--task", "mrpc", "--data-dir", "g", *common])
                      ).adam_epsilon == 1e-6
    distill = parser.parse_args(["distill", "--teacher", "t", "--output-dir", "o", "--train-file", "a"])
    assert _arguments(distill, RECIPE).adam_epsilon == 1e-8
    assert _arguments(distill, {"lr": 5e-5}).adam_epsilon == 1e-6


def test_the_new_head_is_drawn_as_transformers_draws_it_and_recorded_in_the_config(tiny_model, tmp_path):
    """Issue 64's cause: multi-label's new classifier is drawn from a plain normal(0, initializer_range), as
    transformers draws it (`initializer="normal"`: weights past 2σ), every other head from the paper's truncated
    normal (none past 2σ); the choice is written to config.json only where it is not the default."""
    from bertforge.modeling.config import BertConfig

    write_goemotions(tmp_path / "train.tsv", rows(16, 1))
    write_goemotions(tmp_path / "dev.tsv", rows(8, 2))
    task = multi_label_task(tiny_model, tmp_path / "train.tsv", tmp_path / "dev.tsv", labels_file=_labels(tmp_path),
                            max_seq_length=32)
    std = BertConfig.from_pretrained(tiny_model).initializer_range

    def head(**overrides) -> torch.Tensor:
        torch.manual_seed(5)
        return BertForSequenceClassification.from_pretrained(tiny_model, **overrides).classifier.weight.detach()

    torch.manual_seed(5)
    assert torch.equal(task.build_model().classifier.weight.detach(), head(num_labels=4, initializer="normal"))
    assert head(num_labels=256).abs().max() <= 2 * std < head(num_labels=256, initializer="normal").abs().max()
    task.build_model().save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["initializer"] == "normal"
    assert "initializer" not in json.loads((tiny_model / "config.json").read_text())
    with pytest.raises(ValueError, match="initializer must be one of"):
        BertConfig(initializer="uniform")
