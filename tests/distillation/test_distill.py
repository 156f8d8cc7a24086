"""`bertforge distill` for the classify family: the objective against hand computations, the student's
initialisation, the teacher's outputs cached and read back, the student as a normal checkpoint (predict,
int8, pipeline, transformers), and the errors that come before any long work."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import pipeline
from bertforge.cli import distill as cli_distill
from bertforge.cli import main
from bertforge.distillation import (build_student, copy_layers, distill_task, hard_label_loss, soft_target_loss,
                                    squared_error_loss, student_layers)
from bertforge.distillation import cache as cache_module
from bertforge.distillation import classify as classify_distiller
from bertforge.modeling import BertConfig, BertForSequenceClassification
from bertforge.tokenization import BertTokenizer
from bertforge.training.finetune import FinetuneArguments, finetune
from bertforge.training.loop import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

POSITIVE = ["good", "great", "fine", "lovely", "superb"]
NEGATIVE = ["bad", "awful", "poor", "dull", "terrible"]
FILLER = ["the", "film", "was", "a", "plot", "very", "quite", "story", "and", "it"]
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","] + POSITIVE + NEGATIVE + FILLER


def sentences(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        label = rng.random() < 0.5
        words = rng.choices(FILLER, k=rng.randint(2, 6)) + [rng.choice(POSITIVE if label else NEGATIVE)]
        rng.shuffle(words)
        rows.append((" ".join(words), "1" if label else "0"))
    return rows


@pytest.fixture(scope="module")
def encoder(tmp_path_factory, save_tiny_checkpoint) -> Path:
    """A random 4-layer encoder (no dropout) over a word-level vocabulary."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("encoder"), WORDS, num_hidden_layers=4,
                                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def make_teacher(encoder: Path, directory: Path, *, regression: bool = False, task: str = "classify") -> Path:
    """`encoder` with a classify head saved as a fine-tuned model would be (random head: the tests here need
    a teacher's outputs, not good ones)."""
    torch.manual_seed(1)
    overrides = dict(num_labels=1, problem_type="regression") if regression else dict(
        num_labels=2, id2label={0: "0", 1: "1"}, problem_type="single_label_classification")
    model = BertForSequenceClassification.from_pretrained(encoder, finetuning_task=task, **overrides)
    with torch.no_grad():  # layers and a head far from the initial ones: a student's outputs differ from these
        for name, parameter in model.named_parameters():
            if name.endswith("dense.weight") or name.startswith("classifier."):
                parameter.normal_(0.0, 3.0 if name.startswith("classifier.") else 0.3)
    model.save_pretrained(directory)
    BertTokenizer.from_pretrained(encoder).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def teacher(encoder, tmp_path_factory) -> Path:
    return make_teacher(encoder, tmp_path_factory.mktemp("teacher"))


