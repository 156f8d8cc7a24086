"""Fine-tuning sentence(-pair) classification end to end on the shared engine: GLUE layout and the
user's own files, the best-model selection, lr grid and seeds, and `predict`."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.modeling import BertConfig, BertForSequenceClassification, BertModel, plans
from bertforge.tasks.classify import classify_task, predict_file
from bertforge.tasks.glue import glue_task
from bertforge.training.finetune import FinetuneArguments, describe, finetune, finetune_grid

REPO = Path(__file__).resolve().parents[2]
POSITIVE = ["good", "great", "fine", "lovely", "superb"]
NEGATIVE = ["bad", "awful", "poor", "dull", "terrible"]
FILLER = ["the", "film", "was", "a", "plot", "very", "quite", "story", "and", "it"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, save_tiny_checkpoint) -> Path:
    """A random small encoder with a word-level vocabulary, saved as a checkpoint."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","] + POSITIVE + NEGATIVE + FILLER
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), vocab)


def sentences(count: int, seed: int) -> list[tuple[str, str]]:
    """(sentence, label): the label is "1" when the sentence holds a positive word, else "0"."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        label = rng.random() < 0.5
        words = rng.choices(FILLER, k=rng.randint(2, 9)) + [rng.choice(POSITIVE if label else NEGATIVE)]
        rng.shuffle(words)
        rows.append((" ".join(words) + " .", "1" if label else "0"))
    return rows


@pytest.fixture(scope="module")
def sst2_dir(tmp_path_factory) -> Path:
    """A learnable task in GLUE's SST-2 layout (header `sentence<TAB>label`; test: `index<TAB>sentence`)."""
    directory = tmp_path_factory.mktemp("glue") / "SST-2"
    directory.mkdir()
    for split, count, seed in (("train", 192, 1), ("dev", 64, 2)):
        lines = ["sentence\tlabel"] + [f"{s}\t{label}" for s, label in sentences(count, seed)]
        (directory / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    lines = ["index\tsentence"] + [f"{i}\t{s}" for i, (s, _) in enumerate(sentences(10, 3))]
    (directory / "test.tsv").write_text("\n".join(lines) + "\n")
    return directory


def fast_args(out: Path, **overrides) -> FinetuneArguments:
    values = dict(output_dir=out, lr=1e-2, epochs=6, batch_size=16, progress=False, log_every=5)
    values.update(overrides)
    return FinetuneArguments(**values)


def test_glue_finetune_beats_the_majority_class_and_keeps_the_best(tiny_model, sst2_dir, tmp_path):
    task = glue_task("sst2", sst2_dir, tiny_model)
    results = finetune(task, fast_args(tmp_path / "out"))
    labels = [line.split("\t")[1] for line in (sst2_dir / "dev.tsv").read_text().splitlines()[1:]]
    majority = max(labels.count("0"), labels.count("1")) / len(labels)
    assert results["task"] == "sst2" and set(results["metrics"]) == {"accuracy"}
    assert results["metrics"]["accuracy"] > majority + 0.15
    # The kept model is the best evaluation in the log, and it is a loadable checkpoint.
    log = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    evals = [r for r in log if "eval_accuracy" in r]
    assert len(evals) == 6  # one per epoch
    best = max(evals, key=lambda r: r["eval_accuracy"])
    assert results["metrics"]["accuracy"] == best["eval_accuracy"] and results["step"] == best["step"]
    model = BertForSequenceClassification.from_pretrained(tmp_path / "out")
    assert model.config.id2label == {0: "0", 1: "1"} and model.config.extra["finetuning_task"] == "sst2"
    rows = [json.loads(line) for line in (tmp_path / "out" / "dev_predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 64 and sum(r["correct"] for r in rows) / 64 == pytest.approx(best["eval_accuracy"])
    # The same model predicts the same dev accuracy through `predict`.
    predict_file(tmp_path / "out", sst2_dir / "dev.tsv", tmp_path / "dev_preds.tsv")
    predicted = [line.split("\t")[1] for line in (tmp_path / "dev_preds.tsv").read_text().splitlines()[1:]]
    assert sum(p == label for p, label in zip(predicted, labels)) / 64 == pytest.approx(best["eval_accuracy"])


def test_predict_writes_the_glue_submission_format(tiny_model, sst2_dir, tmp_path):
    out = tmp_path / "out"
    assert main(["finetune", "glue", "--task", "SST-2", "--data-dir", str(sst2_dir.parent), "--model",
                 str(tiny_model), "--output-dir", str(out), "--epochs", "1", "--batch-size", "32", "--lr", "1e-3",
                 "--no-progress", "--max-seq-length", "64"]) == 0
    lines = (out / "SST-2.tsv").read_text().splitlines()  # written after training, from the best model
    assert lines[0] == "index\tprediction" and len(lines) == 11
    assert [line.split("\t")[0] for line in lines[1:]] == [str(i) for i in range(10)]
    assert all(line.split("\t")[1] in ("0", "1") for line in lines[1:])
    assert main(["predict", "--model", str(out), "--input", str(sst2_dir / "test.tsv"),
                 "--output", str(tmp_path / "again.tsv")]) == 0
    assert (tmp_path / "again.tsv").read_text() == (out / "SST-2.tsv").read_text()
    # --dtype: unpadded fp32 is the same function; int8 the same format (its labels may move)
    for dtype in ("fp32", "int8"):
        assert main(["predict", "--model", str(out), "--input", str(sst2_dir / "test.tsv"),
                     "--output", str(tmp_path / f"{dtype}.tsv"), "--dtype", dtype]) == 0
        lines = (tmp_path / f"{dtype}.tsv").read_text().splitlines()
        assert lines[0] == "index\tprediction" and len(lines) == 11
        assert all(line.split("\t")[1] in ("0", "1") for line in lines[1:])
    assert (tmp_path / "fp32.tsv").read_text() == (out / "SST-2.tsv").read_text()
    results = json.loads((out / "eval_results.json").read_text())
    assert set(results) >= {"task", "metrics", "epoch", "step"} and 0 <= results["metrics"]["accuracy"] <= 1


def test_lr_grid_and_seeds_write_summary_statistics(tiny_model, sst2_dir, tmp_path):
    task = glue_task("sst2", sst2_dir, tiny_model, max_train_examples=64)
    summary = finetune_grid(task, fast_args(tmp_path / "out", epochs=1), lrs=[1e-3, 1e-4], seeds=[1, 2])
    assert [(r["lr"], r["seed"]) for r in summary["runs"]] == [(1e-3, 1), (1e-3, 2), (1e-4, 1), (1e-4, 2)]
    for lr in ("0.001", "0.0001"):
        values = [r["metrics"]["accuracy"] for r in summary["runs"] if f"{r['lr']:g}" == lr]
        assert summary["by_lr"][lr]["accuracy"] == describe(values)
    best_lr = max((1e-3, 1e-4), key=lambda lr: summary["by_lr"][f"{lr:g}"]["accuracy"]["mean"])
    assert summary["best_lr"] == best_lr and summary["metrics"] == summary["by_lr"][f"{best_lr:g}"]
    # The best run's model is copied into OUT; summary.json is on disk.
    best_dir = Path(summary["best_run"]["dir"])
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (best_dir / "model.safetensors").read_bytes()
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["best_lr"] == best_lr
    # Different seeds give different heads, hence different runs.
    first, second = (BertForSequenceClassification.from_pretrained(tmp_path / "out" / f"lr0.001-seed{s}")
                     for s in (1, 2))
    assert not torch.equal(first.classifier.weight, second.classifier.weight)
    # --resume reads finished runs back instead of training again.
    again = finetune_grid(task, fast_args(tmp_path / "out", epochs=1, resume=True), lrs=[1e-3, 1e-4], seeds=[1, 2])
    assert again["runs"] == summary["runs"]


def test_an_lr_grid_of_one_run_keeps_the_grid_layout_and_resume_reads_it_back(tiny_model, sst2_dir, tmp_path):
    out = tmp_path / "out"
    command = ["finetune", "glue", "--task", "sst2", "--data-dir", str(sst2_dir.parent), "--model", str(tiny_model),
               "--output-dir", str(out), "--lr-grid", "1e-3", "--seed", "7", "--epochs", "1", "--max-train-examples",
               "32", "--no-progress", "--no-test-predictions", "--max-seq-length", "64"]
    assert main(command) == 0
    run_dir = out / "lr0.001-seed7"
    summary = json.loads((out / "summary.json").read_text())
    assert [r["dir"] for r in summary["runs"]] == [str(run_dir)] and summary["metrics"]["accuracy"]["n"] == 1
    assert not (out / "log.jsonl").exists() and (out / "model.safetensors").is_file()
    # The same command with --resume reads the finished run back: nothing is trained, into OUT or the run.
    log = (run_dir / "log.jsonl").read_bytes()
    assert main(command + ["--resume"]) == 0
    assert (run_dir / "log.jsonl").read_bytes() == log and not (out / "log.jsonl").exists()
    assert json.loads((out / "summary.json").read_text())["runs"] == summary["runs"]
    # A second seed run on its own into the same OUT, then pooled with the first: both read back.
    seed_at = command.index("--seed") + 1
    assert main(command[:seed_at] + ["8"] + command[seed_at + 1:]) == 0
    logs = {seed: (out / f"lr0.001-seed{seed}" / "log.jsonl").read_bytes() for seed in (7, 8)}
    assert main(command + ["--seeds", "2", "--resume"]) == 0
    pooled = json.loads((out / "summary.json").read_text())
    assert [r["seed"] for r in pooled["runs"]] == [7, 8] and pooled["metrics"]["accuracy"]["n"] == 2
    assert pooled["runs"][0] == summary["runs"][0]
    assert all((out / f"lr0.001-seed{seed}" / "log.jsonl").read_bytes() == logs[seed] for seed in (7, 8))


def test_a_single_run_and_a_grid_do_not_share_an_output_directory(tiny_model, sst2_dir, tmp_path):
    task = glue_task("sst2", sst2_dir, tiny_model, max_train_examples=32)
    finetune_grid(task, fast_args(tmp_path / "grid", epochs=1), lrs=[1e-3])
    for resume in (False, True):  # a single run would overwrite the grid's best model
        with pytest.raises(ValueError, match=r"grid .*holds a learning-rate/seed grid \(summary.json\)"):
            finetune(task, fast_args(tmp_path / "grid", epochs=1, resume=resume))
    finetune(task, fast_args(tmp_path / "single", epochs=1))
    with pytest.raises(ValueError, match=r"single holds a single run \(log.jsonl\)"):
        finetune_grid(task, fast_args(tmp_path / "single", epochs=1, resume=True), seeds=[1, 2])


def test_describe_uses_the_sample_standard_deviation():
    stats = describe([0.8, 0.9, 1.0])
    assert stats["mean"] == pytest.approx(0.9) and stats["std"] == pytest.approx(0.1)
    assert (stats["min"], stats["max"], stats["n"]) == (0.8, 1.0, 3)
    assert describe([0.5])["std"] == 0.0


def test_a_second_run_into_the_same_directory_is_refused(tiny_model, sst2_dir, tmp_path):
    task = glue_task("sst2", sst2_dir, tiny_model, max_train_examples=32)
    finetune(task, fast_args(tmp_path / "out", epochs=1))
    with pytest.raises(ValueError, match="already holds a run"):
        finetune(task, fast_args(tmp_path / "out", epochs=1))


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_own_files_string_labels_and_predict(tiny_model, tmp_path, suffix):
    def write(path: Path, rows):
        if suffix == ".csv":
            path.write_text("text,label\n" + "".join(f'"{s}",{"pos" if y == "1" else "neg"}\n' for s, y in rows))
        else:
            path.write_text("".join(json.dumps({"text": s, "label": "pos" if y == "1" else "neg"}) + "\n"
                                    for s, y in rows))

    write(tmp_path / f"train{suffix}", sentences(192, 1))
    write(tmp_path / f"dev{suffix}", sentences(64, 2))
    task = classify_task(tiny_model, tmp_path / f"train{suffix}", tmp_path / f"dev{suffix}")
    results = finetune(task, fast_args(tmp_path / "out"))
    assert results["task"] == "classify" and set(results["metrics"]) == {"accuracy", "f1_macro"}
    assert results["metrics"]["accuracy"] > 0.65
    model = BertForSequenceClassification.from_pretrained(tmp_path / "out")
    assert model.config.id2label == {0: "neg", 1: "pos"}
    path = predict_file(tmp_path / "out", tmp_path / f"dev{suffix}", tmp_path / "preds.tsv")
    lines = path.read_text().splitlines()
    assert lines[0] == "index\tprediction\tscore" and len(lines) == 65
    assert all(line.split("\t")[1] in ("neg", "pos") and 0.5 <= float(line.split("\t")[2]) <= 1
               for line in lines[1:])


def test_regression_on_own_files(tiny_model, tmp_path):
    rows = sentences(128, 4)
    for name, part in (("train.tsv", rows[:96]), ("dev.tsv", rows[96:])):
        (tmp_path / name).write_text("text\tlabel\n" + "".join(f"{s}\t{float(y) * 5:.1f}\n" for s, y in part))
    task = classify_task(tiny_model, tmp_path / "train.tsv", tmp_path / "dev.tsv", regression=True)
    results = finetune(task, fast_args(tmp_path / "out", epochs=2))
    assert set(results["metrics"]) == {"pearson", "spearman", "mse"}
    model = BertForSequenceClassification.from_pretrained(tmp_path / "out")
    assert model.config.num_labels == 1 and model.config.extra["problem_type"] == "regression"
    lines = predict_file(tmp_path / "out", tmp_path / "dev.tsv", tmp_path / "p.tsv").read_text().splitlines()
    assert len(lines) == 33 and all(float(line.split("\t")[1]) == float(line.split("\t")[2]) for line in lines[1:])


def test_predict_names_a_malformed_row(tiny_model, sst2_dir, tmp_path):
    finetune(glue_task("sst2", sst2_dir, tiny_model, max_train_examples=32), fast_args(tmp_path / "out", epochs=1))
    bad = tmp_path / "test.tsv"
    bad.write_text("index\tsentence\n0\tfine .\n1\tmissing\tcolumn\textra\n")
    with pytest.raises(ValueError, match=r"test.tsv:3"):
        predict_file(tmp_path / "out", bad, tmp_path / "p.tsv")


def test_unpadded_training_follows_the_padded_path(tiny_model, sst2_dir, tmp_path, monkeypatch):
    """`unpad=True` changes only where the compute goes: without dropout (whose masks would be drawn
    over other shapes) the losses and dev accuracy of every step equal the padded run's to rounding."""
    model_dir = tmp_path / "no_dropout"
    model_dir.mkdir()
    for file in tiny_model.iterdir():
        (model_dir / file.name).write_bytes(file.read_bytes())
    config = json.loads((model_dir / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (model_dir / "config.json").write_text(json.dumps(config))
    unpadded_calls = []
    packed_plan = plans.PackedPlan  # one per forward pass on the packed (unpadded) layout
    monkeypatch.setattr(plans, "PackedPlan", lambda *a, **k: unpadded_calls.append(1) or packed_plan(*a, **k))
    logs = {}
    for unpad in (False, True):
        out = tmp_path / f"unpad_{unpad}"
        finetune(glue_task("sst2", sst2_dir, model_dir),
                 fast_args(out, epochs=2, unpad=unpad, group_by_length=False, log_every=1))
        assert bool(unpadded_calls) == unpad  # the padded run never took the unpadded path; the other did
        logs[unpad] = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert len(unpadded_calls) >= 24
    losses = {unpad: [r["loss"] for r in log if "loss" in r] for unpad, log in logs.items()}
    assert len(losses[True]) == len(losses[False]) == 24
    assert losses[True] == pytest.approx(losses[False], abs=1e-5)
    accuracies = {unpad: [r["eval_accuracy"] for r in log if "eval_accuracy" in r] for unpad, log in logs.items()}
    assert accuracies[True] == accuracies[False]


def test_random_init_script_copies_config_and_vocabulary_not_weights(tiny_model, tmp_path):
    """The control arm of the pre-trained-vs-random comparison: same architecture and tokenizer,
    BERT's initialisation, reproducible for a seed, and loadable by every task head."""
    spec = importlib.util.spec_from_file_location("random_init", REPO / "scripts" / "random_init.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):  # the fixture itself was drawn with seed 0
        assert module.main(["--like", str(tiny_model), "--output-dir", str(tmp_path / name), "--seed", str(seed)]) == 0
    assert BertConfig.from_pretrained(tmp_path / "a").to_dict() == BertConfig.from_pretrained(tiny_model).to_dict() | {
        "architectures": ["BertForPreTraining"]}
    assert (tmp_path / "a" / "vocab.txt").read_bytes() == (tiny_model / "vocab.txt").read_bytes()
    weights = {name: BertModel.from_pretrained(tmp_path / name).embeddings.word_embeddings.weight
               for name in ("a", "b", "c")}
    original = BertModel.from_pretrained(tiny_model).embeddings.word_embeddings.weight
    assert torch.equal(weights["a"], weights["b"]) and not torch.equal(weights["a"], weights["c"])
    assert not torch.equal(weights["a"], original)
    assert weights["a"].std().item() == pytest.approx(0.0176, abs=0.003)  # truncated normal, std 0.02 before cutting
    BertForSequenceClassification.from_pretrained(tmp_path / "a", num_labels=2)
    with pytest.raises(SystemExit, match="no vocab.txt"):
        module.main(["--like", str(tmp_path), "--output-dir", str(tmp_path / "d")])
    before = (tmp_path / "a" / "model.safetensors").read_bytes()
    with pytest.raises(SystemExit, match="already holds a model"):
        module.main(["--like", str(tiny_model), "--output-dir", str(tmp_path / "a"), "--seed", "5"])
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == before


# -- failed runs and resume -------------------------------------------------------------------------

def _predict(model: Path, sst2_dir: Path, output: Path) -> int:
    return main(["predict", "--model", str(model), "--input", str(sst2_dir / "test.tsv"), "--output", str(output)])


def test_a_failed_run_is_marked_unfinished_and_predict_refuses_it(tiny_model, sst2_dir, tmp_path, capsys):
    task = glue_task("sst2", sst2_dir, tiny_model, max_train_examples=32)  # 2 steps an epoch
    evaluate, calls = task.evaluate, []

    def fails_the_second_time(model):
        calls.append(model)
        if len(calls) == 2:
            raise ValueError("dev.tsv:3: an input the evaluation cannot take")
        return evaluate(model)

    task.evaluate = fails_the_second_time
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="cannot take"):
        finetune(task, fast_args(out, epochs=2, save_every=2))
    # The first epoch's model and results were kept, as a finished run's would be: the marker tells them apart.
    assert (out / "model.safetensors").is_file() and (out / "eval_results.json").is_file()
    assert "unfinished" in (out / "RUNNING").read_text()
    assert _predict(out, sst2_dir, tmp_path / "p.tsv") == 2
    error = capsys.readouterr().err
    assert error.startswith(f"bertforge predict: error: {out} holds an unfinished run (RUNNING marker")
    assert error.count("\n") == 1 and "--resume" in error and not (tmp_path / "p.tsv").exists()
    with pytest.raises(ValueError, match="unfinished run"):
        BertForSequenceClassification.from_pretrained(out)
    from bertforge.serving import pipeline

    with pytest.raises(ValueError, match="unfinished run"):
        pipeline("classify", out)
    # Finished with --resume, the directory is a model like any other.
    task.evaluate = evaluate
    results = finetune(task, fast_args(out, epochs=2, save_every=2, resume=True))
    assert not (out / "RUNNING").exists() and results["wall_seconds"] > 0
    assert _predict(out, sst2_dir, tmp_path / "p.tsv") == 0


def test_a_killed_run_is_marked_unfinished(tiny_model, sst2_dir, tmp_path, capsys):
    import subprocess
    import sys
    import time

    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "bertforge", "finetune", "glue", "--task", "sst2", "--data-dir", str(sst2_dir.parent),
         "--model", str(tiny_model), "--output-dir", str(out), "--epochs", "1000", "--batch-size", "16",
         "--max-train-examples", "32", "--eval-every", "2", "--lr", "1e-3", "--no-progress", "--no-test-predictions",
         "--max-seq-length", "64"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (out / "eval_results.json").is_file() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process.poll() is None, "the run ended before it could be killed"
        assert (out / "eval_results.json").is_file(), "no evaluation within 2 minutes"
    finally:
        process.kill()  # SIGKILL: nothing in the run gets to clean up
        process.wait()
    assert (out / "RUNNING").is_file() and (out / "model.safetensors").is_file()
    assert _predict(out, sst2_dir, tmp_path / "p.tsv") == 2
    assert "holds an unfinished run" in capsys.readouterr().err


def test_a_non_finite_loss_is_one_line_naming_the_checkpoint_to_resume_from(tiny_model, sst2_dir, tmp_path, capsys,
                                                                            monkeypatch):
    from bertforge.training.loop import Trainer

    original = Trainer._optimizer_step

    def diverges_at_step_7(self, step_loss):
        original(self, step_loss * float("nan") if self.step >= 6 else step_loss)

    monkeypatch.setattr(Trainer, "_optimizer_step", diverges_at_step_7)
    out = tmp_path / "out"
    command = ["finetune", "glue", "--task", "sst2", "--data-dir", str(sst2_dir.parent), "--model", str(tiny_model),
               "--output-dir", str(out), "--max-train-examples", "64", "--batch-size", "16", "--epochs", "3",
               "--save-every", "4", "--log-every", "2", "--lr", "1e-3", "--no-progress", "--no-test-predictions",
               "--max-seq-length", "64"]
    assert main(command) == 1  # a failed run, not a usage error
    error = capsys.readouterr().err
    checkpoints = out / "checkpoints"
    assert error.startswith("bertforge finetune: error: the loss is not finite (NaN or inf) at step 7")
    assert f"{checkpoints / 'checkpoint-00000004.pt'} (step 4), where --resume continues" in error
    assert error.count("\n") == 1 and "Traceback" not in error
    assert (out / "RUNNING").is_file()
    # As the message says: a lower rate and --resume, from that checkpoint.
    monkeypatch.undo()
    assert main(command + ["--resume", "--lr", "5e-4"]) == 0
    assert not (out / "RUNNING").exists()
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [2, 4, 6, 8, 10, 12]


def test_resume_on_other_training_data_is_refused(tiny_model, sst2_dir, tmp_path):
    out = tmp_path / "out"
    finetune(glue_task("sst2", sst2_dir, tiny_model, max_train_examples=32), fast_args(out, epochs=1, save_every=2))
    other = tmp_path / "other" / "SST-2"
    other.mkdir(parents=True)
    (other / "dev.tsv").write_text((sst2_dir / "dev.tsv").read_text())
    (other / "train.tsv").write_text("\n".join(["sentence\tlabel"] + [f"{s}\t{label}" for s, label in
                                                                       sentences(192, 9)]) + "\n")
    task = glue_task("sst2", other, tiny_model, max_train_examples=32)  # as many examples, other sentences
    with pytest.raises(ValueError) as error:
        finetune(task, fast_args(out, epochs=1, save_every=2, resume=True))
    message = str(error.value)
    assert message.startswith("--resume: this run's settings differ from those of the checkpoint")
    assert "the training data (--train-file or --data-dir, --max-seq-length, --max-train-examples)" in message
    assert "examples per phase" not in message and "--seed" not in message
