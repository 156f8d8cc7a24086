"""The answer family's distillation adaptor (SQuAD v1.1 / v2.0 extractive question answering): the
objective over span start and end positions, and SQuAD 2.0's no-answer threshold as its after-step.

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

import functools
import logging
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..metrics.squad import evaluate_v1, evaluate_v2, squad_metrics
from ..tasks.answer import ANSWER_RECIPE, answer_recipe, keep_tuned_threshold, predict_logits, teacher_version
from ..tasks.squad_data import SquadSettings, check_alignment, collate, convert_examples_to_features, read_squad_file
from ..tasks.squad_postprocess import postprocess, write_squad_predictions
from ..tokenization import BertTokenizer
from .distiller import Adaptor, DistillRun, Terms, distillation_step
from .intermediate import IntermediateTransfer
from .objectives import hard_label_loss, soft_target_loss

logger = logging.getLogger("bertforge")

__all__ = ["ANSWER_RECIPE", "AnswerAdaptor", "answer_recipe", "answer_step", "answer_terms", "position_mask",
           "teacher_logits", "teacher_version"]

# A masked position's logit before the softmax: exp() of it is 0 at any temperature, and it stays finite so
# that KL's p·(log p - log q) is 0 there, not NaN.
MASKED = -1e30


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


def answer_terms(out, batch: dict[str, torch.Tensor], temperature: float) -> Terms:
    """The answer family's terms (see the module docstring) and the share of windows whose best start and
    best end are the teacher's."""
    valid = batch["position_mask"]
    start, end = _masked(out.start_logits, valid), _masked(out.end_logits, valid)
    teacher_start, teacher_end = _masked(batch["teacher_start"], valid), _masked(batch["teacher_end"], valid)
    hard = (hard_label_loss(start, batch["start_positions"]) + hard_label_loss(end, batch["end_positions"])) / 2
    with torch.no_grad():
        agree = ((start.argmax(-1) == teacher_start.argmax(-1)).sum()
                 + (end.argmax(-1) == teacher_end.argmax(-1)).sum())
        metrics = {"teacher_agreement": (agree.float() / 2, len(valid))}  # windows: mean of start and end

    def soft() -> torch.Tensor:
        return (soft_target_loss(start, teacher_start, temperature)
                + soft_target_loss(end, teacher_end, temperature)) / 2
    return soft, hard, metrics


def answer_step(temperature: float, alpha: float, labels_only: bool = False,
                intermediate: Callable[[], tuple[torch.nn.Module, IntermediateTransfer]] | None = None,
                intermediate_weight: float = 1.0):
    """The `step_fn` of an answer student (`distiller.distillation_step` over `answer_terms`)."""
    return distillation_step(functools.partial(answer_terms, temperature=temperature), alpha, labels_only,
                             intermediate, intermediate_weight)


