"""SQuAD v1.1 and v2.0 (§4.2, §4.3): reader, features, span prediction and the fine-tuning task.

The pieces, in the order data flows through them:

* `read_squad_file(path)`: the official JSON (`data/title/paragraphs/context/qas/answers`,
  `is_impossible`, `plausible_answers`) as `SquadExample`s; malformed input is reported with the
  file and question id.
* `convert_examples_to_features(...)`: `[CLS] question [SEP] passage window [SEP]` rows (Google's
  `run_squad.py`): the question is segment A, cut to `max_query_length` tokens; the passage is
  segment B, cut into windows `doc_stride` tokens apart (`bertforge.tasks.windows`). For training,
  the answer's character span is mapped to tokens through the tokenizer's character offsets; a
  window that does not hold the whole answer, and every window of an unanswerable question, is
  trained to point at [CLS] (position 0). An answer that cannot be aligned (its text is not at
  `answer_start`, or no token covers it) is reported and the question skipped.
* `postprocess(...)`: Google's `write_predictions`: the `n_best_size` best starts and ends of each
  window, spans with end >= start, at most `max_answer_length` tokens, starting in the window where
  the start token has maximal context; the n-best list over all windows; for v2.0 the null score
  (start and end logits at [CLS], the lowest over the windows) against the best span:
  `null_odds = null score - best span score`, and "no answer" when it exceeds
  `null_score_diff_threshold` (the paper's τ), which `tune_threshold` chooses on dev to maximise F1.
  Answer text is the passage's characters between the span's offsets (no detokenisation needed).
* `squad_task(...)`: the `FinetuneTask` for `bertforge.training.finetune`; its evaluation writes
  `predictions.json`, `nbest_predictions.json`, `null_odds.json` (v2.0) and `squad_eval.json`
  (the official scripts' results, in percent) beside the model.
* `answer_questions(...)` / `predict_squad_file(...)`: a fine-tuned model's answers.

* the answer family's commands (`bertforge finetune squad`, `bertforge predict` for a SQuAD model),
  read by the task registry.

The data pieces live one concern per module (import them from there): `bertforge.tasks.squad_data`
(settings, reader, features, batches) and `bertforge.tasks.squad_postprocess` (logits to answers,
the null threshold, the output files).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .._checks import check_output
from .._files import write_text_atomic
from ..metrics.squad import evaluate_v1, evaluate_v2, squad_metrics
from ..modeling import BertConfig, BertForQuestionAnswering, load_for_inference
from ..modeling.modes import evaluating
from ..modeling.pretrained import check_pretrained, resolve_model_dir
from ..tokenization import BertTokenizer
from ..tokenization._read import read_json_object
from ..training.finetune import FinetuneTask
from .squad_data import (VERSIONS, SquadExample, SquadSettings, check_alignment, collate, convert_examples_to_features,
                         read_squad_file)
from .squad_postprocess import SquadPredictions, json_text, postprocess, tune_null_threshold, write_squad_predictions

logger = logging.getLogger("bertforge")

__all__ = ["ANSWER_RECIPE", "SQUAD_DEFAULTS", "SQUAD_FLAGS", "add_predict_flags", "add_squad_flags",
           "answer_questions", "answer_recipe", "check_squad_args", "check_squad_settings", "predict_from_args",
           "predict_logits", "predict_squad_file", "squad_after", "squad_flags", "squad_from_args", "squad_recipe",
           "squad_step", "squad_task", "teacher_version"]


def squad_step(model, batch: dict[str, torch.Tensor]):
    """The loss of a batch: the mean of the start and end cross-entropies (§4.2)."""
    out = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"], start_positions=batch["start_positions"],
                end_positions=batch["end_positions"])
    return out.loss, {}


@torch.no_grad()
def predict_logits(model, features: Sequence[dict], batch_size: int = 128,
                   pad_token_id: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """(start logits, end logits), each (S_k,) for feature k's own length, in feature order. Rows run
    shortest first in batches, so padding is minimal."""
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    device = next(model.parameters()).device
    results: list = [None] * len(features)
    with evaluating(model):
        for begin in range(0, len(order), batch_size):
            rows = order[begin:begin + batch_size]
            batch = collate([{"input_ids": features[i]["input_ids"], "token_type_ids": features[i]["token_type_ids"]}
                             for i in rows], pad_token_id)
            out = model(**{k: v.to(device) for k, v in batch.items()})
            starts, ends = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
            for row, i in enumerate(rows):
                n = len(features[i]["input_ids"])
                results[i] = (starts[row, :n], ends[row, :n])
    return results


# ---------------------------------------------------------------------------- the fine-tuning task

def keep_tuned_threshold(model, dataset: list[dict], predictions: SquadPredictions) -> SquadPredictions:
    """`predictions` at the no-answer threshold that maximises F1 on `dataset` (`tune_null_threshold`), that
    threshold written into `model`'s config: it is part of the model, `predict` and the pipeline read it."""
    predictions = predictions.with_threshold(tune_null_threshold(dataset, predictions))
    model.config.extra["squad"] = {**model.config.extra.get("squad", {}),
                                   "null_score_diff_threshold": predictions.null_score_diff_threshold}
    return predictions


