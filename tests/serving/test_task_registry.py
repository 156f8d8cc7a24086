"""The task registry: one canonical name per task family, every name in use today as an alias, the
commands and pipelines it drives, and the one resolver from a checkpoint to its family
(`finetuning_task` first, then `problem_type`, then the head)."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest
from torch import nn

from bertforge.cli import build_parser
from bertforge.serving import PIPELINES, pipeline
from bertforge.serving.pipelines import resolve_task
from bertforge.serving.registry import family_pipeline
from bertforge.serving.pipelines import task_for_checkpoint as serving_task_for_checkpoint
from bertforge.tasks import registry
from bertforge.tasks.registry import (FAMILIES, TASKS, family_for_checkpoint, finetune_commands,
                                      pipeline_for_checkpoint, resolve, task_for_checkpoint)

# Names users and files carry today (CLI commands, pipeline names, finetuning_task values, Hugging
# Face task names) -> the canonical family.
TODAY = {
    "classify": "classify", "text-classification": "classify", "sequence-classification": "classify",
    "glue": "classify", "sst2": "classify", "SST-2": "classify", "mnli-m": "classify", "stsb": "classify",
    "multiple-choice": "multiple-choice", "swag": "multiple-choice", "choice": "multiple-choice",
    "answer": "answer", "squad": "answer", "squad_v2": "answer", "question-answering": "answer", "qa": "answer",
    "tag": "tag", "ner": "tag", "token-classification": "tag", "tagging": "tag",
    "embed": "embed", "extract-features": "embed", "feature-extraction": "embed", "embedding": "embed",
    "fill-mask": "fill-mask", "fill_mask": "fill-mask", "mlm": "fill-mask",
    "multi-label": "multi-label", "multi_label_classification": "multi-label",
    "sentence-embedding": "sentence-embedding", "sentence-similarity": "sentence-embedding",
}
PIPELINE = {"multi-label": "classify", "sentence-embedding": "embed"}  # a family served by another family's pipeline


@pytest.mark.parametrize("name, family", sorted(TODAY.items()))
def test_every_name_in_use_resolves_to_its_family(name, family):
    assert resolve(name).name == family
    assert resolve_task(name) == PIPELINE.get(family, family)  # pipeline(), the server's routes, export-onnx


def test_an_unknown_name_lists_the_canonical_ones():
    with pytest.raises(ValueError, match="classify, multi-label, multiple-choice, answer, tag, embed, fill-mask"):
        resolve("summarize")
    with pytest.raises(ValueError, match="unknown pipeline"):
        resolve_task("summarize")


def test_each_family_is_declared_once_and_complete():
    assert [f.name for f in FAMILIES] == list(TASKS)
    seen: dict[str, str] = {}
    for family in FAMILIES:
        for name in family.names:
            assert seen.setdefault(name, family.name) == family.name, f"{name} names two families"
        assert issubclass(family.head, nn.Module)
        # A family that shares its head with another (multi-label: classify's) resolves by its names only.
        assert not family.architectures or family.architectures[0] == family.head.__name__
        # The pipeline loads the family's head, or the class it extends (sentence-embedding's SentenceEncoder is
        # a BertModel with its pooling: the embed pipeline reads that from the model directory).
        assert family.pipeline in PIPELINES and issubclass(family.head, PIPELINES[family.pipeline].model_class)
        if family.pipeline_class:  # the family whose pipeline it is: the class and its module are named after it
            assert family_pipeline(family) is PIPELINES[family.pipeline]
            assert family_pipeline(family).task == family.pipeline == family.name
            assert family_pipeline(family).__module__ == f"bertforge.serving.pipelines.{family.name.replace('-', '_')}"


def sub_commands(parser: argparse.ArgumentParser, *path: str) -> list[str]:
    """The sub-command names under `bertforge PATH...`, in --help's order."""
    for name in (*path, None):
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        if name is None:
            return list(action.choices)
        parser = action.choices[name]
    raise AssertionError("unreachable")


