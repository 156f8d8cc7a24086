"""The task registry: every task family bertforge knows, declared once.

In the spirit of google-research/bert's `processors` dict (run_classifier.py): each family names its
canonical name and aliases, the head it fine-tunes (`head`), how its data is read (`reader`), turned
into model inputs (`features`) and scored (`metrics`), how a fine-tuned model predicts for a file
(`predictor`, what `bertforge predict` runs), the `FinetuneTask` builder(s) of `bertforge finetune`,
and the name of its serving pipeline (`pipeline("...")`, `POST /v1/<name>`, `bertforge export-onnx
--task`). The CLI, the server, `pipeline()` and ONNX export read this table; `task_for_checkpoint`
is the one resolver from a checkpoint to its family.

Canonical names. One name per concept, and it is the name of what the model *does*, not of a
data set or of one use of a head: `classify`, `multiple-choice`, `answer`, `tag`, `embed`,
`fill-mask`. These are the names the pipelines, the server's URLs and exported ONNX files already
carry (ONNX metadata stores it, and a file is refused for another task), so choosing them keeps every
stored artefact valid. The other names in use stay aliases forever: the CLI's commands (`ner`,
`squad`, `extract-features`), the `finetuning_task` values that fine-tuned checkpoints carry in
config.json (`ner`, `squad`, `squad_v2`, a GLUE task name, `multiple-choice`), the module names
(`tagging`, `choice`, `features`) and the Hugging Face task names (`token-classification`,
`question-answering`, `feature-extraction`, `text-classification`, `multiple-choice`). `tag` rather
than `ner` because the head labels tokens with any tag set (NER, chunking, POS); `answer` rather
than `squad` because SQuAD is one data set of extractive question answering.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

from .._files import check_finished, read_text
from ..metrics.glue import accuracy
from ..metrics.squad import squad_metrics
from ..modeling import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from ..modeling.pretrained import resolve_model_dir
from . import choice, classification, conll, feature_based, features, glue, squad, tagging


@dataclass(frozen=True)
class TaskFamily:
    """One task family: everything the CLI, the server and `pipeline()` need to know about it.

    name: the canonical name (also its pipeline's and its server route's).
    aliases: other names accepted anywhere a task is named (CLI commands, `finetuning_task` values
        written by older runs, Hugging Face task names, module names).
    head: the model class fine-tuned and served; `architectures`: the config.json `architectures`
        entries that mean this family (the head's own name first).
    module: the `bertforge.tasks` module that implements the family.
    reader / features / metrics / predictor: data file -> examples; examples -> model inputs;
        (predictions, gold) -> scores; fine-tuned model + file -> predictions file (`bertforge predict`).
    finetune: CLI command -> the function that builds its `FinetuneTask` (`bertforge finetune <command>`).
    finetuning_tasks: the `finetuning_task` values a fine-tuned checkpoint of this family carries.
    """

    name: str
    aliases: tuple[str, ...]
    head: type[nn.Module]
    architectures: tuple[str, ...]
    module: str
    reader: Callable[..., Any] | None = None
    features: Callable[..., Any] | None = None
    metrics: Callable[..., Any] | None = None
    predictor: Callable[..., Any] | None = None
    finetune: dict[str, Callable[..., Any]] = field(default_factory=dict)
    finetuning_tasks: tuple[str, ...] = ()

    @property
    def pipeline(self) -> str:
        """The name of the serving pipeline of this family (`pipeline(name)`, `POST /v1/<name>`)."""
        return self.name

    @property
    def names(self) -> tuple[str, ...]:
        """Every name that resolves to this family, the canonical one first."""
        return (self.name, *self.aliases, *self.finetuning_tasks)


FAMILIES: tuple[TaskFamily, ...] = (
    TaskFamily(
        name="classify", aliases=("classification", "text-classification", "sequence-classification", "glue"),
        head=BertForSequenceClassification, architectures=("BertForSequenceClassification",),
        module="bertforge.tasks.classification", reader=classification.read_classify_file,
        features=classification.convert_examples_to_features, metrics=classification.classify_metrics,
        predictor=classification.predict_file,
        finetune={"classify": classification.classify_task, "glue": glue.glue_task},
        # GLUE task names (and their aliases) are added below: a GLUE model records its task's name.
        finetuning_tasks=(),
    ),
    TaskFamily(
        name="multiple-choice", aliases=("multiple_choice", "choice", "swag"),
        head=BertForMultipleChoice, architectures=("BertForMultipleChoice",),
        module="bertforge.tasks.choice", reader=choice.read_swag_file,
        features=choice.convert_examples_to_features, metrics=accuracy, predictor=choice.predict_choice_file,
        finetune={"multiple-choice": choice.multiple_choice_task}, finetuning_tasks=(choice.TASK_NAME,),
    ),
    TaskFamily(
        name="answer", aliases=("question-answering", "qa", "squad"),
        head=BertForQuestionAnswering, architectures=("BertForQuestionAnswering",),
        module="bertforge.tasks.squad", reader=squad.read_squad_file,
        features=squad.convert_examples_to_features, metrics=squad_metrics, predictor=squad.predict_squad_file,
        finetune={"squad": squad.squad_task}, finetuning_tasks=("squad", "squad_v2"),
    ),
    TaskFamily(
        name="tag", aliases=("ner", "token-classification", "tagging"),
        head=BertForTokenClassification, architectures=("BertForTokenClassification", "BiLSTMTagger"),
        module="bertforge.tasks.tagging", reader=conll.read_conll, features=conll.build_windows,
        metrics=conll.ner_metrics, predictor=tagging.predict_conll,
        finetune={"ner": tagging.ner_task, "ner --feature-based": feature_based.feature_ner_task},
        finetuning_tasks=("ner",),
    ),
    TaskFamily(
        name="embed", aliases=("feature-extraction", "embedding", "extract-features", "features"),
        head=BertModel, architectures=("BertModel",),
        module="bertforge.tasks.features", reader=features.read_examples, features=features.layer_features,
        predictor=features.extract_features,
    ),
    TaskFamily(
        name="fill-mask", aliases=("fill_mask", "mlm"),
        head=BertForMaskedLM, architectures=("BertForMaskedLM", "BertForPreTraining"),
        module="bertforge.modeling.heads",
    ),
)

TASKS: dict[str, TaskFamily] = {family.name: family for family in FAMILIES}

# Every accepted name -> canonical name. GLUE task names (and the metric aliases such as "mnli-m")
# are classify: a GLUE model's config.json records its GLUE task as `finetuning_task`.
ALIASES: dict[str, str] = {}
for _family in FAMILIES:
    for _name in _family.names:
        ALIASES[_name] = _family.name
for _name in glue.GLUE_TASKS:
    ALIASES.setdefault(_name, "classify")
del _family, _name

_ARCHITECTURES: dict[str, str] = {a: family.name for family in FAMILIES for a in family.architectures}


def resolve(name: str) -> TaskFamily:
    """The family of a task name: canonical, alias, a `finetuning_task` value or a GLUE task name
    (case and `_`/`-` spelling of GLUE names accepted, as `bertforge.metrics.glue.normalize_task`).
    ValueError listing the canonical names for an unknown one."""
    key = ALIASES.get(name) or ALIASES.get(str(name).lower()) or _glue_name(name)
    if key is None:
        raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)} "
                         f"(aliases: {', '.join(sorted(a for a in ALIASES if a not in TASKS))})")
    return TASKS[key]


def _glue_name(name: Any) -> str | None:
    try:
        glue.get_task(str(name))
    except (KeyError, ValueError):
        return None
    return "classify"


def checkpoint_config(directory: str | os.PathLike) -> dict[str, Any]:
    """config.json of a checkpoint directory (or a Hub id's cached snapshot), as a dict.
    FileNotFoundError when there is none; a run that did not finish is refused (`check_finished`)."""
    path = resolve_model_dir(directory)
    check_finished(path)
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"no config.json in {directory}")
    return json.loads(read_text(config))


def family_for_checkpoint(directory: str | os.PathLike, default: str | None = "embed") -> TaskFamily | None:
    """The family a checkpoint was trained for: its head (config.json `architectures`, the weights
    it holds decide what it can run), else the `finetuning_task` that `bertforge finetune` wrote,
    else `default` (a bare encoder embeds; None: return None)."""
    config = checkpoint_config(directory)
    for architecture in config.get("architectures") or []:
        if architecture in _ARCHITECTURES:
            return TASKS[_ARCHITECTURES[architecture]]
    task = config.get("finetuning_task")
    if task:
        try:
            return resolve(task)
        except ValueError:
            pass
    return None if default is None else TASKS[default]


def task_for_checkpoint(directory: str | os.PathLike) -> str:
    """The canonical task (= pipeline) name of a checkpoint: see `family_for_checkpoint` (default: embed)."""
    return family_for_checkpoint(directory).name


__all__ = ["ALIASES", "FAMILIES", "TASKS", "TaskFamily", "checkpoint_config", "family_for_checkpoint", "resolve",
           "task_for_checkpoint"]