def squad_task(model_dir: str | os.PathLike, train_file: str | os.PathLike, dev_file: str | os.PathLike, *,
               version: str = "1.1", settings: SquadSettings | None = None, tune_threshold: bool = False,
               eval_batch_size: int = 128, max_train_examples: int | None = None):
    """The `FinetuneTask` of SQuAD `version` ("1.1" or "2.0") from official-format JSON files.

    Dev metrics (eval_results.json, fractions): `exact_match`, `f1` and for 2.0 `HasAns_*`,
    `NoAns_*`, `best_exact`, `best_f1`, `best_*_thresh` and the `null_score_diff_threshold` used
    (tuned each evaluation with `tune_threshold`, then saved in the model's config). The main
    metric is `f1`. The model's config records `finetuning_task`, `version_2_with_negative` (what
    the `answer` pipeline reads) and the settings.
    """
    if version not in VERSIONS:
        raise ValueError(f"SQuAD version must be one of {VERSIONS}, got {version!r}")
    settings = settings or SquadSettings()
    settings.check()
    v2 = version == "2.0"
    check_pretrained(resolve_model_dir(model_dir))  # the checkpoint whole, before its data is tokenized
    tokenizer = BertTokenizer.from_pretrained(resolve_model_dir(model_dir))
    train, dev = read_squad_file(train_file), read_squad_file(dev_file)
    for data in (train, dev):
        impossible = next((e for e in data.examples if e.is_impossible), None)
        if impossible is not None and not v2:
            raise ValueError(f"{data.path}: question {impossible.qas_id} is unanswerable (is_impossible): "
                             f"this is SQuAD 2.0 data, use --version 2.0")
    train_examples = train.examples[:max_train_examples] if max_train_examples else train.examples
    train_features = convert_examples_to_features(train_examples, tokenizer, settings, is_training=True)
    check_alignment(train_features.skipped, train_examples, train.path)
    dev_features = convert_examples_to_features(dev.examples, tokenizer, settings)
    logger.info("SQuAD %s: %d training questions -> %d windows (%d skipped); %d dev questions -> %d windows",
                version, len(train_examples), len(train_features.features), len(train_features.skipped),
                len(dev.examples), len(dev_features.features))
    pad_id = tokenizer.pad_token_id
    name = "squad_v2" if v2 else "squad"
    rows = [{k: f[k] for k in ("input_ids", "token_type_ids", "start_position", "end_position")}
            for f in train_features.features]

    def build_model():
        return BertForQuestionAnswering.from_pretrained(
            model_dir, finetuning_task=name, version_2_with_negative=v2, squad=vars(settings).copy())

    def evaluate(model):
        logits = predict_logits(model, dev_features.features, eval_batch_size, pad_id)
        predictions = postprocess(dev.examples, dev_features, logits, n_best_size=settings.n_best_size,
                                  max_answer_length=settings.max_answer_length, version_2_with_negative=v2,
                                  null_score_diff_threshold=settings.null_score_diff_threshold)
        if not v2:
            official = evaluate_v1(dev.dataset, predictions.predictions)
            return squad_metrics(dev.dataset, predictions.predictions, version), (predictions, official)
        if tune_threshold:
            predictions = keep_tuned_threshold(model, dev.dataset, predictions)
        official = evaluate_v2(dev.dataset, predictions.predictions, predictions.null_odds)
        metrics = squad_metrics(dev.dataset, predictions.predictions, version, predictions.null_odds)
        metrics["null_score_diff_threshold"] = predictions.null_score_diff_threshold
        return metrics, (predictions, official)

    def write_predictions(output_dir: Path, value) -> None:
        predictions, official = value
        write_squad_predictions(output_dir, predictions, official)

    return FinetuneTask(
        name=name, build_model=build_model, tokenizer=tokenizer, train_features=rows,
        collate=lambda batch: collate(batch, pad_id), step_fn=squad_step, evaluate=evaluate, main_metric="f1",
        write_predictions=write_predictions, lengths=[len(r["input_ids"]) for r in rows])


