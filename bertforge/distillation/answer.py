"""Distilling the answer family (SQuAD v1.1 / v2.0 extractive question answering): a `FinetuneTask`
whose step is the distillation objective over span start and end positions.

The transfer set is the teacher's SQuAD-format training file, cut into windows as `finetune squad` does
(`squad_data.convert_examples_to_features`: `[CLS] question [SEP] passage window [SEP]`, windows
--doc-stride tokens apart). The version is the teacher's (its config.json: `version_2_with_negative`,
or `finetuning_task` "squad_v2" / "squad"), else --version ("1.1" by default, as `finetune squad`); the
window settings are the teacher's stored ones (config.json "squad"), else the family's defaults.

The teacher's start and end logits per window, (N, S) float32 with S the longest window, are computed
once (`cache.teacher_outputs`, memory-mapped); positions outside the window's passage are stored as -inf
(padding and the question; [CLS], position 0, stays: it is the no-answer and answer-elsewhere target).

The loss of a batch, each term a mean over its windows:

* `distill_loss`: the soft targets over positions (`objectives.soft_target_loss` with K = S: a softmax
  over the window's positions) for the start and for the end at temperature T, their mean; the student's
  logits outside the passage are masked the same way (they take no probability and get no gradient);
* `label_loss`: alpha × the mean of the start and end cross-entropies against the gold positions, over
  the same masked logits (the gold position is always [CLS] or a passage token).

With `intermediate` (TinyBERT's intermediate-layer transfer, `intermediate.py`), the teacher also runs on
each batch and `hidden_loss` / `attention_loss` over every real token of the windows (question and
passage) are added, each × `intermediate_weight`.

`labels_only=True` is the control: the same student, windows and engine trained on `label_loss` alone,
weight 1. Evaluation on --dev-file is `finetune squad`'s (exact match and F1 through Google's
postprocessing; v2.0 with the teacher's no-answer threshold, or with `tune_threshold` the student's own, chosen
on dev and saved with it), plus the share of dev windows whose
best start (end) position is the teacher's; without --dev-file, the student is judged by that agreement
on the training file's windows. The student is a normal `finetune squad` checkpoint (`finetuning_task`,
`version_2_with_negative` and the window settings in its config.json).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .._files import write_text_atomic
from ..metrics.squad import evaluate_v1, evaluate_v2, squad_metrics
from ..modeling import BertConfig, BertForQuestionAnswering, load_for_inference
from ..tasks.registry import TaskFamily
from ..tasks.squad import SQUAD_DEFAULTS, keep_tuned_threshold, predict_logits
from ..tasks.squad_data import SquadSettings, check_alignment, collate, convert_examples_to_features, read_squad_file
from ..tasks.squad_postprocess import postprocess, write_squad_predictions
from ..tokenization import BertTokenizer
from ..training.finetune import FinetuneTask
from .cache import cache_key, default_cache_dir, teacher_outputs
from .classify import DISTILL_INFO
from .intermediate import IntermediateTransfer, StudentPass, intermediate_counts, with_intermediate
from .objectives import hard_label_loss, soft_target_loss
from .student import build_student

logger = logging.getLogger("bertforge")

__all__ = ["ANSWER_RECIPE", "answer_distill_task", "answer_recipe", "answer_step", "position_mask",
           "teacher_logits", "teacher_version"]

# `finetune squad`'s recipe (lr 5e-5 and seq 384 as Google's run_squad.py; batch and epochs per version)
ANSWER_RECIPE = dict(lr=5e-5, batch_size=SQUAD_DEFAULTS["1.1"]["batch_size"], max_seq_length=384,
                     epochs=SQUAD_DEFAULTS["1.1"]["epochs"])
# A masked position's logit before the softmax: exp() of it is 0 at any temperature, and it stays finite so
# that KL's p·(log p - log q) is 0 there, not NaN.
MASKED = -1e30


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


def position_mask(token_type_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) bool: the positions a span may start or end at: [CLS] (position 0) and the passage tokens
    (segment B), not the question, the [SEP]s nor the padding."""
    lengths = attention_mask.sum(-1, keepdim=True)
    positions = torch.arange(token_type_ids.shape[1], device=token_type_ids.device)
    passage = (token_type_ids == 1) & (positions < lengths - 1) & attention_mask.bool()
    passage[:, 0] = True
    return passage


