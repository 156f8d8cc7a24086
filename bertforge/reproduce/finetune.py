"""Fine-tuning every variant on the downstream tasks, several seeds each, through the shared engine.

Each (variant, task, seed) is one `bertforge.training.finetune` run in
`OUT/finetune/<variant>/<task>/seed<S>/`; its `DONE.json` (the dev metrics, written atomically last)
marks it finished, so a rerun reads it back instead of training again. An interrupted fine-tuning run
(seconds to a minute) starts over. The fine-tuned weights are deleted once scored (dozens of runs:
only the scores, the dev predictions and the logs are kept).

Tasks: the four built from the plays (`downstream.py`) and, for Table 7, CoNLL-2003 (the first N
sentences of train and dev). A variant's `features` strategy trains the feature-based BiLSTM tagger on
the frozen encoder's features (`bertforge.tasks.feature_based`: cached once per variant and task,
shared by the seeds); `bilstm` puts a randomly initialised BiLSTM on the encoder (`heads.py`: under the token
classifier, or as the sentence-level tasks' pooler); the LTR model's other sentence-level runs read the last
token rather than [CLS] (`heads.pool_last_token`).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Callable

from .._files import write_text_atomic
from ..tasks.multiple_choice import multiple_choice_task
from ..tasks.classify import classification_task, classify_metrics
from ..tasks.conll import prepare_ner_data, read_conll
from ..metrics.glue import main_metric
from ..tasks.feature_based import feature_ner_task
from ..tasks.glue import glue_task
from ..tasks.tag import ner_task
from ..training.finetune import FinetuneArguments, FinetuneTask, finetune
from .heads import CONFIG_HIDDEN, BertBiLSTMForTokenClassification, pool_bilstm, pool_last_token
from .downstream import METRIC, TaskFiles, read_jsonl_examples
from .settings import ReproduceSettings, Variant

DONE = "DONE.json"
TOKEN_TASKS = ("names", "conll")
Journal = Callable[..., None]  # records a stage that ran: journal(stage=..., **details)


def conll_subset(source_dir: Path, target_dir: Path, train_sentences: int, dev_sentences: int) -> dict[str, Path]:
    """The first N sentences of CoNLL-2003's train.txt and valid.txt, as `word TAG` files in `target_dir`."""
    paths = {}
    for split, name, limit in (("train", "train.txt", train_sentences), ("dev", "valid.txt", dev_sentences)):
        source = source_dir / name
        if not source.is_file():
            raise FileNotFoundError(f"table7 needs CoNLL-2003: {source} not found (pass --conll-dir)")
        target = target_dir / name
        if not target.is_file():
            sentences = read_conll(source)[:limit]
            lines = [line for s in sentences for line in [f"{w} {t}" for w, t in zip(s.words, s.tags)] + [""]]
            target.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(target, "\n".join(lines) + "\n")
        paths[split] = target
    return paths


def task_metric(task: str) -> str:
    """The dev metric a task is scored (and its best epoch chosen) by."""
    if task in TOKEN_TASKS:
        return "f1"
    return METRIC[task] if task in METRIC else main_metric(task)


def applies(variant: Variant, task: str) -> bool:
    """Whether a row has a cell for the task: the frozen features are a token-level approach here."""
    return task in TOKEN_TASKS or not variant.features


def sentence_task(task: str, model_dir: Path, files: TaskFiles) -> FinetuneTask:
    """The sentence-level tasks: genre and reply (classification), continuation (multiple choice)."""
    if task == "continuation":
        return multiple_choice_task(model_dir, files.path(task, "train"), files.path(task, "dev"))
    train = read_jsonl_examples(files.path(task, "train"), "train")
    dev = read_jsonl_examples(files.path(task, "dev"), "dev")
    labels = sorted({e.label for e in train + dev})
    return classification_task(task, model_dir, train, {"dev": dev}, labels, main_metric="accuracy",
                               metrics_fn=lambda split, predicted, gold: classify_metrics(predicted, gold, False))