# ---------------------------------------------------------------------------- a fine-tuned model's answers


def _load(model_dir: str | os.PathLike, overrides: dict[str, Any], dtype: str | None = None):
    config = BertConfig.from_pretrained(model_dir)
    stored = config.extra.get("squad") or {}
    known = set(vars(SquadSettings()))
    settings = SquadSettings(**{**{k: v for k, v in stored.items() if k in known},
                                **{k: v for k, v in overrides.items() if v is not None}})
    v2 = bool(config.extra.get("version_2_with_negative", False))
    model = load_for_inference(BertForQuestionAnswering, model_dir, dtype, task="squad")
    return model, BertTokenizer.from_pretrained(resolve_model_dir(model_dir)), settings, v2


def _predict(model, tokenizer, settings: SquadSettings, v2: bool, examples: list[SquadExample],
             batch_size: int) -> SquadPredictions:
    features = convert_examples_to_features(examples, tokenizer, settings)
    logits = predict_logits(model, features.features, batch_size, tokenizer.pad_token_id)
    return postprocess(examples, features, logits, n_best_size=settings.n_best_size,
                       max_answer_length=settings.max_answer_length, version_2_with_negative=v2,
                       null_score_diff_threshold=settings.null_score_diff_threshold)


def answer_questions(model_dir: str | os.PathLike, questions: Sequence[str], contexts: Sequence[str], *,
                     batch_size: int = 32, dtype: str | None = None, **settings: Any) -> list[dict]:
    """Each question's answer in its context with a model from `bertforge finetune squad`:
    `{"answer", "start", "end", "probability", "null_odds"}` (character offsets into the context;
    `answer` "" with start/end None when a v2.0 model says there is none). `settings` override the
    model's stored `SquadSettings` (e.g. `null_score_diff_threshold=1.5`); `dtype`: see
    `bertforge.modeling.load_for_inference`."""
    if len(questions) != len(contexts):
        raise ValueError(f"{len(questions)} questions but {len(contexts)} contexts")
    for i, (question, context) in enumerate(zip(questions, contexts)):
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question {i} is empty")
        if not isinstance(context, str) or not context.strip():
            raise ValueError(f"context {i} is empty: there is no passage to find the answer in")
    model, tokenizer, resolved, v2 = _load(model_dir, settings, dtype)
    examples = [SquadExample(str(i), q, c, paragraph=i) for i, (q, c) in enumerate(zip(questions, contexts))]
    predictions = _predict(model, tokenizer, resolved, v2, examples, batch_size)
    answers = []
    for example in examples:
        qid, text = example.qas_id, predictions.predictions[example.qas_id]
        entry = next((n for n in predictions.nbest[qid] if n["text"] == text), predictions.nbest[qid][0])
        answers.append({"answer": text, "start": entry["start"] if text else None, "end": entry["end"] if text else None,
                        "probability": entry["probability"], "null_odds": predictions.null_odds.get(qid)})
    return answers


def predict_squad_file(model_dir: str | os.PathLike, input_file: str | os.PathLike, output_file: str | os.PathLike,
                       *, batch_size: int = 32, dtype: str | None = None, **settings: Any) -> dict[str, Any] | None:
    """Answers for a SQuAD JSON file: `output_file` gets {id: answer}; `nbest_predictions.json` and, for
    v2.0, `null_odds.json` go beside it with the output's name as prefix (`OUT.nbest.json`,
    `OUT.null_odds.json`). Returns the official script's results (percent) when the file has answers.
    `dtype`: see `bertforge.modeling.load_for_inference`."""
    data = read_squad_file(input_file, require_answers=False)  # bad input is reported before the model loads
    model, tokenizer, resolved, v2 = _load(model_dir, settings, dtype)
    predictions = _predict(model, tokenizer, resolved, v2, data.examples, batch_size)
    output_file = Path(output_file)
    output_file.parent.mkdir(parents=True, exist_ok=True)
    stem = output_file.with_suffix("")
    # The side files first: the predictions file, written last, marks a finished run.
    write_text_atomic(f"{stem}.nbest.json", json_text(predictions.nbest))
    if v2:
        write_text_atomic(f"{stem}.null_odds.json", json_text(predictions.null_odds))
    write_text_atomic(output_file, json_text(predictions.predictions))
    if not all(e.answers or e.is_impossible for e in data.examples):
        return None  # unlabelled questions: nothing to score
    if v2 or any(e.is_impossible for e in data.examples):  # v1.1's script cannot score unanswerable questions
        return evaluate_v2(data.dataset, predictions.predictions, predictions.null_odds or None)
    return evaluate_v1(data.dataset, predictions.predictions)


