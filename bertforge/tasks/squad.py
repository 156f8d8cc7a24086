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
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .._files import read_text, write_text_atomic
from .classification import pad_batch
from .windows import max_context_window, windows

logger = logging.getLogger("bertforge")

__all__ = ["SquadExample", "SquadFeatures", "SquadFile", "SquadPredictions", "SquadSettings", "answer_questions",
           "collate", "convert_examples_to_features", "postprocess", "predict_logits", "predict_squad_file",
           "read_squad_file", "squad_task", "write_squad_predictions"]

VERSIONS = ("1.1", "2.0")


@dataclass
class SquadSettings:
    """Google's `run_squad.py` flags, with its defaults. Saved with a fine-tuned model (config.json
    key "squad") so that prediction uses what training used."""

    max_seq_length: int = 384  # tokens per window, specials included
    doc_stride: int = 128  # tokens between the starts of consecutive passage windows
    max_query_length: int = 64  # question tokens kept
    n_best_size: int = 20  # candidate starts/ends per window, and entries of the n-best list
    max_answer_length: int = 30  # tokens in an answer span
    null_score_diff_threshold: float = 0.0  # v2.0: answer "" when null score - best span score > this

    def check(self, flags: bool = False) -> None:
        """ValueError for settings that cannot work, naming the field (`flags`: as the CLI's --flag)."""
        def name(field_name: str) -> str:
            return "--" + field_name.replace("_", "-") if flags else field_name

        for field_name in ("max_seq_length", "doc_stride", "max_query_length", "n_best_size", "max_answer_length"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{name(field_name)} must be at least 1, got {getattr(self, field_name)}")
        if self.max_seq_length <= self.max_query_length + 3:
            raise ValueError(f"{name('max_seq_length')} ({self.max_seq_length}) must exceed {name('max_query_length')} "
                             f"({self.max_query_length}) + 3 ([CLS] and two [SEP]) to leave room for the passage")
        # A stride as long as a window's passage part leaves no overlap: an answer across the boundary
        # of two windows would be wholly in neither.
        window = self.max_seq_length - self.max_query_length - 3
        if self.doc_stride >= window:
            raise ValueError(f"{name('doc_stride')} ({self.doc_stride}) must be less than {name('max_seq_length')} - "
                             f"{name('max_query_length')} - 3 = {window} (the passage tokens of a window) so that "
                             f"windows overlap, e.g. {name('doc_stride')} {max(1, window // 2)}")


# ---------------------------------------------------------------------------- reading

@dataclass
class SquadExample:
    """One question. `answers` are the gold (text, answer_start) pairs, empty when unanswerable;
    the first one is the training target (as Hugging Face's run_qa; Google's demands exactly one)."""

    qas_id: str
    question: str
    context: str
    answers: list[tuple[str, int]] = field(default_factory=list)
    is_impossible: bool = False
    title: str = ""
    paragraph: int = 0  # index of its paragraph in the file: the questions of a paragraph share its tokens


@dataclass
class SquadFile:
    """A read SQuAD file: its examples, the `data` list itself (what the official metrics read) and
    the file's `version` field."""

    path: Path
    examples: list[SquadExample]
    dataset: list[dict]
    version: str | None = None

    @property
    def num_answerable(self) -> int:
        return sum(not e.is_impossible for e in self.examples)


def read_squad_file(path: str | os.PathLike, require_answers: bool = True) -> SquadFile:
    """Read an official SQuAD JSON file (v1.1 or v2.0 layout); errors name the file and question.

    With `require_answers` (training and evaluation data) a question needs answers or
    `is_impossible: true`; without, unlabelled questions are read too (for prediction).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SQuAD file not found: {path}")
    try:
        root = json.loads(read_text(path))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: not a JSON file ({error})") from None
    if not isinstance(root, dict) or not isinstance(root.get("data"), list):
        raise ValueError(f"{path}: not a SQuAD file (expected {{\"version\": ..., \"data\": [articles]}})")
    examples: list[SquadExample] = []
    seen: set[str] = set()
    paragraph_index = 0
    for a, article in enumerate(root["data"]):
        title = article.get("title", "") if isinstance(article, dict) else ""
        where = f"{path}: data[{a}] ({title!r})"
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise ValueError(f"{where}: an article needs a list of 'paragraphs'")
        for p, paragraph in enumerate(article["paragraphs"]):
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("context"), str) \
                    or not isinstance(paragraph.get("qas"), list):
                raise ValueError(f"{where}, paragraphs[{p}]: a paragraph needs a 'context' string and a 'qas' list")
            context = paragraph["context"]
            for q, qa in enumerate(paragraph["qas"]):
                qid = qa.get("id") if isinstance(qa, dict) else None
                if not isinstance(qid, str) or not qid:
                    raise ValueError(f"{where}, paragraphs[{p}], qas[{q}]: no question 'id' (a string)")
                where_q = f"{path}: question {qid}"
                if qid in seen:
                    raise ValueError(f"{where_q}: the id appears twice")
                seen.add(qid)
                if not isinstance(qa.get("question"), str):
                    raise ValueError(f"{where_q}: no 'question' text")
                answers = qa.get("answers", [])
                impossible = qa.get("is_impossible", False)
                if not isinstance(answers, list) or not isinstance(impossible, bool):
                    raise ValueError(f"{where_q}: 'answers' must be a list and 'is_impossible' true or false")
                gold = []
                for answer in answers:
                    if not isinstance(answer, dict) or not isinstance(answer.get("text"), str) \
                            or isinstance(answer.get("answer_start"), bool) \
                            or not isinstance(answer.get("answer_start"), int):
                        raise ValueError(f"{where_q}: an answer needs 'text' (string) and 'answer_start' (integer), "
                                         f"got {answer!r}")
                    gold.append((answer["text"], answer["answer_start"]))
                if impossible and gold:
                    raise ValueError(f"{where_q}: is_impossible is true but it has answers "
                                     f"(an unanswerable question's spans belong in 'plausible_answers')")
                if require_answers and not impossible and not gold:
                    raise ValueError(f"{where_q}: no answers and not marked is_impossible")
                examples.append(SquadExample(qid, qa["question"], context, gold, impossible, title, paragraph_index))
            paragraph_index += 1
    if not examples:
        raise ValueError(f"{path}: no questions (its 'data' holds no article with a question)")
    return SquadFile(path, examples, root["data"], root.get("version"))


# ---------------------------------------------------------------------------- features

@dataclass
class SquadFeatures:
    """Model rows and what postprocessing needs to map their outputs back to the passages.

    `features[k]` is a dict: `input_ids`, `token_type_ids` (lists, unpadded, `[CLS] Q [SEP] window
    [SEP]`), `example_index`, `window_index` and `context_offset` (position of the window's first
    passage token in `input_ids`), and for training `start_position`/`end_position` (0 = [CLS]).
    For example i: `offsets[i]` are the [start, end) character spans of its passage's tokens,
    `spans[i]` its windows as [start, end) passage-token indices. `skipped` lists the training
    questions left out as (id, reason).
    """

    features: list[dict]
    offsets: list[list[tuple[int, int]]]
    spans: list[list[tuple[int, int]]]
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def lengths(self) -> list[int]:
        return [len(f["input_ids"]) for f in self.features]


def _strip_specials(rows: list[dict], key: str) -> list[list]:
    return [row[key][1:-1] for row in rows]


def _answer_tokens(example: SquadExample, offsets: Sequence[tuple[int, int]], ends: list[int],
                   starts: list[int]) -> tuple[int, int] | str:
    """The [first, last] passage-token indices of the example's first answer, or why it cannot be
    aligned."""
    text, start_char = example.answers[0]
    end_char = start_char + len(text)
    if not text.strip():
        return "empty answer text"
    if start_char < 0 or end_char > len(example.context) or example.context[start_char:end_char] != text:
        found = example.context[max(0, start_char):max(0, end_char)]
        return f"answer {text!r} is not at answer_start {start_char} (the passage has {found!r} there)"
    first = bisect.bisect_right(ends, start_char)  # the first token ending after the answer starts
    last = bisect.bisect_left(starts, end_char) - 1  # the last token starting before it ends
    if first >= len(offsets) or last < first:
        return f"no token covers answer {text!r} at characters [{start_char}, {end_char})"
    return first, last


def convert_examples_to_features(examples: Sequence[SquadExample], tokenizer, settings: SquadSettings | None = None,
                                 is_training: bool = False) -> SquadFeatures:
    """Token rows for `examples` (see `SquadFeatures`).

    Each paragraph is tokenized once (its questions share it) and everything in one `encode_batch`
    call per kind, so a whole SQuAD dev file converts in seconds. With `is_training`, an example
    whose answer cannot be aligned is logged, listed in `skipped` and gets no feature.
    """
    settings = settings or SquadSettings()
    settings.check()
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    questions = _strip_specials(tokenizer.encode_batch(
        [e.question for e in examples], max_length=settings.max_query_length + 2, truncation="longest_first",
        padding=False), "input_ids")
    # One tokenization per distinct paragraph (index + text: two paragraphs may share a text).
    paragraph_of: dict[tuple[int, str], int] = {}
    for e in examples:
        paragraph_of.setdefault((e.paragraph, e.context), len(paragraph_of))
    rows = tokenizer.encode_batch([text for _, text in paragraph_of], truncation=False, padding=False,
                                  return_offsets=True)
    paragraph_ids = _strip_specials(rows, "input_ids")
    paragraph_offsets = [[tuple(o) for o in offsets] for offsets in _strip_specials(rows, "offsets")]
    paragraph_bounds = [([o[1] for o in offsets], [o[0] for o in offsets]) for offsets in paragraph_offsets]

    result = SquadFeatures([], [], [])
    for index, (example, question) in enumerate(zip(examples, questions)):
        p = paragraph_of[(example.paragraph, example.context)]
        ids, offsets = paragraph_ids[p], paragraph_offsets[p]
        spans = windows(len(ids), settings.max_seq_length - len(question) - 3, settings.doc_stride)
        result.offsets.append(offsets)
        result.spans.append(spans)
        answer = None
        if is_training and not example.is_impossible:
            answer = _answer_tokens(example, offsets, *paragraph_bounds[p])
            if isinstance(answer, str):
                result.skipped.append((example.qas_id, answer))
                continue
        context_offset = len(question) + 2
        head = [cls, *question, sep]
        for w, (start, end) in enumerate(spans):
            feature = {"input_ids": head + ids[start:end] + [sep],
                       "token_type_ids": [0] * context_offset + [1] * (end - start + 1),
                       "example_index": index, "window_index": w, "context_offset": context_offset}
            if is_training:
                if answer is not None and start <= answer[0] and answer[1] < end:
                    feature["start_position"] = context_offset + answer[0] - start
                    feature["end_position"] = context_offset + answer[1] - start
                else:  # unanswerable, or the answer is not (wholly) in this window: point at [CLS]
                    feature["start_position"] = feature["end_position"] = 0
            result.features.append(feature)
    if result.skipped:
        shown = "; ".join(f"{qid}: {why}" for qid, why in result.skipped[:5])
        logger.warning("skipped %d of %d training questions whose answer cannot be aligned (%s%s)",
                       len(result.skipped), len(examples), shown, " ..." if len(result.skipped) > 5 else "")
    return result


# Training questions whose answer may fail to align before the file is refused: the official files
# align all but a handful; a file past this share has wrong offsets (e.g. counted in bytes, or
# against another version of the passages) and would train on little or nothing.
MAX_UNALIGNED_FRACTION = 0.01


def check_alignment(skipped: Sequence[tuple[str, str]], examples: Sequence[SquadExample],
                    path: str | os.PathLike) -> None:
    """Refuse training data in which more than `MAX_UNALIGNED_FRACTION` of the answerable questions
    have an answer that cannot be found at its `answer_start`: ValueError naming the file, the count
    and the first few question ids with the reason."""
    answerable = sum(1 for e in examples if not e.is_impossible)
    if skipped and len(skipped) > MAX_UNALIGNED_FRACTION * answerable:
        shown = "; ".join(f"{qid}: {why}" for qid, why in skipped[:3])
        raise ValueError(f"{path}: {len(skipped)} of {answerable} answers cannot be aligned with their passage "
                         f"(more than {MAX_UNALIGNED_FRACTION:.0%}); first: {shown}")


def collate(features: Sequence[dict], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """A batch padded to its longest row: `input_ids`, `token_type_ids`, `attention_mask` (B, S) int64,
    and for training rows `start_positions`, `end_positions` (B,) int64."""
    batch = pad_batch(features, pad_token_id)
    if "start_position" in features[0]:
        batch["start_positions"] = torch.tensor([f["start_position"] for f in features], dtype=torch.long)
        batch["end_positions"] = torch.tensor([f["end_position"] for f in features], dtype=torch.long)
    return batch


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
    was_training = model.training
    model.eval()
    try:
        for begin in range(0, len(order), batch_size):
            rows = order[begin:begin + batch_size]
            batch = collate([{"input_ids": features[i]["input_ids"], "token_type_ids": features[i]["token_type_ids"]}
                             for i in rows], pad_token_id)
            out = model(**{k: v.to(device) for k, v in batch.items()})
            starts, ends = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
            for row, i in enumerate(rows):
                n = len(features[i]["input_ids"])
                results[i] = (starts[row, :n], ends[row, :n])
    finally:
        model.train(was_training)
    return results


# ---------------------------------------------------------------------------- prediction

@dataclass
class SquadPredictions:
    """What postprocessing gives, keyed by question id: the answer text ("" = no answer), the n-best
    list (dicts `text`, `probability`, `start_logit`, `end_logit`, `start`, `end` with character
    offsets, None for the null answer), and for v2.0 `null_odds` (null score - best span score;
    the official v2.0 script's `--na-prob-file`). `best_span` is each question's best non-null
    answer whatever the threshold (for choosing it)."""

    predictions: dict[str, str]
    nbest: dict[str, list[dict]]
    null_odds: dict[str, float] = field(default_factory=dict)
    best_span: dict[str, str] = field(default_factory=dict)
    null_score_diff_threshold: float | None = None

    def with_threshold(self, threshold: float) -> "SquadPredictions":
        """The v2.0 predictions for another null-score threshold τ."""
        predictions = {qid: "" if self.null_odds[qid] > threshold else self.best_span[qid] for qid in self.predictions}
        return SquadPredictions(predictions, self.nbest, self.null_odds, self.best_span, threshold)


def _softmax(scores: Sequence[float]) -> list[float]:
    if not scores:
        return []
    values = np.asarray(scores, dtype=np.float64)
    values = np.exp(values - values.max())
    return (values / values.sum()).tolist()


def postprocess(examples: Sequence[SquadExample], features: SquadFeatures,
                logits: Sequence[tuple[np.ndarray, np.ndarray]], *, n_best_size: int = 20,
                max_answer_length: int = 30, version_2_with_negative: bool = False,
                null_score_diff_threshold: float = 0.0) -> SquadPredictions:
    """Answers from the windows' start/end logits, as Google's `write_predictions` (see the module
    docstring). `logits[k]` belongs to `features.features[k]`."""
    by_example: dict[int, list[int]] = {}
    for k, feature in enumerate(features.features):
        by_example.setdefault(feature["example_index"], []).append(k)
    result = SquadPredictions({}, {})
    for index, example in enumerate(examples):
        offsets, spans = features.offsets[index], features.spans[index]
        candidates = []  # (score, start logit, end logit, start char, end char), in Google's order
        null = None  # (score, start logit, end logit): the lowest [CLS] score over the windows
        for k in by_example.get(index, []):
            feature = features.features[k]
            start_logits, end_logits = logits[k]
            if version_2_with_negative:
                score = float(start_logits[0] + end_logits[0])
                if null is None or score < null[0]:
                    null = (score, float(start_logits[0]), float(end_logits[0]))
            window = feature["window_index"]
            window_start, window_end = spans[window]
            first = feature["context_offset"]
            last = first + (window_end - window_start) - 1  # the window's last passage token in the row
            # The n best starts and ends over the whole row (question included), then filtered: Google's way.
            top_starts = np.argsort(-start_logits, kind="stable")[:n_best_size]
            top_ends = np.argsort(-end_logits, kind="stable")[:n_best_size]
            s, e = top_starts[:, None], top_ends[None, :]
            valid = (s >= first) & (s <= last) & (e >= first) & (e <= last) & (e >= s) & (e - s + 1 <= max_answer_length)
            for i, j in zip(*np.nonzero(valid)):
                start, end = int(top_starts[i]), int(top_ends[j])
                token = window_start + start - first
                if len(spans) > 1 and max_context_window(token, spans) != window:
                    continue  # scored in the window where this start token has more context
                candidates.append((float(start_logits[start] + end_logits[end]), float(start_logits[start]),
                                   float(end_logits[end]), offsets[token][0], offsets[window_start + end - first][1]))
        if null is not None:
            candidates.append((null[0], null[1], null[2], None, None))
        candidates.sort(key=lambda c: c[0], reverse=True)  # stable: ties keep Google's order
        nbest, seen = [], set()
        for score, start_logit, end_logit, start, end in candidates:
            if len(nbest) >= n_best_size:
                break
            text = "" if start is None else example.context[start:end]
            if text in seen:
                continue
            seen.add(text)
            nbest.append({"text": text, "start_logit": start_logit, "end_logit": end_logit, "start": start, "end": end})
        if null is not None and "" not in seen:  # v2.0: the null answer is always in the list
            nbest.append({"text": "", "start_logit": null[1], "end_logit": null[2], "start": None, "end": None})
        if not nbest:  # no valid span at all (Google writes the nonce "empty"; "" is what no answer means)
            nbest.append({"text": "", "start_logit": 0.0, "end_logit": 0.0, "start": None, "end": None})
        for entry, probability in zip(nbest, _softmax([n["start_logit"] + n["end_logit"] for n in nbest])):
            entry["probability"] = probability
        qid = example.qas_id
        result.nbest[qid] = [{k: n[k] for k in ("text", "probability", "start_logit", "end_logit", "start", "end")}
                             for n in nbest]
        best_span = next((n for n in nbest if n["text"]), None)
        result.best_span[qid] = best_span["text"] if best_span else ""
        if not version_2_with_negative:
            result.predictions[qid] = nbest[0]["text"]
            continue
        # No span at all: infinitely more likely unanswerable.
        odds = null[0] - (best_span["start_logit"] + best_span["end_logit"]) if best_span else math.inf
        result.null_odds[qid] = odds
        result.predictions[qid] = "" if odds > null_score_diff_threshold else result.best_span[qid]
    if version_2_with_negative:
        result.null_score_diff_threshold = null_score_diff_threshold
    return result


def tune_null_threshold(dataset: list[dict], predictions: SquadPredictions) -> float:
    """A τ that maximises F1 on `dataset`: it takes the decisions of evaluate-v2.0.py's `best_f1_thresh`
    (computed on the best non-null spans so that every threshold is scored exactly), with a margin.

    The official threshold is the null-odds of the last question it answers, so that question sits
    exactly on it: scored a rounding error higher at prediction time (another batch size, another
    CPU's kernels) it would flip to no-answer. τ is the midpoint between that value and the next
    larger null-odds on `dataset`, which makes the same decisions on it."""
    from ..metrics.squad import _raw_scores, find_best_thresh

    _, f1_raw = _raw_scores(dataset, predictions.best_span)
    has_answer = {qa["id"]: bool(qa["answers"]) for article in dataset for p in article["paragraphs"]
                  for qa in p["qas"]}
    odds = {qid: value for qid, value in predictions.null_odds.items() if qid in f1_raw}
    best = float(find_best_thresh(predictions.best_span, f1_raw, odds, has_answer)[1])
    above = [value for value in odds.values() if value > best]
    return (best + min(above)) / 2 if above else best


def write_squad_predictions(output_dir: str | os.PathLike, predictions: SquadPredictions,
                            official: dict[str, Any] | None = None) -> None:
    """`predictions.json` ({id: text}), `nbest_predictions.json`, for v2.0 `null_odds.json`, and with
    `official` the official script's results (percent) as `squad_eval.json`."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    def dump(name: str, value: Any) -> None:
        (output_dir / name).write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    dump("predictions.json", predictions.predictions)
    dump("nbest_predictions.json", predictions.nbest)
    if predictions.null_odds:
        dump("null_odds.json", predictions.null_odds)
    if official is not None:
        dump("squad_eval.json", official)


# ---------------------------------------------------------------------------- the fine-tuning task

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
    from ..metrics.squad import evaluate_v1, evaluate_v2, squad_metrics
    from ..modeling import BertForQuestionAnswering
    from ..modeling.pretrained import resolve_model_dir
    from ..tokenization import BertTokenizer
    from ..training.finetune import FinetuneTask

    if version not in VERSIONS:
        raise ValueError(f"SQuAD version must be one of {VERSIONS}, got {version!r}")
    settings = settings or SquadSettings()
    settings.check()
    v2 = version == "2.0"
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
            predictions = predictions.with_threshold(tune_null_threshold(dev.dataset, predictions))
            # The chosen τ is part of the model: `bertforge predict` reads it back.
            config = model.config
            config.extra["squad"] = {**config.extra.get("squad", {}),
                                     "null_score_diff_threshold": predictions.null_score_diff_threshold}
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

def finite(value: Any) -> Any:
    """`value` with every non-finite float (a null-odds of infinity: no span at all) replaced by None,
    through dicts and lists: JSON has no Infinity or NaN, and a strict parser rejects them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_text(value: Any, indent: int | None = 2) -> str:
    """Strict JSON of `value` (non-finite floats as null, see `finite`), with a final newline when indented."""
    text = json.dumps(finite(value), indent=indent, ensure_ascii=False, allow_nan=False)
    return text + "\n" if indent is not None else text


def _load(model_dir: str | os.PathLike, overrides: dict[str, Any], dtype: str | None = None):
    from ..modeling import BertConfig, BertForQuestionAnswering, load_for_inference
    from ..modeling.pretrained import resolve_model_dir
    from ..tokenization import BertTokenizer

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
    from ..metrics.squad import evaluate_v1, evaluate_v2

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