def write_classify(path: Path, rows, unlabelled: int = 0) -> Path:
    """text,label CSV; the last `unlabelled` rows have an empty label (transfer-only examples)."""
    lines = ["text,label"] + [f"{text},{label if i < len(rows) - unlabelled else ''}"
                              for i, (text, label) in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------- the objective

def _softmax(values):
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    return [e / sum(exps) for e in exps]


def test_soft_target_loss_equals_a_hand_computation():
    student = [[1.0, -0.5, 2.0], [0.2, 0.1, -1.0]]
    teacher = [[0.5, 0.0, 3.0], [-1.0, 2.0, 0.0]]
    temperature = 2.5
    kls = []
    for s, t in zip(student, teacher):
        p, q = _softmax([v / temperature for v in t]), _softmax([v / temperature for v in s])
        kls.append(sum(pi * math.log(pi / qi) for pi, qi in zip(p, q)))
    expected = temperature ** 2 * sum(kls) / 2
    got = soft_target_loss(torch.tensor(student), torch.tensor(teacher), temperature)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    # A mask keeps only its rows (the second); equal distributions give 0; leading axes are rows too.
    masked = soft_target_loss(torch.tensor(student), torch.tensor(teacher), temperature, torch.tensor([False, True]))
    assert masked.item() == pytest.approx(temperature ** 2 * kls[1], rel=1e-6)
    assert soft_target_loss(torch.tensor(teacher), torch.tensor(teacher), 1.0).item() == pytest.approx(0, abs=1e-7)
    three_d = soft_target_loss(torch.tensor([student]), torch.tensor([teacher]), temperature)
    assert three_d.item() == pytest.approx(expected, rel=1e-6)
    # the hard labels: cross-entropy over the labelled rows; regression: squared error
    ce = -math.log(_softmax(student[1])[0])
    assert hard_label_loss(torch.tensor(student), torch.tensor([2, 0]), torch.tensor([False, True])).item() == \
        pytest.approx(ce, rel=1e-6)
    assert squared_error_loss(torch.tensor([[1.0], [3.0]]), torch.tensor([0.5, 1.0])).item() == \
        pytest.approx((0.25 + 4.0) / 2)
    assert hard_label_loss(torch.tensor(student), torch.tensor([0, 0]), torch.tensor([False, False])).item() == 0


# ---------------------------------------------------------------------------- the student

def test_student_layers_are_evenly_spaced_from_the_first():
    assert student_layers(12, 6) == [0, 2, 4, 6, 8, 10]  # DistilBERT's one layer out of two
    assert student_layers(6, 3) == [0, 2, 4]
    # a family whose output is the last layer's space (a bi-encoder) keeps the first and the last layer
    assert student_layers(6, 3, keep_last=True) == [0, 3, 5] and student_layers(12, 6, keep_last=True) == [0, 2, 4, 7, 9, 11]
    assert student_layers(6, 1, keep_last=True) == [5] and student_layers(6, 6, keep_last=True) == list(range(6))
    assert student_layers(6, 2, keep_last=True) == [0, 5]
    assert student_layers(6, 2) == [0, 3]
    assert student_layers(6, 4) == [0, 1, 3, 4]
    assert student_layers(4, 4) == [0, 1, 2, 3]
    for bad in (0, 7):
        with pytest.raises(ValueError, match=f"--layers {bad}: the teacher has 6 layers"):
            student_layers(6, bad)


def test_student_init_copies_the_chosen_layers_bit_for_bit(teacher):
    model = BertForSequenceClassification.from_pretrained(teacher)
    student, made = build_student(model, layers=2)
    assert made["teacher_layers"] == [0, 2] and student.config.num_hidden_layers == 2
    assert student.config.extra["finetuning_task"] == "classify" and student.config.id2label == {0: "0", 1: "1"}
    theirs = model.state_dict()
    ours = student.state_dict()
    assert len(ours) == len(theirs) - 2 * sum(k.startswith("bert.encoder.layer.0.") for k in theirs)
    for key, value in ours.items():
        source = key.replace("encoder.layer.1.", "encoder.layer.2.")
        assert torch.equal(value, theirs[source]), key
        assert value.data_ptr() != theirs[source].data_ptr()  # copies: training the student leaves the teacher
    # the default is half the layers, rounded up
    assert build_student(model)[0].config.num_hidden_layers == 2
    with pytest.raises(RuntimeError):  # copy_layers is strict: a map that leaves a layer unset fails
        copy_layers(model, BertForSequenceClassification(BertConfig.from_dict(
            {**model.config.to_dict(), "num_hidden_layers": 3})), [0, 1])


def test_a_distilled_student_loads_in_transformers(teacher, tmp_path):
    transformers = pytest.importorskip("transformers")
    student = build_student(BertForSequenceClassification.from_pretrained(teacher), layers=3)[0].eval()
    student.save_pretrained(tmp_path / "student")
    peer = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "student").eval()
    assert peer.config.num_hidden_layers == 3 and peer.config.id2label == {0: "0", 1: "1"}
    ids = torch.tensor([[2, 8, 21, 13, 3], [2, 9, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        torch.testing.assert_close(student(ids, attention_mask=mask).logits, peer(ids, attention_mask=mask).logits,
                                   atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["preset", "checkpoint"])
def test_a_preset_or_a_checkpoint_as_the_student(encoder, teacher, tmp_path, kind):
    """--student tiny: BERT-Tiny's shape (random weights) with the teacher's vocabulary, positions and labels;
    --student DIR: that checkpoint's encoder with a new head configured as the teacher's."""
    train = write_classify(tmp_path / "train.csv", sentences(12, 5))
    student = "tiny" if kind == "preset" else str(encoder)
    task = distill_task(teacher, train, output_dir=tmp_path / "out", student=student, cache_dir=tmp_path / "cache")
    finetune(task, FinetuneArguments(output_dir=tmp_path / "out", max_steps=1, batch_size=12, progress=False))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["finetuning_task"] == "classify" and config["id2label"] == {"0": "0", "1": "1"}
    assert config["vocab_size"] == len(WORDS) and config["max_position_embeddings"] == 64
    if kind == "preset":
        assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]) == (2, 128, 2)
    else:
        assert (config["num_hidden_layers"], config["hidden_size"]) == (4, 32)
        ours = BertForSequenceClassification.from_pretrained(tmp_path / "out").state_dict()
        initial = BertForSequenceClassification.from_pretrained(encoder).state_dict()
        key = "bert.encoder.layer.3.output.dense.weight"  # the checkpoint's own layer (the teacher's differs)
        torch.testing.assert_close(ours[key], initial[key], atol=1e-3, rtol=0)
        assert not torch.allclose(ours[key], BertForSequenceClassification.from_pretrained(teacher).state_dict()[key])
    info = json.loads((tmp_path / "out" / "distillation.json").read_text())
    assert info["init"] == ("preset tiny" if kind == "preset" else f"checkpoint {encoder}")


# ---------------------------------------------------------------------------- the first loss, the cache

def _hand_loss(teacher_dir: Path, texts, labels, temperature: float, alpha: float) -> tuple[float, float]:
    """(T² · mean KL over all rows, alpha · mean cross-entropy over the labelled rows), from the teacher and
    the 2-layer student built from it, each run on one text at a time."""
    tokenizer = BertTokenizer.from_pretrained(teacher_dir)
    teacher = BertForSequenceClassification.from_pretrained(teacher_dir).eval()
    student = build_student(teacher, layers=2)[0].eval()
    kls, ces = [], []
    with torch.no_grad():
        for text, label in zip(texts, labels):
            ids = torch.tensor([tokenizer.encode(text)["input_ids"]])
            t = teacher(ids).logits[0].double().tolist()
            s = student(ids).logits[0].double().tolist()
            p, q = _softmax([v / temperature for v in t]), _softmax([v / temperature for v in s])
            kls.append(sum(pi * math.log(pi / qi) for pi, qi in zip(p, q)))
            if label is not None:
                ces.append(-math.log(_softmax(s)[int(label)]))
    return temperature ** 2 * sum(kls) / len(kls), alpha * sum(ces) / len(ces)


def test_the_students_first_loss_on_a_hand_built_batch(teacher, tmp_path):
    """The engine's first logged loss (the student as initialised, every example in one batch) equals the
    objective computed by hand: unlabelled rows of the training file and --unlabeled lines count in the
    soft term only."""
    rows = [("good film", "1"), ("the plot was dull", "0"), ("a lovely story", "1"), ("very poor", "0")]
    train = write_classify(tmp_path / "train.csv", rows, unlabelled=1)
    (tmp_path / "more.txt").write_text("quite superb\n\nit was awful and bad\n")
    task = distill_task(teacher, train, output_dir=tmp_path / "out", layers=2, unlabeled=[tmp_path / "more.txt"],
                        temperature=3.0, alpha=0.7, cache_dir=tmp_path / "cache")
    assert len(task.train_features) == 6
    finetune(task, FinetuneArguments(output_dir=tmp_path / "out", max_steps=1, batch_size=6, log_every=1,
                                     progress=False, lr=1e-3))
    first = json.loads((tmp_path / "out" / "log.jsonl").read_text().splitlines()[0])
    texts = [text for text, _ in rows] + ["quite superb", "it was awful and bad"]
    labels = ["1", "0", "1", None, None, None]
    soft, hard = _hand_loss(teacher, texts, labels, 3.0, 0.7)
    assert first["step"] == 1 and soft > 0.05 and hard > 0.05  # the student is not the teacher yet
    assert first["distill_loss"] == pytest.approx(soft, rel=1e-4)
    assert first["label_loss"] == pytest.approx(hard, rel=1e-4)
    assert first["loss"] == pytest.approx(soft + hard, rel=1e-4)
    info = json.loads((tmp_path / "out" / "distillation.json").read_text())
    assert info["teacher_layers"] == [0, 2] and info["labelled_examples"] == 3 and info["unlabeled_examples"] == 2
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert set(results["metrics"]) == {"teacher_agreement"}  # no --dev-file: agreement on the training file
    # the control: the same student on the labels alone, the cross-entropy unweighted
    control = distill_task(teacher, train, output_dir=tmp_path / "control", layers=2, labels_only=True,
                           unlabeled=[tmp_path / "more.txt"], alpha=0.7, cache_dir=tmp_path / "cache")
    finetune(control, FinetuneArguments(output_dir=tmp_path / "control", max_steps=1, batch_size=6, log_every=1,
                                        progress=False, lr=1e-3))
    first = json.loads((tmp_path / "control" / "log.jsonl").read_text().splitlines()[0])
    assert "distill_loss" not in first and first["loss"] == pytest.approx(hard / 0.7, rel=1e-4)


def test_the_teacher_cache_is_read_back_not_recomputed(teacher, tmp_path, monkeypatch):
    calls = []
    real = classify_distiller.teacher_logits

    def counting(*args, **kwargs):
        calls.append(len(args[1]))
        return real(*args, **kwargs)

    monkeypatch.setattr(classify_distiller, "teacher_logits", counting)
    train = write_classify(tmp_path / "train.csv", sentences(24, 1))
    dev = write_classify(tmp_path / "dev.csv", sentences(8, 2))

    def task(out: str, **options):
        return distill_task(teacher, train, dev_file=dev, output_dir=tmp_path / out, layers=1, **options)

    first = task("a")
    assert calls == [24, 8]  # the transfer set and the dev file, once each
    stored = sorted((tmp_path / "a" / "teacher_outputs").iterdir())  # under the student's OUT by default
    assert len(stored) == 2 and all((d / "logits.npy").is_file() for d in stored)
    assert not (teacher / "teacher_outputs").exists()  # the teacher's directory is never written to
    task("a")  # the same OUT again (as --resume): read back
    assert calls == [24, 8]
    first = task("a2", cache_dir=tmp_path / "shared")  # a cache shared by several students: --cache-dir
    assert calls == [24, 8, 24, 8]
    second = task("b", cache_dir=tmp_path / "shared")
    assert calls == [24, 8, 24, 8]  # read back, not recomputed
    rows = [first.train_features[:5]]
    assert torch.equal(first.collate(*rows)["teacher_logits"], second.collate(*rows)["teacher_logits"])
    logits = second.collate(*rows)["teacher_logits"]
    model = BertForSequenceClassification.from_pretrained(teacher)
    expected = classify_distiller.predict_features(model, first.train_features[:5], pad_token_id=0)
    np.testing.assert_allclose(logits.numpy(), expected, rtol=1e-5, atol=1e-6)
    # other inputs (a shorter --max-seq-length) are another key: computed again
    task("c", max_seq_length=4, cache_dir=tmp_path / "shared")
    assert calls == [24, 8, 24, 8, 24, 8]
    # the store: memory-mapped read-only, a half-written directory is never read
    arrays = cache_module.teacher_outputs(tmp_path / "store", "k", lambda: {"x": np.arange(6.0).reshape(3, 2)}, rows=3)
    assert isinstance(arrays["x"], np.memmap) and not arrays["x"].flags.writeable
    again = cache_module.teacher_outputs(tmp_path / "store", "k", lambda: pytest.fail("recomputed"), rows=3)
    assert again["x"].tolist() == [[0, 1], [2, 3], [4, 5]]
    (tmp_path / "store" / "k" / "meta.json").unlink()  # as if killed before the directory was finished
    redone = cache_module.teacher_outputs(tmp_path / "store", "k", lambda: {"x": np.ones((3, 2))}, rows=3)
    assert redone["x"].tolist() == [[1, 1]] * 3


# ---------------------------------------------------------------------------- the command end to end

@pytest.fixture(scope="module")
def sst2(shared_data, tmp_path_factory) -> Path:
    """The first rows of the real SST-2 (read in place; a few rows written to a scratch directory)."""
    source = shared_data / "glue" / "SST-2"
    directory = tmp_path_factory.mktemp("glue") / "SST-2"
    directory.mkdir()
    for split, count in (("train", 96), ("dev", 32), ("test", 8)):
        lines = (source / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[:count + 1]
        (directory / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def sst2_teacher(sst2, uncased_vocab, save_tiny_checkpoint, tmp_path_factory) -> Path:
    """A tiny 4-layer encoder with bert-base-uncased's vocabulary, fine-tuned on the SST-2 rows by the CLI."""
    tokens = uncased_vocab.read_text(encoding="utf-8").splitlines()
    encoder = save_tiny_checkpoint(tmp_path_factory.mktemp("uncased"), tokens, num_hidden_layers=4)
    out = tmp_path_factory.mktemp("runs") / "teacher"
    assert main(["finetune", "glue", "--task", "SST-2", "--data-dir", str(sst2), "--model", str(encoder),
                 "--output-dir", str(out), "--epochs", "1", "--batch-size", "16", "--lr", "1e-3", "--no-progress",
                 "--max-seq-length", "32", "--no-test-predictions"]) == 0
    return out


def test_distill_end_to_end_on_sst2_rows(sst2, sst2_teacher, tmp_path, capsys, monkeypatch):
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.txt").write_text("a gripping , funny film\nthe worst plot in years\n")
    student = tmp_path / "student"
    command = ["distill", "--teacher", str(sst2_teacher), "--output-dir", str(student), "--layers", "2",
               "--train-file", str(sst2 / "train.tsv"), "--dev-file", str(sst2 / "dev.tsv"),
               "--unlabeled", str(tmp_path / "text" / "*.txt"), "--epochs", "1", "--batch-size", "16",
               "--max-seq-length", "32", "--no-progress", "--cache-dir", str(tmp_path / "teacher-cache")]
    assert main(command) == 0
    assert "sst2: best at epoch" in capsys.readouterr().out
    config = json.loads((student / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["finetuning_task"] == "sst2"
    assert config["architectures"] == ["BertForSequenceClassification"] and config["id2label"] == {"0": "0", "1": "1"}
    results = json.loads((student / "eval_results.json").read_text())
    assert set(results["metrics"]) == {"accuracy", "teacher_agreement"}
    info = json.loads((student / "distillation.json").read_text())
    assert info["teacher_layers"] == [0, 2] and info["transfer_examples"] == 98 and info["unlabeled_examples"] == 2
    assert set(info["teacher_dev_metrics"]) == {"accuracy"}
    assert len((student / "dev_predictions.jsonl").read_text().splitlines()) == 32
    # a normal checkpoint: predict (fp32 and int8), the pipeline, transformers
    for dtype in ([], ["--dtype", "int8"]):
        output = tmp_path / f"p{len(dtype)}.tsv"
        assert main(["predict", "--model", str(student), "--input", str(sst2 / "test.tsv"), "--output", str(output),
                     *dtype]) == 0
        lines = output.read_text().splitlines()
        assert lines[0] == "index\tprediction" and len(lines) == 9
    assert pipeline("classify", model=student)(["a lovely film"])[0]["label"] in ("0", "1")
    transformers = pytest.importorskip("transformers")
    peer = transformers.BertForSequenceClassification.from_pretrained(student).eval()
    ours = BertForSequenceClassification.from_pretrained(student).eval()
    ids = torch.tensor([BertTokenizer.from_pretrained(student).encode("a lovely , moving film")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, peer(ids).logits, atol=1e-5, rtol=0)
    assert peer.config.num_hidden_layers == 2
    # a second student of the same teacher reads the teacher's outputs back from the shared --cache-dir
    monkeypatch.setattr(classify_distiller, "teacher_logits", lambda *a, **k: pytest.fail("teacher recomputed"))
    command[command.index(str(student))] = str(tmp_path / "student2")
    command[command.index("--layers") + 1] = "1"
    assert main(command) == 0
    assert json.loads((tmp_path / "student2" / "config.json").read_text())["num_hidden_layers"] == 1


def test_distill_a_regression_teacher_without_a_dev_file(encoder, tmp_path, capsys, monkeypatch):
    teacher = make_teacher(encoder, tmp_path / "teacher", regression=True)
    rows = [(text, f"{float(label) * 4:.1f}") for text, label in sentences(32, 3)]
    train = write_classify(tmp_path / "train.csv", rows, unlabelled=8)
    out = tmp_path / "student"
    command = ["distill", "--teacher", str(teacher), "--output-dir", str(out), "--train-file", str(train),
               "--epochs", "2", "--batch-size", "8", "--no-progress", "--save-every", "4"]
    save = Trainer.save

    def save_then_die(self, *args, **kwargs):
        save(self, *args, **kwargs)
        if self.step == 4:
            raise RuntimeError("killed")

    monkeypatch.setattr(Trainer, "save", save_then_die)
    with pytest.raises(RuntimeError, match="killed"):  # a run killed just after its checkpoint of step 4
        main(command + ["--log-every", "1"])
    monkeypatch.setattr(Trainer, "save", save)
    # --resume continues it from step 4 to the 8 steps of 2 epochs, reading the teacher's outputs back
    monkeypatch.setattr(classify_distiller, "teacher_logits", lambda *a, **k: pytest.fail("teacher recomputed"))
    assert main(command + ["--resume", "--log-every", "1"]) == 0
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == list(range(1, 9))
    results = json.loads((out / "eval_results.json").read_text())
    assert set(results["metrics"]) == {"teacher_mse"} and results["metrics"]["teacher_mse"] >= 0
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["problem_type"] == "regression" and config["num_labels"] == 1
    test = tmp_path / "test.csv"
    test.write_text("text\ngood film\nbad plot\n")
    assert main(["predict", "--model", str(out), "--input", str(test), "--output", str(tmp_path / "p.tsv")]) == 0
    lines = (tmp_path / "p.tsv").read_text().splitlines()
    assert len(lines) == 3 and all(math.isfinite(float(line.split("\t")[1])) for line in lines[1:])


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertforge distill: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_errors_are_one_line_before_any_work(encoder, teacher, save_tiny_checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_distill, "run", lambda args: pytest.fail("work started"))
    train = write_classify(tmp_path / "train.csv", sentences(8, 1))
    common = ["--output-dir", str(tmp_path / "out"), "--train-file", str(train)]
    # an untrained head: a bare encoder; a classifier whose weights lack the head
    assert "not a fine-tuned model" in _error(capsys, ["distill", "--teacher", str(encoder), *common])
    headless = tmp_path / "headless"
    shutil.copytree(encoder, headless)
    config = json.loads((headless / "config.json").read_text())
    (headless / "config.json").write_text(json.dumps({**config, "finetuning_task": "classify"}))
    assert "no trained classify head (classifier.weight, classifier.bias missing)" in \
        _error(capsys, ["distill", "--teacher", str(headless), *common])
    # a family not distilled yet (the list of those that are grows: only its start is asserted)
    other = tmp_path / "other"
    shutil.copytree(teacher, other, ignore=shutil.ignore_patterns("teacher_outputs"))
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "finetuning_task": "multiple-choice"}))
    assert "distillation of the 'multiple-choice' family is not supported yet (supported: classify, " in \
        _error(capsys, ["distill", "--teacher", str(other), *common])
    # more layers than the teacher's
    assert "--layers 5: the teacher has 4 layers" in _error(capsys, ["distill", "--teacher", str(teacher), *common,
                                                                      "--layers", "5"])
    # a student whose vocabulary differs
    foreign = save_tiny_checkpoint(tmp_path / "foreign", WORDS[:-1] + ["zebra"])
    assert "its vocabulary" in _error(capsys, ["distill", "--teacher", str(teacher), *common, "--student",
                                               str(foreign)])
    assert "--temperature must be a positive number" in _error(capsys, ["distill", "--teacher", str(teacher), *common,
                                                                         "--temperature", "0"])
    assert "is the teacher's directory" in _error(capsys, ["distill", "--teacher", str(teacher), "--output-dir",
                                                          str(teacher), "--train-file", str(train)])
    assert "--dev-file" in _error(capsys, ["distill", "--teacher", str(teacher), *common, "--dev-file",
                                           str(tmp_path / "missing.csv")])
