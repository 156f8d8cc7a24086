"""`bertforge distill` for the answer family (SQuAD): the span objective against a hand computation (the
position mask included), the teacher's start/end logits cached and read back, and the command end to end
on a tiny teacher fine-tuned on a few real SQuAD v1.1 questions, its student a normal SQuAD checkpoint."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bertforge import pipeline
from bertforge.cli import distill as cli_distill
from bertforge.cli import main
from bertforge.distillation import answer as answer_distiller
from bertforge.distillation import distill_task
from bertforge.modeling import BertConfig, BertForQuestionAnswering, BertForSequenceClassification
from bertforge.tasks.answer import predict_logits
from bertforge.tasks.squad_data import collate

pytestmark = pytest.mark.usefixtures("one_thread")


def _log_softmax(values: list[float]) -> list[float]:
    top = max(values)
    total = math.log(sum(math.exp(v - top) for v in values))
    return [v - top - total for v in values]


def _kl(teacher: list[float], student: list[float], temperature: float) -> float:
    p = _log_softmax([t / temperature for t in teacher])
    q = _log_softmax([s / temperature for s in student])
    return sum(math.exp(a) * (a - b) for a, b in zip(p, q))


class _Fixed(torch.nn.Module):
    """A "model" whose start/end logits are given (a leaf tensor each, to check the gradients)."""

    def __init__(self, start: torch.Tensor, end: torch.Tensor):
        super().__init__()
        self.start, self.end = start, end

    def forward(self, **inputs):
        return SimpleNamespace(start_logits=self.start, end_logits=self.end)


def test_the_span_loss_on_a_hand_built_batch_equals_a_hand_computation():
    # two windows: [CLS] q q [SEP] p p p [SEP] (valid: 0, 4, 5, 6) and [CLS] q [SEP] p p [SEP] [PAD] [PAD]
    # (valid: 0, 3, 4); gold start/end 5/6 and 0/0 (the answer elsewhere: [CLS])
    features = [{"input_ids": [2, 9, 9, 3, 7, 7, 7, 3], "token_type_ids": [0, 0, 0, 0, 1, 1, 1, 1],
                 "start_position": 5, "end_position": 6},
                {"input_ids": [2, 9, 3, 7, 7, 3], "token_type_ids": [0, 0, 0, 1, 1, 1],
                 "start_position": 0, "end_position": 0}]
    batch = collate(features, 0)
    mask = answer_distiller.position_mask(batch["token_type_ids"], batch["attention_mask"])
    valid = [[0, 4, 5, 6], [0, 3, 4]]
    assert [torch.nonzero(row).flatten().tolist() for row in mask] == valid
    student_start = [[0.5, 9.0, -3.0, 7.0, 1.0, 2.0, -1.0, 0.3], [1.5, 4.0, 8.0, -0.5, 2.5, 6.0, 11.0, -9.0]]
    student_end = [[-1.0, 2.0, 5.0, 0.0, 0.5, 1.5, 3.0, 4.0], [0.0, -2.0, 3.0, 1.0, -1.0, 7.0, 2.0, 5.0]]
    teacher_start = [[2.0, 3.0, 3.0, 3.0, -1.0, 4.0, 0.0, 9.0], [3.0, 0.0, 0.0, 0.5, 1.0, 9.0, 9.0, 9.0]]
    teacher_end = [[0.0, 1.0, 1.0, 1.0, 1.0, 0.5, 5.0, 7.0], [1.0, 8.0, 8.0, -2.0, 2.0, 8.0, 8.0, 8.0]]
    start = torch.tensor(student_start, requires_grad=True)
    end = torch.tensor(student_end, requires_grad=True)
    batch.update(position_mask=mask, teacher_start=torch.tensor(teacher_start),
                 teacher_end=torch.tensor(teacher_end))
    # the teacher's cached rows hold -inf outside the passage: the same loss
    cached = {k: torch.where(mask, batch[k], torch.tensor(-math.inf)) for k in ("teacher_start", "teacher_end")}
    T, alpha = 2.0, 0.3
    model = _Fixed(start, end)
    terms, metrics = answer_distiller.answer_step(T, alpha)(model, batch)
    again, _ = answer_distiller.answer_step(T, alpha)(model, {**batch, **cached})

    def pick(rows, i):
        return [rows[i][j] for j in valid[i]]

    soft = hard = 0.0
    for s_rows, t_rows, gold in ((student_start, teacher_start, "start_position"),
                                 (student_end, teacher_end, "end_position")):
        soft += sum(T * T * _kl(pick(t_rows, i), pick(s_rows, i), T) for i in range(2)) / 2 / 2
        hard += sum(-_log_softmax(pick(s_rows, i))[valid[i].index(features[i][gold])] for i in range(2)) / 2 / 2
    assert terms["distill_loss"].item() == pytest.approx(soft, rel=1e-6)
    assert terms["label_loss"].item() == pytest.approx(alpha * hard, rel=1e-6)
    assert again["distill_loss"].item() == pytest.approx(soft, rel=1e-6)
    # agreement over the valid positions only: starts 5/4 against the teacher's 5/0, ends 6/3 against 6/4
    # (unmasked, the student's first best start would be position 1): half of each window's pair on average
    assert metrics["teacher_agreement"][0].item() == pytest.approx(1.0) and metrics["teacher_agreement"][1] == 2
    # positions outside the passage take no gradient
    (terms["distill_loss"] + terms["label_loss"]).backward()
    for grad in (start.grad, end.grad):
        assert torch.all(grad[~mask] == 0) and torch.all(grad[mask] != 0)
    only, _ = answer_distiller.answer_step(T, alpha, labels_only=True)(model, batch)
    assert set(only) == {"label_loss"} and only["label_loss"].item() == pytest.approx(hard, rel=1e-6)


def test_the_version_and_recipe_come_from_the_teacher():
    def config(**extra) -> BertConfig:
        return BertConfig.from_dict({**BertConfig(vocab_size=8).to_dict(), **extra})

    v2 = config(finetuning_task="squad_v2", version_2_with_negative=True, squad={"max_seq_length": 256})
    assert answer_distiller.teacher_version(v2) == "2.0"
    assert answer_distiller.answer_recipe(v2, {}) == dict(lr=5e-5, batch_size=48, epochs=2.0, max_seq_length=256)
    v1 = config(finetuning_task="squad")
    assert answer_distiller.answer_recipe(v1, {"version": None}) == dict(lr=5e-5, batch_size=32, epochs=3.0,
                                                                         max_seq_length=384)
    with pytest.raises(ValueError, match="--version 2.0: the teacher was fine-tuned on SQuAD 1.1"):
        answer_distiller.teacher_version(v1, "2.0")
    silent = config(architectures=["BertForQuestionAnswering"])  # says nothing: --version, else 1.1
    assert answer_distiller.teacher_version(silent) == "1.1"
    assert answer_distiller.teacher_version(silent, "2.0") == "2.0"


# ---------------------------------------------------------------------------- a tiny teacher on real questions

@pytest.fixture(scope="module")
def squad_files(shared_data, tmp_path_factory) -> tuple[Path, Path]:
    """A handful of the real SQuAD v1.1 training questions (the first article's first paragraphs) as a
    training file, and the next paragraph's as a dev file (read in place, written to a scratch directory)."""
    source = json.loads((shared_data / "squad/v1.1/train-v1.1.first11.json").read_text(encoding="utf-8"))
    directory = tmp_path_factory.mktemp("squad")
    article = source["data"][0]
    files = []
    for name, paragraphs in (("train", article["paragraphs"][:2]), ("dev", article["paragraphs"][2:3])):
        data = {"version": "1.1", "data": [{"title": article["title"], "paragraphs": paragraphs}]}
        (directory / f"{name}.json").write_text(json.dumps(data), encoding="utf-8")
        files.append(directory / f"{name}.json")
    return files[0], files[1]


@pytest.fixture(scope="module")
def squad_teacher(squad_files, uncased_vocab, save_tiny_checkpoint, tmp_path_factory) -> Path:
    """A tiny 4-layer encoder with bert-base-uncased's vocabulary, fine-tuned on those questions by the CLI
    (a few steps: the tests need a teacher's outputs, not good ones)."""
    train, dev = squad_files
    tokens = uncased_vocab.read_text(encoding="utf-8").splitlines()
    encoder = save_tiny_checkpoint(tmp_path_factory.mktemp("uncased"), tokens, num_hidden_layers=4)
    out = tmp_path_factory.mktemp("runs") / "teacher"
    assert main(["finetune", "squad", "--train-file", str(train), "--dev-file", str(dev), "--model", str(encoder),
                 "--output-dir", str(out), "--max-steps", "6", "--batch-size", "8", "--lr", "1e-3", "--no-progress",
                 "--max-seq-length", "64", "--doc-stride", "16", "--max-query-length", "16"]) == 0
    return out


def test_the_teacher_cache_is_read_back_not_recomputed(squad_files, squad_teacher, tmp_path, monkeypatch):
    train, dev = squad_files
    calls = []
    real = answer_distiller.teacher_logits

    def counting(model, features, *args, **kwargs):
        calls.append(len(features))
        return real(model, features, *args, **kwargs)

    monkeypatch.setattr(answer_distiller, "teacher_logits", counting)

    def task(out: str, **options):
        return distill_task(squad_teacher, train, output_dir=tmp_path / out, layers=1, **options)

    first = task("a")
    windows = len(first.train_features)
    assert windows > 10 and calls == [windows]  # the transfer set's windows, once
    stored = sorted((tmp_path / "a" / "teacher_outputs").iterdir())
    assert len(stored) == 1 and {p.name for p in stored[0].iterdir()} == {"start_logits.npy", "end_logits.npy",
                                                                         "meta.json"}
    task("a")  # the same OUT again (as --resume): read back
    assert calls == [windows]
    arrays = np.load(stored[0] / "start_logits.npy", mmap_mode="r")
    assert arrays.dtype == np.float32 and arrays.shape == (windows, 64)
    # the stored rows are the teacher's logits, -inf outside [CLS] and the passage
    rows = first.train_features[:6]
    batch = first.collate(rows)
    teacher = BertForQuestionAnswering.from_pretrained(squad_teacher)
    expected = predict_logits(teacher, rows, 8, 0)
    for k, row in enumerate(rows):
        types = np.asarray(row["token_type_ids"])
        valid = (types == 1) & (np.arange(len(types)) < len(types) - 1)
        valid[0] = True
        assert valid.tolist() == batch["position_mask"][k, :len(types)].tolist()
        for which, side in (("teacher_start", 0), ("teacher_end", 1)):
            got = batch[which][k, :len(types)].numpy()
            np.testing.assert_allclose(got[valid], expected[k][side][valid], rtol=1e-5, atol=1e-5)
            assert np.all(np.isneginf(got[~valid]))
    # a dev file adds its windows once; another --doc-stride is another key
    task("b", dev_file=dev, cache_dir=tmp_path / "shared")
    assert calls[1] == windows and len(calls) == 3
    task("c", dev_file=dev, cache_dir=tmp_path / "shared")
    assert len(calls) == 3
    task("d", doc_stride=8, cache_dir=tmp_path / "shared")
    assert len(calls) == 4 and calls[3] > windows


def test_distill_end_to_end_on_squad_questions(squad_files, squad_teacher, tmp_path, capsys, monkeypatch):
    train, dev = squad_files
    student = tmp_path / "student"
    command = ["distill", "--teacher", str(squad_teacher), "--output-dir", str(student), "--layers", "2",
               "--train-file", str(train), "--dev-file", str(dev), "--max-steps", "4", "--batch-size", "8",
               "--no-progress", "--cache-dir", str(tmp_path / "teacher-cache")]
    assert main(command) == 0
    assert "squad: best at" in capsys.readouterr().out
    config = json.loads((student / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["finetuning_task"] == "squad"
    assert config["architectures"] == ["BertForQuestionAnswering"] and config["version_2_with_negative"] is False
    assert config["squad"]["max_seq_length"] == 64 and config["squad"]["doc_stride"] == 16  # the teacher's
    results = json.loads((student / "eval_results.json").read_text())
    assert {"exact_match", "f1", "start_agreement", "end_agreement", "teacher_agreement"} <= set(results["metrics"])
    info = json.loads((student / "distillation.json").read_text())
    assert info["teacher_layers"] == [0, 2] and info["version"] == "1.1"
    assert info["objective"] == "soft targets + labels"
    assert {"exact_match", "f1"} <= set(info["teacher_dev_metrics"])
    questions = sum(len(p["qas"]) for a in json.loads(dev.read_text())["data"] for p in a["paragraphs"])
    assert len(json.loads((student / "predictions.json").read_text())) == questions
    # a normal SQuAD checkpoint: predict and the answer pipeline take it
    context = "Architecturally, the school has a Catholic character."
    assert main(["predict", "--model", str(student), "--question", "What character has the school?",
                 "--context", context]) == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert answer["answer"] == context[answer["start"]:answer["end"]]
    assert pipeline("answer", model=student)(["what character?"], [context])[0]["answer"] in context
    # the control (labels alone), without a dev file: the teacher's outputs read back from the shared cache
    monkeypatch.setattr(answer_distiller, "teacher_logits", lambda *a, **k: pytest.fail("teacher recomputed"))
    control = tmp_path / "control"
    assert main(["distill", "--teacher", str(squad_teacher), "--output-dir", str(control), "--layers", "1",
                 "--train-file", str(train), "--max-steps", "2", "--batch-size", "8", "--no-progress",
                 "--labels-only", "--cache-dir", str(tmp_path / "teacher-cache")]) == 0
    results = json.loads((control / "eval_results.json").read_text())
    assert set(results["metrics"]) == {"start_agreement", "end_agreement", "teacher_agreement"}
    assert json.loads((control / "distillation.json").read_text())["objective"] == "labels only"


def test_errors_are_one_line_before_any_work(squad_files, squad_teacher, tmp_path, capsys):
    train, _ = squad_files
    base = ["distill", "--teacher", str(squad_teacher), "--output-dir", str(tmp_path / "s"), "--train-file", str(train)]
    for extra, message in ((["--version", "2.0"], "--version 2.0: the teacher was fine-tuned on SQuAD 1.1"),
                           (["--doc-stride", "60"], "--doc-stride (60) must be less than"),
                           (["--unlabeled", str(train)], "--unlabeled: an answer teacher's transfer set"),
                           (["--tune-threshold"], "--tune-threshold chooses the no-answer threshold of SQuAD 2.0")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "s" / "teacher_outputs").exists()


def test_the_answer_flags_are_refused_for_another_family(squad_teacher, tmp_path, capsys):
    classify = tmp_path / "classify"
    classify.mkdir()
    (classify / "vocab.txt").write_bytes((squad_teacher / "vocab.txt").read_bytes())
    BertForSequenceClassification.from_pretrained(squad_teacher, num_labels=2, finetuning_task="classify",
                                                  problem_type="single_label_classification").save_pretrained(classify)
    train = tmp_path / "train.csv"
    train.write_text("text,label\nthe school,1\n")
    assert main(["distill", "--teacher", str(classify), "--output-dir", str(tmp_path / "s"), "--train-file",
                 str(train), "--doc-stride", "16"]) == 2
    err = capsys.readouterr().err
    assert "--doc-stride applies to another family's teacher" in err and "is a classify model" in err
    assert main(["distill", "--teacher", str(classify), "--output-dir", str(tmp_path / "s"), "--train-file",
                 str(train), "--tune-threshold"]) == 2
    assert "--tune-threshold applies to another family's teacher" in capsys.readouterr().err


def test_a_squad_2_teacher_distils_with_its_version_and_recipe(shared_data, squad_teacher, tmp_path, capsys,
                                                               monkeypatch):
    """A v2.0 teacher (its config.json says so): unanswerable questions train towards [CLS], the dev file is
    scored as v2.0 (null odds written), the student is a v2.0 model, and `finetune squad`'s v2.0 recipe
    (batch 48, 2 epochs) is the default."""
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    for path in squad_teacher.iterdir():
        if path.is_file():
            (teacher / path.name).write_bytes(path.read_bytes())
    config = json.loads((teacher / "config.json").read_text())
    (teacher / "config.json").write_text(json.dumps({**config, "finetuning_task": "squad_v2",
                                                     "version_2_with_negative": True}))
    source = json.loads((shared_data / "squad/v2.0/train-v2.0.first10.json").read_text(encoding="utf-8"))
    article = source["data"][4]
    files = {}
    for name, paragraphs in (("train", [1, 4]), ("dev", [6])):
        data = {"version": "v2.0", "data": [{"title": article["title"],
                                             "paragraphs": [article["paragraphs"][i] for i in paragraphs]}]}
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(data), encoding="utf-8")
    seen = {}
    real = cli_distill.engine.finetune_grid

    def grid(task, args, *rest):
        seen.update(batch_size=args.batch_size, epochs=args.epochs)
        return real(task, args, *rest)

    monkeypatch.setattr(cli_distill.engine, "finetune_grid", grid)
    student = tmp_path / "student"
    assert main(["distill", "--teacher", str(teacher), "--output-dir", str(student), "--layers", "1",
                 "--train-file", str(files["train"]), "--dev-file", str(files["dev"]), "--max-steps", "1",
                 "--no-progress"]) == 0
    assert seen == {"batch_size": 48, "epochs": 2.0}
    config = json.loads((student / "config.json").read_text())
    assert config["finetuning_task"] == "squad_v2" and config["version_2_with_negative"] is True
    metrics = json.loads((student / "eval_results.json").read_text())["metrics"]
    assert {"f1", "HasAns_f1", "NoAns_f1", "teacher_agreement"} <= set(metrics)
    assert (student / "null_odds.json").is_file()
    assert json.loads((student / "distillation.json").read_text())["version"] == "2.0"
    # --tune-threshold: the same student (same seed, one step) at the threshold that maximises its dev F1,
    # which it keeps in its config.json for `predict` and the pipeline
    tuned = tmp_path / "tuned"
    assert main(["distill", "--teacher", str(teacher), "--output-dir", str(tuned), "--layers", "1",
                 "--train-file", str(files["train"]), "--dev-file", str(files["dev"]), "--max-steps", "1",
                 "--no-progress", "--tune-threshold"]) == 0
    tuned_metrics = json.loads((tuned / "eval_results.json").read_text())["metrics"]
    assert tuned_metrics["f1"] >= metrics["f1"] and metrics["null_score_diff_threshold"] == 0.0
    threshold = json.loads((tuned / "config.json").read_text())["squad"]["null_score_diff_threshold"]
    assert threshold == tuned_metrics["null_score_diff_threshold"]
    assert main(["distill", "--teacher", str(teacher), "--output-dir", str(tmp_path / "no-dev"), "--layers", "1",
                 "--train-file", str(files["train"]), "--tune-threshold"]) == 2
    assert "--tune-threshold chooses the no-answer threshold on dev: give --dev-file" in capsys.readouterr().err
    # the v1.1 teacher refuses this data, naming the question
    assert main(["distill", "--teacher", str(squad_teacher), "--output-dir", str(tmp_path / "v1"), "--train-file",
                 str(files["train"])]) == 2
    assert "is unanswerable (is_impossible) but the teacher answers SQuAD 1.1" in capsys.readouterr().err