def _masked(logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    return logits.float().masked_fill(~valid, MASKED)


def answer_step(temperature: float, alpha: float, labels_only: bool = False,
                intermediate: Callable[[], tuple[torch.nn.Module, IntermediateTransfer]] | None = None,
                intermediate_weight: float = 1.0):
    """The `step_fn` of an answer student: {"distill_loss", "label_loss"} (see the module docstring), and
    the share of windows whose best start and best end are the teacher's; `labels_only`: {"label_loss"}
    alone, unweighted (the control). `intermediate()`: the teacher and the run's `IntermediateTransfer`;
    the teacher then runs on the batch too and `intermediate_weight` × its terms ("hidden_loss",
    "attention_loss", over every real token of the window, question included) are added."""
    def step(model, batch: dict[str, torch.Tensor]):
        student = StudentPass(model, batch, intermediate)
        valid = batch["position_mask"]
        start, end = _masked(student.out.start_logits, valid), _masked(student.out.end_logits, valid)
        teacher_start, teacher_end = _masked(batch["teacher_start"], valid), _masked(batch["teacher_end"], valid)
        hard = (hard_label_loss(start, batch["start_positions"]) + hard_label_loss(end, batch["end_positions"])) / 2
        with torch.no_grad():
            agree = ((start.argmax(-1) == teacher_start.argmax(-1)).sum()
                     + (end.argmax(-1) == teacher_end.argmax(-1)).sum())
            metrics = {"teacher_agreement": (agree.float() / 2, len(valid))}  # windows: mean of start and end

        def soft() -> torch.Tensor:
            return (soft_target_loss(start, teacher_start, temperature)
                    + soft_target_loss(end, teacher_end, temperature)) / 2
        return student.losses(soft, hard, alpha, labels_only, intermediate_weight), metrics
    return step


def _count(batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Every window carries both terms (its gold position is [CLS] when the answer is elsewhere); the
    intermediate terms are means over real tokens / (query, key) pairs."""
    return {"distill_loss": float(len(batch["input_ids"])), "label_loss": float(len(batch["input_ids"])),
            **intermediate_counts(batch["attention_mask"])}


def teacher_logits(teacher, features: Sequence[dict], batch_size: int, pad_id: int) -> dict[str, np.ndarray]:
    """The teacher's start and end logits for `features` (eval mode, as saved) as (N, S) float32 arrays,
    S the longest window, -inf outside [CLS] and the passage (the question, the [SEP]s, the padding)."""
    logits = predict_logits(teacher, features, batch_size, pad_id)
    width = max(len(f["input_ids"]) for f in features)
    arrays = {"start_logits": np.full((len(features), width), -np.inf, dtype=np.float32),
              "end_logits": np.full((len(features), width), -np.inf, dtype=np.float32)}
    for row, (feature, (start, end)) in enumerate(zip(features, logits)):
        types = np.asarray(feature["token_type_ids"])
        valid = (types == 1) & (np.arange(len(types)) < len(types) - 1)
        valid[0] = True
        arrays["start_logits"][row, :len(types)] = np.where(valid, start, -np.inf)
        arrays["end_logits"][row, :len(types)] = np.where(valid, end, -np.inf)
    return arrays


def answer_distill_task(family: TaskFamily, teacher_dir: str | os.PathLike, train_file: str | os.PathLike, *,
                        output_dir: str | os.PathLike, dev_file: str | os.PathLike | None = None,
                        unlabeled: Sequence[str | os.PathLike] = (), layers: int | None = None,
                        student: str | None = None, temperature: float = 2.0, alpha: float = 0.5,
                        max_seq_length: int | None = None, eval_batch_size: int = 128,
                        cache_dir: str | os.PathLike | None = None, labels_only: bool = False,
                        device: str | None = None, version: str | None = None,
                        doc_stride: int | None = None, intermediate: Sequence[str] = (),
                        layer_map: Sequence[int] | None = None, intermediate_weight: float = 1.0,
                        tune_threshold: bool | None = None) -> FinetuneTask:
    """The `FinetuneTask` that distils the SQuAD model in `teacher_dir` into a student (see
    `student.build_student` for `layers` / `student`); `version` / `doc_stride`: --version (when the
    teacher does not say) and --doc-stride (default: the teacher's). The teacher's logits are computed on
    `device` (default: the GPU if there is one) and cached in `cache_dir` (default:
    `cache.default_cache_dir`). `unlabeled` text has no question: refused. `intermediate` ("hidden",
    "attention"), `layer_map`, `intermediate_weight`: TinyBERT's intermediate terms (`intermediate`; checked
    by `run.check_options`), the teacher running beside the student on each batch. `tune_threshold` (SQuAD
    2.0, with a dev file): the student's own no-answer threshold, chosen on dev at each evaluation to maximise
    F1 and saved with it, as `finetune squad --tune-threshold` (else the teacher's threshold is kept)."""
    if labels_only and intermediate:
        raise ValueError("--labels-only with --intermediate: the control is trained on the labels alone")
    if unlabeled:
        raise ValueError("--unlabeled: an answer teacher's transfer set is question/passage pairs; give more "
                         "SQuAD-format questions in --train-file instead")
    teacher_dir = Path(teacher_dir)
    config = BertConfig.from_pretrained(teacher_dir)
    resolved = teacher_version(config, version)
    v2 = resolved == "2.0"
    if tune_threshold and not v2:
        raise ValueError(f"--tune-threshold chooses the no-answer threshold of SQuAD 2.0; {teacher_dir} answers "
                         f"SQuAD {resolved}")
    if tune_threshold and dev_file is None:
        raise ValueError("--tune-threshold chooses the no-answer threshold on dev: give --dev-file")
    stored = config.extra.get("squad") or {}
    known = set(vars(SquadSettings()))
    values = {k: v for k, v in stored.items() if k in known}
    values["max_seq_length"] = max_seq_length or values.get("max_seq_length", ANSWER_RECIPE["max_seq_length"])
    if doc_stride is not None:
        values["doc_stride"] = doc_stride
    settings = SquadSettings(**values)
    settings.check(flags=True)
    tokenizer = BertTokenizer.from_pretrained(teacher_dir)
    pad_id = tokenizer.pad_token_id
    train = read_squad_file(train_file)
    dev = read_squad_file(dev_file) if dev_file is not None else None
    for data in (train, dev):
        impossible = next((e for e in data.examples if e.is_impossible), None) if data is not None else None
        if impossible is not None and not v2:
            raise ValueError(f"{data.path}: question {impossible.qas_id} is unanswerable (is_impossible) but the "
                             "teacher answers SQuAD 1.1")
    train_features = convert_examples_to_features(train.examples, tokenizer, settings, is_training=True)
    check_alignment(train_features.skipped, train.examples, train.path)
    features = [{**{k: f[k] for k in ("input_ids", "token_type_ids", "start_position", "end_position")}, "index": i}
                for i, f in enumerate(train_features.features)]
    dev_features = convert_examples_to_features(dev.examples, tokenizer, settings) if dev is not None else None
    name = "squad_v2" if v2 else "squad"
    logger.info("distilling SQuAD %s: %d training questions -> %d windows (%d skipped)%s", resolved,
                len(train.examples), len(features), len(train_features.skipped),
                f"; {len(dev.examples)} dev questions -> {len(dev_features.features)} windows" if dev else "")

    teacher = load_for_inference(BertForQuestionAnswering, teacher_dir, task="squad")
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(teacher_dir, output_dir)

    def outputs_of(rows: list[dict]) -> dict[str, np.ndarray]:
        key = cache_key(teacher_dir, rows, "answer start/end logits")

        def compute() -> dict[str, np.ndarray]:
            return teacher_logits(teacher, rows, eval_batch_size, pad_id)
        return teacher_outputs(cache_dir, key, compute, rows=len(rows))

    teacher.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    logits = outputs_of(features)
    dev_logits = outputs_of(dev_features.features) if dev is not None else None
    teacher.to("cpu")  # from here on only copied from (the student's initial weights)

    def answers(window_logits: Sequence[tuple[np.ndarray, np.ndarray]], tuned_model=None):
        """(predictions, metrics, the official script's output) on dev; with `tuned_model`, at the threshold
        that maximises dev F1, kept in that model's config (`keep_tuned_threshold`), else the teacher's."""
        predictions = postprocess(dev.examples, dev_features, window_logits, n_best_size=settings.n_best_size,
                                  max_answer_length=settings.max_answer_length, version_2_with_negative=v2,
                                  null_score_diff_threshold=settings.null_score_diff_threshold)
        if not v2:
            return predictions, squad_metrics(dev.dataset, predictions.predictions, resolved), \
                evaluate_v1(dev.dataset, predictions.predictions)
        if tuned_model is not None:
            predictions = keep_tuned_threshold(tuned_model, dev.dataset, predictions)
        metrics = squad_metrics(dev.dataset, predictions.predictions, resolved, predictions.null_odds)
        metrics["null_score_diff_threshold"] = predictions.null_score_diff_threshold
        return predictions, metrics, evaluate_v2(dev.dataset, predictions.predictions, predictions.null_odds)

    teacher_dev = None
    if dev is not None:
        rows = [(np.asarray(dev_logits["start_logits"][k, :len(f["input_ids"])]),
                 np.asarray(dev_logits["end_logits"][k, :len(f["input_ids"])]))
                for k, f in enumerate(dev_features.features)]
        teacher_dev = answers(rows)[1]

    made: dict[str, Any] = {}

    def build_model():
        model, made["student"] = build_student(teacher, layers=layers, student=student, head_overrides=dict(
            finetuning_task=name, version_2_with_negative=v2))
        model.config.extra.update(finetuning_task=name, version_2_with_negative=v2, squad=vars(settings).copy())
        trained, made["transfer"] = with_intermediate(model, config, intermediate, layer_map)
        return trained

    if intermediate:
        teacher.requires_grad_(False)  # it runs beside the student on every batch, never trained

    def agreement(window_logits, target: dict[str, np.ndarray], rows: Sequence[dict]) -> dict[str, float]:
        """The share of windows whose best start (end) among the valid positions is the teacher's."""
        scores = {}
        for which, side in (("start", 0), ("end", 1)):
            best = []
            for k, row in enumerate(rows):
                teacher_row = np.asarray(target[f"{which}_logits"][k, :len(row["input_ids"])])
                student_row = np.where(np.isfinite(teacher_row), window_logits[k][side], -np.inf)
                best.append(student_row.argmax() == teacher_row.argmax())
            scores[f"{which}_agreement"] = float(np.mean(best))
        scores["teacher_agreement"] = (scores["start_agreement"] + scores["end_agreement"]) / 2
        return scores

    def evaluate(model):
        if dev is None:
            window_logits = predict_logits(model, features, eval_batch_size, pad_id)
            return agreement(window_logits, logits, features), None
        window_logits = predict_logits(model, dev_features.features, eval_batch_size, pad_id)
        predictions, metrics, official = answers(window_logits, model if tune_threshold else None)
        metrics.update(agreement(window_logits, dev_logits, dev_features.features))
        return metrics, (predictions, official)

    def write_predictions(directory: Path, value) -> None:
        predictions, official = value
        write_squad_predictions(directory, predictions, official)

    def collate_rows(rows: list[dict]) -> dict[str, torch.Tensor]:
        batch = collate(rows, pad_id)
        index, width = [r["index"] for r in rows], batch["input_ids"].shape[1]
        for which in ("start", "end"):
            batch[f"teacher_{which}"] = torch.from_numpy(
                np.asarray(logits[f"{which}_logits"][index, :width], dtype=np.float32))
        batch["position_mask"] = position_mask(batch["token_type_ids"], batch["attention_mask"])
        return batch

    def extra_files(directory: Path) -> None:
        info = {"teacher": str(teacher_dir), "task": name, "family": family.name,
                "teacher_layers": config.num_hidden_layers, **made.get("student", {}),
                "objective": "labels only" if labels_only else "soft targets + labels",
                "temperature": temperature, "alpha": alpha, "version": resolved, "squad": vars(settings),
                "tune_threshold": bool(tune_threshold),
                "transfer_examples": len(train.examples), "transfer_windows": len(features),
                "teacher_outputs": str(cache_dir), "teacher_dev_metrics": teacher_dev}
        if intermediate:
            info.update(intermediate=list(intermediate), layer_map=list(layer_map),
                        intermediate_weight=intermediate_weight)
        write_text_atomic(directory / DISTILL_INFO, json.dumps(info, indent=2) + "\n")

    return FinetuneTask(
        name=name, build_model=build_model, tokenizer=tokenizer, train_features=features, collate=collate_rows,
        step_fn=answer_step(temperature, alpha, labels_only,
                            (lambda: (teacher, made["transfer"])) if intermediate else None, intermediate_weight),
        evaluate=evaluate,
        main_metric="f1" if dev is not None else "teacher_agreement",
        write_predictions=write_predictions if dev is not None else None,
        lengths=[len(f["input_ids"]) for f in features], count_fn=_count, extra_files=extra_files)