def build_task(task: str, variant: Variant, model_dir: Path, files: TaskFiles, data_dirs: dict,
               settings: ReproduceSettings) -> FinetuneTask:
    """The FinetuneTask of `task` for the pre-trained model in `model_dir`, with the variant's head.
    `data_dirs`: {"conll": conll_subset's paths or None, "glue": GLUE's root}."""
    if task not in TOKEN_TASKS:
        spec = sentence_task(task, model_dir, files) if task in METRIC else \
            glue_task(task, data_dirs["glue"], model_dir, max_train_examples=settings.max_train_examples)
        if variant.bilstm:  # the BiLSTM reads every token: its sentence vector needs no [CLS] (heads.py)
            return dataclasses.replace(spec, build_model=lambda: pool_bilstm(spec.build_model(), settings.lstm_hidden))
        if variant.objective != "ltr":
            return spec
        # A causal encoder's [CLS] has read nothing but itself: classify from the last token (heads.py).
        return dataclasses.replace(spec, build_model=lambda: pool_last_token(spec.build_model()))
    train_file, dev_file = (data_dirs["conll"]["train"], data_dirs["conll"]["dev"]) if task == "conll" else \
        (files.path(task, "train"), files.path(task, "dev"))
    data = prepare_ner_data(model_dir, train_file, dev_file, unseen_dev_tags="warn")  # toy subsets: said, not fatal
    if variant.features:
        return feature_ner_task(model_dir, train_file, dev_file, features=variant.features,
                                lstm_hidden=settings.lstm_hidden, data=data, device=settings.device,
                                progress=settings.progress)
    fine_tuned = ner_task(model_dir, train_file, dev_file, data=data)
    if not variant.bilstm:
        return fine_tuned
    return dataclasses.replace(fine_tuned, build_model=lambda: BertBiLSTMForTokenClassification.from_pretrained(
        model_dir, num_labels=len(data.labels), id2label=data.id2label, finetuning_task="ner",
        **{CONFIG_HIDDEN: settings.lstm_hidden}))


def finetune_arguments(variant: Variant, settings: ReproduceSettings, output_dir: Path, seed: int) -> FinetuneArguments:
    """Every row's recipe: the settings' lr and batch size (one recipe, so rows differ by the variant alone);
    the feature-based BiLSTM, trained from scratch on frozen features, has its own lr and epochs."""
    feature = variant.features is not None
    return FinetuneArguments(
        output_dir=output_dir, seed=seed, lr=settings.feature_lr if feature else settings.finetune_lr,
        epochs=settings.feature_epochs if feature else settings.finetune_epochs,
        batch_size=settings.finetune_batch_size, log_every=25,
        num_threads=settings.num_threads, device=settings.device, progress=settings.progress)


def finetune_seeds(task: str, variant: Variant, model_dir: Path, run_dir: Path, files: TaskFiles, data_dirs: dict,
                   settings: ReproduceSettings, journal: Journal) -> list[dict]:
    """Every seed of one (variant, task): finished ones read back, the others trained (the task is built
    once, on the first seed that needs it). Returns [{"seed", "score" (percent), "metrics", "wall_seconds"}]."""
    results, task_spec = [], None
    for seed in settings.finetune_seeds:
        seed_dir = run_dir / f"seed{seed}"
        marker = seed_dir / DONE
        if marker.is_file():
            results.append(json.loads(marker.read_text(encoding="utf-8")))
            continue
        if seed_dir.exists():
            shutil.rmtree(seed_dir)  # an interrupted run: start it again
        started = time.perf_counter()
        if task_spec is None:
            task_spec = build_task(task, variant, model_dir, files, data_dirs, settings)
        best = finetune(task_spec, finetune_arguments(variant, settings, seed_dir, seed))
        for weights in seed_dir.glob("*.safetensors"):
            weights.unlink()
        record = {"seed": seed, "score": 100 * best["metrics"][task_metric(task)], "metrics": best["metrics"],
                  "epoch": best.get("epoch"), "wall_seconds": round(time.perf_counter() - started, 1)}
        write_text_atomic(marker, json.dumps(record, indent=2) + "\n")
        journal(stage="finetune", variant=variant.key, task=task, seed=seed, wall_seconds=record["wall_seconds"])
        results.append(record)
    return results
