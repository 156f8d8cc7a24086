"""A task family plugs in through the registry alone: one module's functions and one `register_family`
call add a `bertforge finetune` sub-command (trained by the shared engine), a `bertforge predict`
predictor with its own flag, and the pipeline that serves its checkpoints, with no other file touched."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from bertforge.cli import main
from bertforge.modeling import BertForSequenceClassification, load_for_inference
from bertforge.serving import pipeline
from bertforge.serving.registry import pipeline_for_checkpoint, resolve_task
from bertforge.tasks.classify import classification_task, predict_examples
from bertforge.tasks.classify_features import convert_examples_to_features
from bertforge.tasks.classify_reader import InputExample
from bertforge.tasks.registry import (Distillation, FinetuneCommand, PredictCommand, TaskFamily, family_for_checkpoint,
                                      register_family, resolve, unregister_family)
from bertforge.tokenization import BertTokenizer
from bertforge.training.finetune import FinetuneTask

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "great", "awful", "movie", "film", "the", "a",
         "is", "was"]
LABELS = ["no", "yes"]


# ---------------------------------------------------------------------------- the toy family: one module's worth

def read_toy_file(path: str | Path) -> list[InputExample]:
    """`label<TAB>text` per line (the label may be empty: unlabelled); ValueError naming file and line."""
    examples = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        label, tab, text = line.partition("\t")
        if not tab or not text.strip():
            raise ValueError(f"{path}:{number}: expected label<TAB>text")
        examples.append(InputExample(str(number), text, None, label or None))
    return examples


def read_toy_rows(path: str | Path, regression: bool = False, *, label_list=None,
                  require_labels: bool = False) -> tuple[list[InputExample], list[str]]:
    """The family's `reader` as the distiller calls a sentence family's: (examples, label names)."""
    examples = read_toy_file(path)
    if require_labels and any(e.label is None for e in examples):
        raise ValueError(f"{path}: every row needs a label")
    return examples, list(label_list or LABELS)


def add_toy_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--train-file", required=True)
    p.add_argument("--dev-file", required=True)
    p.add_argument("--note", default="", help="written to OUT/note.txt after training")


def toy_from_args(args: argparse.Namespace) -> FinetuneTask:
    def metrics(split, predictions, labels):
        return {"accuracy": float(np.mean(np.asarray(predictions) == np.asarray(labels)))}

    return classification_task("toy", args.model, read_toy_file(args.train_file), {"dev": read_toy_file(args.dev_file)},
                               LABELS, metrics_fn=metrics, main_metric="accuracy", max_seq_length=args.max_seq_length,
                               eval_batch_size=args.eval_batch_size)


def toy_after(args: argparse.Namespace) -> None:
    (Path(args.output_dir) / "note.txt").write_text(args.note)
    print(f"note: {args.note}")


def add_toy_predict_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shout", action="store_true", help="toy: labels in capitals")


def predict_toy(args: argparse.Namespace) -> None:
    examples = read_toy_file(args.input)
    tokenizer = BertTokenizer.from_pretrained(args.model)
    model = load_for_inference(BertForSequenceClassification, args.model, args.dtype, task="toy")
    features = convert_examples_to_features(examples, tokenizer, None, args.max_seq_length or 32)
    predicted = predict_examples(model, features, args.batch_size, tokenizer.pad_token_id).argmax(-1)
    labels = [LABELS[p].upper() if args.shout else LABELS[p] for p in predicted]
    Path(args.output).write_text("".join(f"{i}\t{label}\n" for i, label in enumerate(labels)))
    print(f"wrote {args.output}")


TOY = TaskFamily(
    name="toy", aliases=("toy-task",), head=BertForSequenceClassification,
    architectures=("BertForSequenceClassification",), reader=read_toy_rows,
    finetune=(FinetuneCommand("toy", "a toy classification task", add_toy_flags, toy_from_args,
                              dict(lr=1e-3, batch_size=4, max_seq_length=32, epochs=2.0), after=toy_after),),
    predict=PredictCommand(predict_toy, add_toy_predict_flags),
    pipeline="classify",  # served by the classifier's pipeline (serving binds the name)
    finetuning_tasks=("toy",), problem_types=("toy_classification",),
    # distilled by the general distiller through the sentence families' adaptor (it reads with `reader`)
    distill=Distillation("bertforge.distillation.classify:ClassifyAdaptor", ("classifier.weight", "classifier.bias"),
                         dict(lr=1e-3, batch_size=4, max_seq_length=32, epochs=2.0)),
)


@pytest.fixture
def toy_family():
    register_family(TOY)
    yield TOY
    unregister_family("toy")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, save_tiny_checkpoint):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_toy"), WORDS, preset="tiny", max_position_embeddings=64)


def _write(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{label}\t{text}\n" for label, text in rows))
    return path


ROWS = [("yes", "good movie"), ("no", "bad film"), ("yes", "great film"), ("no", "awful movie"),
        ("yes", "the movie was good"), ("no", "the film was bad"), ("yes", "a great movie"), ("no", "an awful film")]


# ---------------------------------------------------------------------------- tests

def test_a_registered_family_adds_a_finetune_command_and_a_predictor(toy_family, tiny_dir, tmp_path, capsys):
    train = _write(tmp_path / "train.tsv", ROWS)
    out = tmp_path / "out"
    assert main(["finetune", "toy", "--train-file", str(train), "--dev-file", str(train), "--model", str(tiny_dir),
                 "--output-dir", str(out), "--note", "hello", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "toy: best at epoch" in printed and "note: hello" in printed  # the shared report, then `after`
    assert (out / "note.txt").read_text() == "hello"
    config = json.loads((out / "config.json").read_text())
    assert config["finetuning_task"] == "toy" and config["architectures"] == ["BertForSequenceClassification"]
    results = json.loads((out / "eval_results.json").read_text())
    assert results["task"] == "toy" and results["epoch"] <= 2  # the recipe's 2 epochs, no --epochs given
    # The checkpoint resolves to the toy family (finetuning_task beats the head, which is classify's) ...
    assert family_for_checkpoint(out) is TOY
    assert pipeline_for_checkpoint(out) == "classify" and resolve_task("toy-task") == "classify"
    # ... so `predict` runs the toy predictor, with its own flag.
    unlabelled = _write(tmp_path / "test.tsv", [("", "good movie"), ("", "bad film")])
    assert main(["predict", "--model", str(out), "--input", str(unlabelled), "--output", str(tmp_path / "p.tsv"),
                 "--shout"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'p.tsv'}"
    lines = (tmp_path / "p.tsv").read_text().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["0", "1"]
    assert all(line.split("\t")[1] in ("YES", "NO") for line in lines)
    # predict's shared checks come first: an --output that exists is refused without --overwrite.
    assert main(["predict", "--model", str(out), "--input", str(unlabelled), "--output", str(tmp_path / "p.tsv")]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_a_registered_family_is_served_and_distilled(toy_family, tiny_dir, tmp_path):
    """The same one-module family gets the server's route (`POST /v1/<any of its names>`, by its pipeline) and
    `bertforge distill` (its `Distillation`'s adaptor, its reader, its recipe)."""
    from starlette.testclient import TestClient  # optional extra

    from bertforge.serving.server import create_app, load_pipelines
    train = _write(tmp_path / "train.tsv", ROWS)
    teacher = tmp_path / "teacher"
    assert main(["finetune", "toy", "--train-file", str(train), "--dev-file", str(train), "--model", str(tiny_dir),
                 "--output-dir", str(teacher), "--no-progress"]) == 0
    with TestClient(create_app(load_pipelines(str(teacher)))) as client:
        answer = client.post("/v1/toy-task", json={"texts": ["good movie", "bad film"]})
        assert answer.status_code == 200 and answer.json()["pipeline"] == "classify"
        assert [r["label"] for r in answer.json()["results"]] == [r["label"] for r in
                                                                   pipeline("toy", model=teacher)(["good movie", "bad film"])]
    student = tmp_path / "student"
    assert main(["distill", "--teacher", str(teacher), "--train-file", str(train), "--dev-file", str(train),
                 "--output-dir", str(student), "--layers", "1", "--no-progress"]) == 0
    info = json.loads((student / "distillation.json").read_text())
    assert info["family"] == "toy" and family_for_checkpoint(student) is TOY


def test_the_recipe_is_the_shared_flags_defaults(toy_family):
    from bertforge.cli import build_parser
    from bertforge.cli.finetune import _arguments

    args = build_parser().parse_args(["finetune", "toy", "--train-file", "t", "--dev-file", "d", "--model", "m",
                                      "--output-dir", "o"])
    assert (args.lr, args.batch_size, args.max_seq_length, _arguments(args).epochs) == (1e-3, 4, 32, 2.0)
    args = build_parser().parse_args(["finetune", "toy", "--train-file", "t", "--dev-file", "d", "--model", "m",
                                      "--output-dir", "o", "--epochs", "5", "--lr", "3e-5"])
    assert (args.lr, _arguments(args).epochs) == (3e-5, 5.0)


def test_problem_type_resolves_when_finetuning_task_does_not(toy_family, tiny_dirs_like, tmp_path):
    directory = tiny_dirs_like(tmp_path / "typed", problem_type="toy_classification")
    assert family_for_checkpoint(directory) is TOY
    directory = tiny_dirs_like(tmp_path / "plain")
    assert family_for_checkpoint(directory).name == "classify"  # the head's first family


@pytest.fixture
def tiny_dirs_like(tiny_dir):
    """A config.json-only copy of the tiny checkpoint as a sequence classifier, with `changes` applied."""
    def make(directory: Path, **changes) -> Path:
        directory.mkdir()
        config = json.loads((tiny_dir / "config.json").read_text())
        config.update(architectures=["BertForSequenceClassification"], **changes)
        (directory / "config.json").write_text(json.dumps(config))
        return directory
    return make


def test_a_name_means_one_family(toy_family):
    clash = TaskFamily(name="other", aliases=("ner",), head=BertForSequenceClassification,
                       architectures=("BertForSequenceClassification",))
    with pytest.raises(ValueError, match="'ner' of 'other' already names 'tag'"):
        register_family(clash)
    command = FinetuneCommand("glue", "again", add_toy_flags, toy_from_args)
    with pytest.raises(ValueError, match="`bertforge finetune glue` is taken already"):
        register_family(TaskFamily(name="other", aliases=(), head=BertForSequenceClassification,
                                   architectures=(), finetune=(command,)))
    with pytest.raises(ValueError, match="registered already"):
        register_family(TOY)
    with pytest.raises(ValueError, match="built-in"):
        unregister_family("classify")


def test_an_unregistered_family_is_gone(capsys):
    register_family(TOY)
    unregister_family("toy")
    with pytest.raises(ValueError, match="unknown task 'toy'"):
        resolve("toy")
    with pytest.raises(SystemExit):
        main(["finetune", "toy", "--train-file", "t", "--dev-file", "d", "--model", "m", "--output-dir", "o"])
    assert "invalid choice: 'toy'" in capsys.readouterr().err


def test_a_recipe_that_depends_on_the_flags_is_resolved_per_run_and_never_written_into_them():
    """NER's recipe depends on the approach, SQuAD's on --version: `FinetuneCommand.recipe_of` resolves it
    and `_arguments` fills the flags left None from it, while the parsed flags stay as given."""
    from bertforge.cli import build_parser
    from bertforge.cli.finetune import _arguments

    parser = build_parser()
    for flags, lr, batch_size, epochs in ((["ner"], 5e-5, 16, 3.0), (["ner", "--feature-based"], 1e-3, 16, 4.0),
                                          (["squad"], 5e-5, 32, 3.0), (["squad", "--version", "2.0"], 5e-5, 48, 2.0)):
        args = parser.parse_args(["finetune", *flags, "--train-file", "t", "--dev-file", "d", "--model", "m",
                                  "--output-dir", "o"])
        before = dict(vars(args))
        recipe = args.finetune_command.recipe_of(args)
        settings = _arguments(args, recipe)
        assert (settings.lr, settings.batch_size, settings.epochs) == (lr, batch_size, epochs), flags
        assert vars(args) == before
    args = parser.parse_args(["finetune", "ner", "--train-file", "t", "--dev-file", "d", "--model", "m",
                              "--output-dir", "o", "--lr", "2e-5", "--epochs", "1"])
    settings = _arguments(args, args.finetune_command.recipe_of(args))
    assert (settings.lr, settings.epochs) == (2e-5, 1.0)  # given flags win over the recipe