# ---------------------------------------------------------------------------- the commands (the registry's entry)

# Per version: Google's run_squad.py / the paper's v1.1 recipe (3 epochs, batch 32, lr 5e-5) and the paper's
# v2.0 recipe (§4.3: 2 epochs, batch 48, lr 5e-5).
SQUAD_DEFAULTS = {"1.1": {"epochs": 3.0, "batch_size": 32}, "2.0": {"epochs": 2.0, "batch_size": 48}}

# The answer family's recipe (`finetune squad`, `distill`): lr 5e-5 and seq 384 as Google's run_squad.py; batch size
# and epochs per version (SQUAD_DEFAULTS)
ANSWER_RECIPE = dict(lr=5e-5, batch_size=SQUAD_DEFAULTS["1.1"]["batch_size"], max_seq_length=384,
                     epochs=SQUAD_DEFAULTS["1.1"]["epochs"])


def teacher_version(config: BertConfig, version: str | None = None) -> str:
    """The SQuAD version of a teacher: its config.json's (`version_2_with_negative`, else `finetuning_task`
    "squad_v2" / "squad"), else `version` (--version), else "1.1". ValueError when --version contradicts
    the teacher."""
    extra = config.extra
    if "version_2_with_negative" in extra:
        own = "2.0" if extra["version_2_with_negative"] else "1.1"
    else:
        own = {"squad_v2": "2.0", "squad": "1.1"}.get(str(extra.get("finetuning_task")))
    if own is not None and version is not None and version != own:
        raise ValueError(f"--version {version}: the teacher was fine-tuned on SQuAD {own} (its config.json)")
    return own or version or "1.1"


def answer_recipe(config: BertConfig, options: dict[str, Any]) -> dict[str, Any]:
    """The shared flags' defaults for this teacher: `finetune squad`'s per version (v1.1: batch 32, 3 epochs;
    v2.0: batch 48, 2 epochs), lr 5e-5, the teacher's own --max-seq-length (else 384)."""
    version = teacher_version(config, options.get("version"))
    stored = config.extra.get("squad") or {}
    return {**ANSWER_RECIPE, **SQUAD_DEFAULTS[version],
            "max_seq_length": stored.get("max_seq_length", ANSWER_RECIPE["max_seq_length"])}


# The SquadSettings fields that `finetune squad` and `predict` take as flags of the same names.
SQUAD_FLAGS = ("max_seq_length", "doc_stride", "max_query_length", "n_best_size", "max_answer_length",
               "null_score_diff_threshold")


def squad_flags(args: argparse.Namespace) -> dict:
    """The SquadSettings fields given on the command line."""
    return {name: getattr(args, name) for name in SQUAD_FLAGS if getattr(args, name, None) is not None}


def add_squad_flags(p: argparse.ArgumentParser) -> None:
    """`bertforge finetune squad`'s own flags: the files, the version, Google's window and answer settings."""
    p.add_argument("--train-file", required=True, help="official-format JSON (data/paragraphs/qas/answers)")
    p.add_argument("--dev-file", required=True, help="official-format JSON with answers")
    p.add_argument("--version", choices=tuple(SQUAD_DEFAULTS), default="1.1",
                   help="2.0: unanswerable questions (is_impossible), no-answer at [CLS]")
    p.add_argument("--doc-stride", type=int, default=128, help="tokens between the starts of passage windows")
    p.add_argument("--max-query-length", type=int, default=64, help="question tokens kept")
    p.add_argument("--n-best-size", type=int, default=20, help="candidates per window and n-best list length")
    p.add_argument("--max-answer-length", type=int, default=30, help="longest answer span, in tokens")
    p.add_argument("--null-score-diff-threshold", type=float, default=0.0,
                   help="v2.0: answer nothing when null score - best span score exceeds this (the paper's tau)")
    p.add_argument("--tune-threshold", action="store_true",
                   help="v2.0: choose the threshold that maximises dev F1 at each evaluation (saved with the model)")
    p.add_argument("--max-train-examples", type=int, help="train on the first N questions only")


