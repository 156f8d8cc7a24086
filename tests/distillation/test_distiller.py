"""The general distiller and the families' adaptors: every distilled family is one registry entry whose
`Distillation` names its adaptor; the distiller knows no family by name."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from bertforge.distillation import Adaptor, adaptor_for, distill_task
from bertforge.distillation import distiller as distiller_module
from bertforge.distillation.run import distilled_families
from bertforge.modeling import BertConfig, BertModel
from bertforge.tasks.registry import TASKS

from .test_distill import encoder, make_teacher, sentences, write_classify  # noqa: F401 (encoder: a fixture)

TINY = BertConfig(vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=8)


def test_each_distilled_family_names_its_adaptor_in_a_module_named_after_it():
    assert distilled_families() == ["classify", "multi-label", "answer", "tag", "sentence-embedding"]
    assert distilled_families("intermediate") == ["classify", "answer", "tag"]
    assert distilled_families("student_vocab") == ["classify"]
    assert distilled_families("augment") == ["classify", "multi-label", "tag"]
    for name in distilled_families():
        family = TASKS[name]
        adaptor = adaptor_for(family)
        assert issubclass(adaptor, Adaptor) and not inspect.isabstract(adaptor), name
        assert adaptor.__module__ == f"bertforge.distillation.{name.replace('-', '_')}"
        recipe = family.distill.recipe_of(TINY)  # stated once: a dict, or SQuAD's function of the teacher
        # a head with tensors of its own names them (sentence-embedding's is the encoder: its pooling is config)
        assert (family.distill.head_tensors or issubclass(family.head, BertModel)) and recipe.keys() >= {"lr", "batch_size", "max_seq_length", "epochs"}


def test_the_general_distiller_names_no_family():
    """distiller.py reads the family only through the run and the adaptor: no family name, no family module."""
    source = Path(distiller_module.__file__).read_text()
    tree = ast.parse(source)
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert not strings & set(TASKS)
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not imported & {"classify", "multi_label", "tag", "answer"}


def test_an_option_of_another_family_is_refused(encoder, tmp_path):  # noqa: F811 (the fixture)
    teacher = make_teacher(encoder, tmp_path / "teacher")
    train = write_classify(tmp_path / "train.csv", sentences(8, 1))
    with pytest.raises(ValueError, match="version: not an option of the classify family's distillation"):
        distill_task(teacher, train, output_dir=tmp_path / "out", version="2.0")