def test_the_cli_is_built_from_the_registry():
    """`finetune`'s sub-commands are the families' commands, in the registry's order, each with its recipe's
    defaults; `predict` runs each fine-tuned family's own predictor."""
    parser = build_parser()
    assert sub_commands(parser, "finetune") == [c.name for c in finetune_commands()] == [
        "glue", "classify", "multi-label", "multiple-choice", "squad", "ner", "sentence-embedding"]
    own = {"glue": ["--task", "mrpc", "--data-dir", "g"]}
    for command in finetune_commands():
        args = parser.parse_args(["finetune", command.name, "--model", "m", "--output-dir", "o",
                                  *own.get(command.name, ["--train-file", "t", "--dev-file", "d"])])
        assert args.finetune_command is command
        assert (args.lr, args.batch_size, args.max_seq_length, args.recipe_epochs) == tuple(
            command.recipe[k] for k in ("lr", "batch_size", "max_seq_length", "epochs"))
    predictors = {name: TASKS[name].predict.run for name in ("classify", "multi-label", "multiple-choice", "answer",
                                                             "tag", "sentence-embedding")}
    assert len(set(predictors.values())) == 6  # one each, from the family's own module
    for name, run in predictors.items():  # one name per family: its module is named after it
        assert run.__module__ == f"bertforge.tasks.{name.replace('-', '_')}"


def test_checkpoint_to_task_for_each_head(tiny_dirs):
    expected = {"fill-mask": "fill-mask", "classify": "classify", "regression": "classify", "tag": "tag",
                "answer": "answer", "answer-v2": "answer", "embed": "embed", "multiple-choice": "multiple-choice"}
    for key, task in expected.items():
        assert task_for_checkpoint(tiny_dirs[key]) == task, key
        assert family_for_checkpoint(tiny_dirs[key]) is TASKS[task]
        assert pipeline_for_checkpoint(tiny_dirs[key]) == TASKS[task].pipeline
    # One resolver: serving's name is the registry's function.
    assert serving_task_for_checkpoint is registry.task_for_checkpoint


def _rewrite_config(source, target, **changes):
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_finetuning_task_first_then_problem_type_then_head(tiny_dirs, tmp_path):
    no_head = _rewrite_config(tiny_dirs["tag"], tmp_path / "ner", architectures=None, finetuning_task="ner")
    assert task_for_checkpoint(no_head) == "tag"
    glue = _rewrite_config(tiny_dirs["classify"], tmp_path / "sst2", architectures=["Unknown"], finetuning_task="sst2")
    assert task_for_checkpoint(glue) == "classify"
    bare = _rewrite_config(tiny_dirs["embed"], tmp_path / "bare", architectures=None)
    assert task_for_checkpoint(bare) == "embed"
    assert family_for_checkpoint(bare, default=None) is None
    # finetuning_task beats the head: it tells apart families that share one (classify and multi-label
    # on BertForSequenceClassification); an unknown one is passed over.
    mixed = _rewrite_config(tiny_dirs["answer"], tmp_path / "mixed", finetuning_task="ner")
    assert task_for_checkpoint(mixed) == "tag"
    unknown = _rewrite_config(tiny_dirs["answer"], tmp_path / "unknown", finetuning_task="my-own-task")
    assert task_for_checkpoint(unknown) == "answer"
    assert type(pipeline(model=unknown)).__name__ == "AnswerPipeline"
    # problem_type (as transformers writes it) before the head, after finetuning_task.
    typed = _rewrite_config(tiny_dirs["tag"], tmp_path / "typed", problem_type="regression", finetuning_task=None)
    assert task_for_checkpoint(typed) == "classify"
    both = _rewrite_config(tiny_dirs["tag"], tmp_path / "both", problem_type="regression", finetuning_task="ner")
    assert task_for_checkpoint(both) == "tag"
    # Multi-label shares classify's head: bertforge's checkpoints say so by finetuning_task, transformers'
    # by problem_type; both serve through the classify pipeline.
    for name, changes in (("ours", {"finetuning_task": "multi-label"}),
                          ("peer", {"finetuning_task": None, "problem_type": "multi_label_classification"})):
        multi = _rewrite_config(tiny_dirs["classify"], tmp_path / f"multi-{name}", **changes)
        assert task_for_checkpoint(multi) == "multi-label"
        assert pipeline_for_checkpoint(multi) == "classify"


def test_a_checkpoint_without_config_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        task_for_checkpoint(tmp_path)


def test_the_old_module_names_are_the_same_modules():
    """Modules follow the canonical family names; the old names stay importable as the same module objects
    (so `from bertforge.tasks.squad import squad_task` and a monkeypatch on either name still work)."""
    import importlib

    for old, new in (("bertforge.tasks.squad", "bertforge.tasks.answer"),
                     ("bertforge.tasks.tagging", "bertforge.tasks.tag"),
                     ("bertforge.tasks.classification", "bertforge.tasks.classify"),
                     ("bertforge.tasks.choice", "bertforge.tasks.multiple_choice"),
                     ("bertforge.serving.pipelines.choice", "bertforge.serving.pipelines.multiple_choice")):
        assert importlib.import_module(old) is importlib.import_module(new), old