def check_squad_args(args: argparse.Namespace) -> None:
    """The window settings must work together (before a model is fetched or loads)."""
    SquadSettings(**{k: v for k, v in squad_flags(args).items() if k != "null_score_diff_threshold"}).check(flags=True)


def squad_recipe(args: argparse.Namespace) -> dict[str, Any]:
    """`finetune squad`'s recipe for its flags: lr 5e-5 and seq 384, batch size and epochs per --version."""
    return {**ANSWER_RECIPE, **SQUAD_DEFAULTS[args.version]}


def squad_from_args(args: argparse.Namespace) -> FinetuneTask:
    """`squad_task` from `bertforge finetune squad`'s flags (the version's recipe, `squad_recipe`, fills the
    batch size and epochs not given)."""
    if args.tune_threshold and args.version != "2.0":
        raise ValueError("--tune-threshold chooses the no-answer threshold of SQuAD 2.0: add --version 2.0")
    return squad_task(args.model, args.train_file, args.dev_file, version=args.version,
                      settings=SquadSettings(**squad_flags(args)), tune_threshold=args.tune_threshold,
                      eval_batch_size=args.eval_batch_size, max_train_examples=args.max_train_examples)


def squad_after(args: argparse.Namespace) -> None:
    """Where the evaluation's files are."""
    print(f"predictions.json, nbest_predictions.json{', null_odds.json' if args.version == '2.0' else ''} and the "
          f"official script's results (percent) in {args.output_dir}/squad_eval.json")


def add_predict_flags(p: argparse.ArgumentParser) -> None:
    """`bertforge predict`'s flags for a SQuAD model: one question, and the settings stored with the model."""
    p.add_argument("--question", help="SQuAD model: answer this question (with --context), printed as JSON")
    p.add_argument("--context", help="SQuAD model: the passage holding the answer")
    p.add_argument("--doc-stride", type=int, help="SQuAD: default the model's (128)")
    p.add_argument("--max-answer-length", type=int, help="SQuAD: default the model's (30)")
    p.add_argument("--null-score-diff-threshold", type=float,
                   help="SQuAD 2.0: default the model's (0, or the value --tune-threshold chose)")


def check_squad_settings(model: str | os.PathLike, overrides: dict) -> None:
    """The model's stored SQuAD settings with the flags given must work (before the model loads)."""
    try:  # an unreadable config.json is reported when the model loads
        stored = read_json_object(Path(model) / "config.json", "model config").get("squad") or {}
    except (OSError, ValueError):
        stored = {}
    known = set(vars(SquadSettings()))
    SquadSettings(**{**{k: v for k, v in stored.items() if k in known}, **overrides}).check(flags=True)


def predict_from_args(args: argparse.Namespace) -> None:
    """`bertforge predict` for a `finetune squad` model: one --question/--context, or a SQuAD JSON --input."""
    settings = squad_flags(args)
    check_squad_settings(args.model, settings)
    if args.question is not None or args.context is not None:
        if args.question is None or args.context is None:
            raise ValueError("--question and --context go together")
        for name, value in (("--question", args.question), ("--context", args.context)):
            if not value.strip():
                raise ValueError(f"{name} is empty")
        answer = answer_questions(args.model, [args.question], [args.context], batch_size=args.batch_size,
                                  dtype=args.dtype, **settings)[0]
        print(json_text(answer, indent=None))
        return
    if not args.input or not args.output:
        raise ValueError("a SQuAD model answers --question Q --context C, or a SQuAD JSON --input with --output")
    stem = Path(args.output).with_suffix("")
    check_output(args.output, [args.input], args.overwrite, [f"{stem}.nbest.json", f"{stem}.null_odds.json"])
    official = predict_squad_file(args.model, args.input, args.output, batch_size=args.batch_size, dtype=args.dtype,
                                  **settings)
    print(f"wrote {args.output}")
    if official is not None:
        print(json.dumps(official, indent=2))
