"""SQuAD postprocessing: from start/end logits to answers, the v2.0 null threshold, the output files.

`postprocess` is Google's `write_predictions` (see `bertforge.tasks.answer` for the whole flow);
`finite` / `json_text` write strict JSON (no Infinity or NaN).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .._files import write_text_atomic
from ..metrics.squad import _raw_scores, find_best_thresh
from .arrays import softmax
from .squad_data import SquadExample, SquadFeatures
from .windows import max_context_window

__all__ = ["SquadPredictions", "finite", "json_text", "postprocess", "tune_null_threshold", "write_squad_predictions"]


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
    """The n-best list's probabilities, in float64 (written to nbest_predictions.json)."""
    return softmax(scores, dtype=np.float64).tolist() if len(scores) else []


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
        write_text_atomic(output_dir / name, json.dumps(value, indent=2, ensure_ascii=False) + "\n")

    dump("predictions.json", predictions.predictions)
    dump("nbest_predictions.json", predictions.nbest)
    if predictions.null_odds:
        dump("null_odds.json", predictions.null_odds)
    if official is not None:
        dump("squad_eval.json", official)


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