def _count(batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Every window carries both terms (its gold position is [CLS] when the answer is elsewhere)."""
    return {"distill_loss": float(len(batch["input_ids"])), "label_loss": float(len(batch["input_ids"]))}


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


class AnswerAdaptor(Adaptor):
    """The answer family: the teacher's start and end logits per window, (N, S) with -inf outside [CLS] and
    the passage; the version and window settings from the teacher (`options`: version, doc_stride,
    tune_threshold); --unlabeled refused (a transfer example is a question with its passage)."""

    what = "answer start/end logits"
    teacher_task = "squad"

    def __init__(self, run: DistillRun) -> None:
        super().__init__(run)
        if run.unlabeled:
            raise ValueError("--unlabeled: an answer teacher's transfer set is question/passage pairs; give more "
                             "SQuAD-format questions in --train-file instead")
        config, teacher_dir = run.config, run.teacher_dir
        version, doc_stride = run.options.get("version"), run.options.get("doc_stride")
        self.tune_threshold = tune_threshold = run.options.get("tune_threshold")
        self.resolved = resolved = teacher_version(config, version)
        self.v2 = v2 = resolved == "2.0"
        if tune_threshold and not v2:
            raise ValueError(f"--tune-threshold chooses the no-answer threshold of SQuAD 2.0; {teacher_dir} answers "
                             f"SQuAD {resolved}")
        if tune_threshold and run.dev_file is None:
            raise ValueError("--tune-threshold chooses the no-answer threshold on dev: give --dev-file")
        stored = config.extra.get("squad") or {}
        known = set(vars(SquadSettings()))
        values = {k: v for k, v in stored.items() if k in known}
        values["max_seq_length"] = run.max_seq_length or values.get("max_seq_length", ANSWER_RECIPE["max_seq_length"])
        if doc_stride is not None:
            values["doc_stride"] = doc_stride
        self.settings = settings = SquadSettings(**values)
        settings.check(flags=True)
        self.tokenizer = tokenizer = BertTokenizer.from_pretrained(teacher_dir)
        self.pad_id = self.teacher_pad_id = tokenizer.pad_token_id
        self.train = train = read_squad_file(run.train_file)
        self.dev = dev = read_squad_file(run.dev_file) if run.dev_file is not None else None
        for data in (train, dev):
            impossible = next((e for e in data.examples if e.is_impossible), None) if data is not None else None
            if impossible is not None and not v2:
                raise ValueError(f"{data.path}: question {impossible.qas_id} is unanswerable (is_impossible) but the "
                                 "teacher answers SQuAD 1.1")
        train_features = convert_examples_to_features(train.examples, tokenizer, settings, is_training=True)
        check_alignment(train_features.skipped, train.examples, train.path)
        self.features = self.teacher_features = features = [
            {**{k: f[k] for k in ("input_ids", "token_type_ids", "start_position", "end_position")}, "index": i}
            for i, f in enumerate(train_features.features)]
        self.dev_features = dev_features = \
            convert_examples_to_features(dev.examples, tokenizer, settings) if dev is not None else None
        if dev is not None:
            self.teacher_dev_features = dev_features.features
        self.name = name = "squad_v2" if v2 else "squad"
        logger.info("distilling SQuAD %s: %d training questions -> %d windows (%d skipped)%s", resolved,
                    len(train.examples), len(features), len(train_features.skipped),
                    f"; {len(dev.examples)} dev questions -> {len(dev_features.features)} windows" if dev else "")
        self.head_overrides = dict(finetuning_task=name, version_2_with_negative=v2)
        self.main_metric = "f1" if dev is not None else "teacher_agreement"
        if dev is not None:
            self.write_predictions = lambda directory, value: write_squad_predictions(directory, *value)

    def compute(self, teacher, rows: Sequence[dict]) -> dict[str, np.ndarray]:
        return teacher_logits(teacher, rows, self.run.eval_batch_size, self.pad_id)

    def received(self, outputs, dev_outputs):
        self.logits, self.dev_logits = outputs, dev_outputs
        if self.dev is None:
            return None
        rows = [(np.asarray(dev_outputs["start_logits"][k, :len(f["input_ids"])]),
                 np.asarray(dev_outputs["end_logits"][k, :len(f["input_ids"])]))
                for k, f in enumerate(self.dev_features.features)]
        return self.answers(rows)[1]

    def answers(self, window_logits: Sequence[tuple[np.ndarray, np.ndarray]], tuned_model=None):
        """(predictions, metrics, the official script's output) on dev; with `tuned_model`, at the threshold
        that maximises dev F1, kept in that model's config (`keep_tuned_threshold`), else the teacher's."""
        settings, dev = self.settings, self.dev
        predictions = postprocess(dev.examples, self.dev_features, window_logits, n_best_size=settings.n_best_size,
                                  max_answer_length=settings.max_answer_length, version_2_with_negative=self.v2,
                                  null_score_diff_threshold=settings.null_score_diff_threshold)
        if not self.v2:
            return predictions, squad_metrics(dev.dataset, predictions.predictions, self.resolved), \
                evaluate_v1(dev.dataset, predictions.predictions)
        if tuned_model is not None:
            predictions = keep_tuned_threshold(tuned_model, dev.dataset, predictions)
        metrics = squad_metrics(dev.dataset, predictions.predictions, self.resolved, predictions.null_odds)
        metrics["null_score_diff_threshold"] = predictions.null_score_diff_threshold
        return predictions, metrics, evaluate_v2(dev.dataset, predictions.predictions, predictions.null_odds)

    def after_build(self, model) -> None:
        model.config.extra.update(finetuning_task=self.name, version_2_with_negative=self.v2,
                                  squad=vars(self.settings).copy())

    def collate(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        batch = collate(rows, self.pad_id)
        index, width = [r["index"] for r in rows], batch["input_ids"].shape[1]
        for which in ("start", "end"):
            batch[f"teacher_{which}"] = torch.from_numpy(
                np.asarray(self.logits[f"{which}_logits"][index, :width], dtype=np.float32))
        batch["position_mask"] = position_mask(batch["token_type_ids"], batch["attention_mask"])
        return batch

    def terms(self, out, batch: dict[str, torch.Tensor]) -> Terms:
        return answer_terms(out, batch, self.run.temperature)

    def count(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        return _count(batch)

    def evaluate(self, model):
        batch_size = self.run.eval_batch_size
        if self.dev is None:
            window_logits = predict_logits(model, self.features, batch_size, self.pad_id)
            return _agreement(window_logits, self.logits, self.features), None
        rows = self.dev_features.features
        window_logits = predict_logits(model, rows, batch_size, self.pad_id)
        predictions, metrics, official = self.answers(window_logits, model if self.tune_threshold else None)
        metrics.update(_agreement(window_logits, self.dev_logits, rows))
        return metrics, (predictions, official)

    def info(self) -> dict[str, Any]:
        return {"version": self.resolved, "squad": vars(self.settings), "tune_threshold": bool(self.tune_threshold),
                "transfer_examples": len(self.train.examples), "transfer_windows": len(self.features)}


def _agreement(window_logits, target: dict[str, np.ndarray], rows: Sequence[dict]) -> dict[str, float]:
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
