"""The task registry: every task family bertforge knows, declared once.

In the spirit of google-research/bert's `processors` dict that its `main` reads (run_classifier.py):
each family (`TaskFamily`, one object) names its canonical name and aliases, the head it fine-tunes,
distils and serves (`head`), how its data is read (`reader`), its `bertforge finetune` sub-commands
(`FinetuneCommand`: own flags, the `FinetuneTask` built from them, the recipe, what runs after
training), what `bertforge predict` runs for its models (`PredictCommand`), its serving pipeline (its
name: `pipeline("...")`, `POST /v1/<name>`, `bertforge export-onnx --task`; its class by import path)
and how `bertforge distill` takes its teachers (`Distillation`: the adaptor the general distiller runs,
the recipe, what it supports). Every command, the server, `pipeline()`, ONNX export and the distiller
read this list (`TASKS`, which `register_family` extends at run time); no other table keyed by a
family's name exists. `family_for_checkpoint` is the one resolver from a checkpoint to its family.
Adding a task is the family's module and one entry (ARCHITECTURE.md, "Where to add things").

Canonical names. One name per concept, and it is the name of what the model *does*, not of a
data set or of one use of a head: `classify`, `multiple-choice`, `answer`, `tag`, `embed`,
`fill-mask`. These are the names the pipelines, the server's URLs and exported ONNX files already
carry (ONNX metadata stores it, and a file is refused for another task), so choosing them keeps every
stored artefact valid. The other names in use stay aliases forever: the CLI's commands (`ner`,
`squad`, `extract-features`), the `finetuning_task` values that fine-tuned checkpoints carry in
config.json (`ner`, `squad`, `squad_v2`, a GLUE task name, `multiple-choice`), the module names
(`tagging`, `choice`, and `features`, the embed module's old name) and the Hugging Face task names
(`token-classification`, `question-answering`, `feature-extraction`, `text-classification`,
`multiple-choice`). `tag` rather
than `ner` because the head labels tokens with any tag set (NER, chunking, POS); `answer` rather
than `squad` because SQuAD is one data set of extractive question answering.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import nn

from .._files import check_finished, read_text
from ..modeling import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from ..modeling.pretrained import resolve_model_dir
from ..training.finetune import FinetuneTask
from . import (answer, classify, classify_reader, conll, embed, glue, glue_data, multi_label, multi_label_reader,
               multiple_choice, sentence_embedding, squad_data, tag)


@dataclass(frozen=True)
class FinetuneCommand:
    """One `bertforge finetune <name>` sub-command (google-research/bert's `processors` entry, with its flags).

    name / help: the sub-command and its --help line.
    add_flags(parser): the command's OWN flags (data files, options); the flags every task shares
        (--model, --output-dir, --lr, --lr-grid, --seeds, --epochs, ...) are the CLI's.
    task(args): the `FinetuneTask` from the parsed flags; it never writes into them.
    recipe: the defaults of shared flags: `lr`, `batch_size`, `max_seq_length`, `epochs` (None: `recipe_for`
        decides).
    recipe_for(args): the recipe for these flags when it depends on them (SQuAD's on --version, NER's on the
        approach); its values fill `recipe`'s (`recipe_of`: resolved once, by the CLI, per run).
    check(args): judges the flags together before any model is fetched or loads (optional).
    after(args): runs once training is done, e.g. a test file predicted with the best model in OUT (optional).
    """

    name: str
    help: str
    add_flags: Callable[[argparse.ArgumentParser], None]
    task: Callable[[argparse.Namespace], FinetuneTask]
    recipe: dict[str, Any] = field(default_factory=dict)
    check: Callable[[argparse.Namespace], None] | None = None
    after: Callable[[argparse.Namespace], None] | None = None
    recipe_for: Callable[[argparse.Namespace], dict[str, Any]] | None = None

    def recipe_of(self, args: argparse.Namespace) -> dict[str, Any]:
        """The recipe of one run: `recipe`, with `recipe_for(args)`'s values."""
        return {**self.recipe, **(self.recipe_for(args) if self.recipe_for is not None else {})}


@dataclass(frozen=True)
class PredictCommand:
    """What `bertforge predict` runs for a family's model.

    run(args): reads --input, writes --output, prints "wrote PATH" (and any score on a labelled input).
    add_flags(parser): its own flags beyond the ones every family shares (--model --input --output --task
        --max-seq-length --batch-size --overwrite --dtype); a flag several families define is added once.
    own_files: run() checks --input/--output itself (otherwise `predict` requires both, and refuses an
        --output that would overwrite, before run() is called).
    selected_by: flags (their `dest`) whose presence asks for this family whatever the model says
        (`--question` asks the answer family).
    """

    run: Callable[[argparse.Namespace], None]
    add_flags: Callable[[argparse.ArgumentParser], None] | None = None
    own_files: bool = False
    selected_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class Distillation:
    """How `bertforge distill` takes a family's teachers. The work is the general distiller's
    (`bertforge.distillation.distiller`); the family enters only as its adaptor, named here by import path
    ("module:Class") and resolved by the distillation layer (tasks never import it).

    adaptor: the family's `Adaptor` (what the teacher's outputs are, how they are cached, the soft-target
        loss, the collate of the teacher's targets, the agreement metric, the after-step).
    head_tensors: tensor names (as the head class saves them) a fine-tuned teacher holds; their absence
        means the head was never trained.
    recipe: the defaults of the shared flags (lr, batch_size, max_seq_length, epochs), or a function of the
        teacher's config and the family's `options` when they depend on it (SQuAD's on its version).
    options: the family's own `distill` flags (their `dest`, e.g. the answer family's version and
        doc_stride); refused for a teacher of another family.
    intermediate: takes TinyBERT's intermediate-layer terms (--intermediate).
    student_vocab: a student with its own vocabulary (--student-vocab: sentence-level outputs only; a
        per-token or span output would need an alignment of the two tokenizations).
    augment: its transfer set takes augmented copies of the training text (--augment).
    head_proves_training: a checkpoint whose config.json records no training (no finetuning_task, no
        problem_type) is a teacher when its `head_tensors` are in its weights: transformers saves a
        fine-tuned token-classification or question-answering model so, while its sequence classifier
        records a problem_type on its first labelled step (one without is a head never trained).
    keep_last_layer: a `--layers N` student keeps the teacher's last layer (the first and the last, the
        rest evenly between: `distillation.student.student_layers`), for a family whose output is the last
        layer's space itself (a bi-encoder's embedding); else DistilBERT's one layer out of two from the first.
    """

    adaptor: str
    head_tensors: tuple[str, ...]
    recipe: dict[str, Any] | Callable[[BertConfig, dict[str, Any]], dict[str, Any]]
    options: tuple[str, ...] = ()
    intermediate: bool = False
    student_vocab: bool = False
    augment: bool = False
    head_proves_training: bool = False
    keep_last_layer: bool = False

    def recipe_of(self, config: BertConfig, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """The shared flags' defaults for the teacher whose config this is (resolved once per run)."""
        return self.recipe(config, options or {}) if callable(self.recipe) else dict(self.recipe)


@dataclass(frozen=True)
class TaskFamily:
    """One task family: everything the CLI, the server and `pipeline()` need to know about it.

    name: the canonical name.
    aliases: other names accepted anywhere a task is named (CLI commands, `finetuning_task` values
        written by older runs, Hugging Face task names, module names).
    head: the model class fine-tuned, distilled (the teacher's and the student's) and served;
        `architectures`: the config.json `architectures` entries that mean this family (the head's own
        name first).
    reader: data file -> examples (what `distill` reads a teacher's training data with).
    finetune: its `bertforge finetune <name>` sub-commands; predict: what `bertforge predict` runs.
    pipeline: the name of the pipeline that serves it (`pipeline(name)`, `POST /v1/<name>`, `export-onnx
        --task`; default: the family's name; multi-label is served by "classify").
    pipeline_class: that pipeline's class as an import path ("module:Class"), for the family whose pipeline
        it is: `bertforge.serving.registry` imports it (the tasks layer never imports serving).
    finetuning_tasks: the `finetuning_task` values a fine-tuned checkpoint of this family carries.
    problem_types: the config.json `problem_type` values that mean this family.
    distill: how `bertforge distill` takes its teachers (`Distillation`; None: not distilled yet).
    """

    name: str
    aliases: tuple[str, ...]
    head: type[nn.Module]
    architectures: tuple[str, ...]
    reader: Callable[..., Any] | None = None
    finetune: tuple[FinetuneCommand, ...] = ()
    predict: PredictCommand | None = None
    pipeline: str = ""
    pipeline_class: str = ""
    finetuning_tasks: tuple[str, ...] = ()
    problem_types: tuple[str, ...] = ()
    distill: Distillation | None = None

    def __post_init__(self) -> None:
        if not self.pipeline:
            object.__setattr__(self, "pipeline", self.name)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name that resolves to this family, the canonical one first."""
        return (self.name, *self.aliases, *self.finetuning_tasks)


_CLASSIFIER = ("classifier.weight", "classifier.bias")  # the head tensors of a trained classify or tag head

FAMILIES: tuple[TaskFamily, ...] = (
    TaskFamily(
        name="classify", aliases=("classification", "text-classification", "sequence-classification", "glue"),
        head=BertForSequenceClassification, architectures=("BertForSequenceClassification",),
        reader=classify_reader.read_classify_file,
        pipeline_class="bertforge.serving.pipelines.classify:ClassifyPipeline",
        finetune=(
            FinetuneCommand("glue", "a GLUE task (paper defaults: batch 32, 3 epochs, lr 2e-5)", glue.add_glue_flags,
                            glue.glue_from_args, dict(lr=2e-5, batch_size=32, max_seq_length=128, epochs=3.0),
                            after=glue.glue_after),
            FinetuneCommand("classify", "your own CSV/TSV/JSONL: columns text, [text_pair], label",
                            classify.add_classify_flags, classify.classify_from_args,
                            dict(lr=2e-5, batch_size=32, max_seq_length=128, epochs=3.0),
                            after=classify.classify_after),
        ),
        predict=PredictCommand(classify.predict_from_args, classify.add_predict_flags),
        # GLUE task names (and their aliases) resolve here too: a GLUE model records its task's name.
        problem_types=("single_label_classification", "regression"),
        distill=Distillation("bertforge.distillation.classify:ClassifyAdaptor", _CLASSIFIER,
                             dict(lr=5e-5, batch_size=32, max_seq_length=128, epochs=3.0), intermediate=True,
                             student_vocab=True, augment=True),
    ),
    TaskFamily(
        # Any number of labels per text: the classify head with sigmoid + binary cross-entropy. Its
        # checkpoints carry finetuning_task "multi-label" (or, from transformers, problem_type), which is
        # how they resolve here rather than to classify; they serve through the classify pipeline.
        name="multi-label", aliases=("multi_label", "multi-label-classification", "multi_label_classification"),
        head=BertForSequenceClassification, architectures=(),
        reader=multi_label_reader.read_multi_label_file,
        finetune=(
            FinetuneCommand("multi-label", "any number of labels per text: GoEmotions TSV with --labels, or CSV/JSONL "
                            "with a labels list; defaults: batch 32, 3 epochs, lr 5e-5", multi_label.add_multi_label_flags,
                            multi_label.multi_label_from_args, multi_label.RECIPE, after=multi_label.after_finetune),
        ),
        predict=PredictCommand(multi_label.predict_run, multi_label.add_predict_flags), pipeline="classify",
        finetuning_tasks=(multi_label.TASK_NAME,), problem_types=(multi_label.MULTI_LABEL,),
        distill=Distillation("bertforge.distillation.multi_label:MultiLabelAdaptor", _CLASSIFIER, multi_label.RECIPE,
                             augment=True),
    ),
    TaskFamily(
        name="multiple-choice", aliases=("multiple_choice", "choice", "swag"),
        head=BertForMultipleChoice, architectures=("BertForMultipleChoice",),
        reader=multiple_choice.read_swag_file,
        pipeline_class="bertforge.serving.pipelines.multiple_choice:MultipleChoicePipeline",
        finetune=(
            FinetuneCommand("multiple-choice", "SWAG-layout CSV (sent1, sent2, ending0..3, label); paper defaults: "
                            "batch 16, 3 epochs, lr 2e-5", multiple_choice.add_multiple_choice_flags,
                            multiple_choice.multiple_choice_from_args,
                            dict(lr=2e-5, batch_size=16, max_seq_length=128, epochs=3.0),
                            after=multiple_choice.multiple_choice_after),
        ),
        predict=PredictCommand(multiple_choice.predict_from_args), finetuning_tasks=(multiple_choice.TASK_NAME,),
    ),
    TaskFamily(
        name="answer", aliases=("question-answering", "qa", "squad"),
        head=BertForQuestionAnswering, architectures=("BertForQuestionAnswering",),
        reader=squad_data.read_squad_file, pipeline_class="bertforge.serving.pipelines.answer:AnswerPipeline",
        finetune=(
            # lr 5e-5 and seq 384 as Google's run_squad.py; batch size and epochs per --version (squad_from_args)
            FinetuneCommand("squad", "SQuAD v1.1 / v2.0 JSON (Google's defaults: seq 384, stride 128, lr 5e-5; "
                            "v1.1: 3 epochs, batch 32; v2.0: 2 epochs, batch 48 as the paper)", answer.add_squad_flags,
                            answer.squad_from_args, dict(lr=5e-5, batch_size=None, max_seq_length=384, epochs=None),
                            check=answer.check_squad_args, after=answer.squad_after, recipe_for=answer.squad_recipe),
        ),
        predict=PredictCommand(answer.predict_from_args, answer.add_predict_flags, own_files=True,
                               selected_by=("question",)),
        finetuning_tasks=("squad", "squad_v2"),
        distill=Distillation("bertforge.distillation.answer:AnswerAdaptor", ("qa_outputs.weight", "qa_outputs.bias"),
                             answer.answer_recipe, options=("version", "doc_stride", "tune_threshold"),
                             intermediate=True, head_proves_training=True),
    ),
    TaskFamily(
        name="tag", aliases=("ner", "token-classification", "tagging"),
        head=BertForTokenClassification, architectures=("BertForTokenClassification", "BiLSTMTagger"),
        reader=conll.read_conll, pipeline_class="bertforge.serving.pipelines.tag:TagPipeline",
        finetune=(
            # lr and epochs per approach (ner_from_args): fine-tuning 5e-5 and 3, the BiLSTM 1e-3 and 4.
            FinetuneCommand("ner", "CoNLL-2003-style NER (word ... TAG columns); defaults: batch 16, 3 epochs, "
                            "lr 5e-5 (--feature-based: 4 epochs, lr 1e-3)", tag.add_ner_flags,
                            tag.ner_from_args, dict(lr=None, batch_size=16, max_seq_length=128, epochs=None),
                            after=tag.ner_after, recipe_for=tag.ner_recipe),
        ),
        predict=PredictCommand(tag.predict_from_args, tag.add_predict_flags),
        finetuning_tasks=(conll.TASK_NAME,),
        distill=Distillation("bertforge.distillation.tag:TagAdaptor", _CLASSIFIER, tag.FINE_TUNING_RECIPE,
                             intermediate=True, augment=True, head_proves_training=True),
    ),
    TaskFamily(
        name="embed", aliases=("feature-extraction", "embedding", "extract-features", "features"),
        head=BertModel, architectures=("BertModel",),
        reader=embed.read_examples, pipeline_class="bertforge.serving.pipelines.embed:EmbedPipeline",
    ),
    TaskFamily(
        name="fill-mask", aliases=("fill_mask", "mlm"),
        head=BertForMaskedLM, architectures=("BertForMaskedLM", "BertForPreTraining"),
        pipeline_class="bertforge.serving.pipelines.fill_mask:FillMaskPipeline",
    ),
    TaskFamily(
        # Bi-encoders (Sentence-BERT): one pooled, normalised vector per text, compared by cosine. Served by the
        # embed pipeline, which reads the pooling from the model directory (and its similarity companion).
        name=sentence_embedding.TASK_NAME,
        aliases=("sentence_embedding", "sentence-embeddings", "sentence-similarity", "bi-encoder"),
        head=sentence_embedding.SentenceEncoder, architectures=(),
        reader=sentence_embedding.read_sentence_file,
        finetune=(
            FinetuneCommand(sentence_embedding.TASK_NAME, "a bi-encoder (Sentence-BERT): scored pairs (STS-B's TSV), "
                            "0/1 pairs or (anchor, positive[, negative]) rows; defaults: batch 16, 4 epochs, lr 2e-5",
                            sentence_embedding.add_sentence_embedding_flags,
                            sentence_embedding.sentence_embedding_from_args, sentence_embedding.RECIPE),
        ),
        predict=PredictCommand(sentence_embedding.predict_from_args, sentence_embedding.add_predict_flags),
        pipeline="embed", finetuning_tasks=(sentence_embedding.TASK_NAME,),
        distill=Distillation("bertforge.distillation.sentence_embedding:SentenceEmbeddingAdaptor", (),
                             sentence_embedding.DISTILL_RECIPE, keep_last_layer=True),
    ),
)
"""The families bertforge ships; `register_family` adds more at run time (`TASKS` holds them all)."""

# Every family, built-in and registered, by canonical name, in registration order.
TASKS: dict[str, TaskFamily] = {}
# Every accepted name -> canonical name. GLUE task names (and the metric aliases such as "mnli-m")
# are classify: a GLUE model's config.json records its GLUE task as `finetuning_task`.
ALIASES: dict[str, str] = {}
_ARCHITECTURES: dict[str, str] = {}  # config.json `architectures` entry -> the first family declaring it
_PROBLEM_TYPES: dict[str, str] = {}  # config.json `problem_type` -> family


def _index() -> None:
    """Rebuild the name tables from `TASKS` (in place: other modules hold these dicts)."""
    for table in (ALIASES, _ARCHITECTURES, _PROBLEM_TYPES):
        table.clear()
    for family in TASKS.values():
        for name in family.names:
            ALIASES[name] = family.name
        for architecture in family.architectures:
            _ARCHITECTURES.setdefault(architecture, family.name)
        for problem_type in family.problem_types:
            _PROBLEM_TYPES.setdefault(problem_type, family.name)
    for name in glue_data.GLUE_TASKS:
        ALIASES.setdefault(name, "classify")


def register_family(family: TaskFamily) -> TaskFamily:
    """Add a task family: its names resolve to it, its `finetune` commands become `bertforge finetune`
    sub-commands and its `predict` runs for its checkpoints, wherever a parser is built after this call
    (`bertforge.cli.build_parser` reads the registry each time). ValueError when the family, one of its
    names or one of its finetune commands is taken already: a name means one family."""
    if family.name in TASKS:
        raise ValueError(f"task family {family.name!r} is registered already")
    for name in family.names:
        if name in ALIASES:
            raise ValueError(f"task name {name!r} of {family.name!r} already names {ALIASES[name]!r}")
    taken = {command.name for command in finetune_commands()}
    for command in family.finetune:
        if command.name in taken:
            raise ValueError(f"`bertforge finetune {command.name}` is taken already")
    TASKS[family.name] = family
    _index()
    return family


def unregister_family(name: str) -> None:
    """Remove a family added by `register_family` (a built-in one stays: ValueError)."""
    family = TASKS.get(name)
    if family is None:
        raise ValueError(f"no task family {name!r}")
    if family in FAMILIES:
        raise ValueError(f"{name!r} is a built-in task family")
    del TASKS[name]
    _index()


def finetune_commands() -> list[FinetuneCommand]:
    """Every `bertforge finetune` sub-command, family by family in registration order."""
    return [command for family in TASKS.values() for command in family.finetune]


for _family in FAMILIES:
    register_family(_family)
del _family


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
        glue_data.get_task(str(name))
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
    """The family a checkpoint was trained for: the `finetuning_task` in its config.json (what `bertforge
    finetune` wrote; it tells apart families that share a head, such as classify and a multi-label
    family on `BertForSequenceClassification`), else its `problem_type` (as transformers writes it),
    else its head (config.json `architectures`), else `default` (a bare encoder embeds; None: return None).
    A value the registry does not know is passed over for the next one."""
    config = checkpoint_config(directory)
    task = config.get("finetuning_task")
    if task:
        try:
            return resolve(task)
        except ValueError:
            pass
    problem_type = config.get("problem_type")
    if problem_type in _PROBLEM_TYPES:
        return TASKS[_PROBLEM_TYPES[problem_type]]
    for architecture in config.get("architectures") or []:
        if architecture in _ARCHITECTURES:
            return TASKS[_ARCHITECTURES[architecture]]
    return None if default is None else TASKS[default]


def task_for_checkpoint(directory: str | os.PathLike) -> str:
    """The canonical family name of a checkpoint: see `family_for_checkpoint` (default: embed)."""
    return family_for_checkpoint(directory).name


def pipeline_for_checkpoint(directory: str | os.PathLike) -> str:
    """The name of the pipeline that serves a checkpoint: its family's `pipeline` (default: embed's)."""
    return family_for_checkpoint(directory).pipeline


__all__ = ["ALIASES", "FAMILIES", "TASKS", "Distillation", "FinetuneCommand", "PredictCommand", "TaskFamily", "checkpoint_config",
           "family_for_checkpoint", "finetune_commands", "pipeline_for_checkpoint", "register_family", "resolve",
           "task_for_checkpoint", "unregister_family"]
