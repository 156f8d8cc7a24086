"""SQuAD exact match and F1, exactly as the official evaluation scripts compute them.

* `evaluate_v1(dataset, predictions)` is `evaluate-v1.1.py`: `{"exact_match", "f1"}`.
* `evaluate_v2(dataset, predictions, na_probs)` is `evaluate-v2.0.py`: `exact`, `f1`, `total`,
  `HasAns_*`, `NoAns_*` and, given the no-answer probabilities (`null_odds.json`), `best_exact`,
  `best_exact_thresh`, `best_f1`, `best_f1_thresh`.

Both return the official scripts' numbers on the official **percentage** scale (0-100), key for
key, so that they can be compared with published results as they are. `as_fractions` turns them
into the 0-1 fractions that `eval_results.json` holds for every fine-tuning task (`squad_metrics`
does both and names the fields as `eval_results.json` does: `exact_match` and `f1` for both
versions).

`dataset` is the `data` list of an official JSON file (articles with `paragraphs` and `qas`);
`predictions` maps a question id to its answer text ("" = no answer).

The two scripts differ in small ways that are kept here on purpose:
* v1.1 counts a question without a prediction in the total (it scores 0); v2.0 cannot score a file
  with one missing (the script dies with a KeyError; here a ValueError names the questions).
* v1.1 scores an empty prediction against an empty gold answer as F1 0; v2.0 as 1 (both "no answer").
* v2.0 drops gold answers that normalise to "" and uses [""] when none is left (unanswerable).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Any, Iterable, Mapping

__all__ = ["as_fractions", "compute_exact", "compute_f1", "evaluate_v1", "evaluate_v2", "exact_match_score",
           "f1_score", "find_best_thresh", "normalize_answer", "squad_metrics"]

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)

# Which fields of the official results are scores (scaled 0-100) rather than counts or thresholds.
_PERCENT_FIELDS = ("exact_match", "exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1",
                   "best_exact", "best_f1")


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation (ASCII `string.punctuation`), then the articles a/an/the, and
    collapse whitespace; the official order of the steps."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _qas(dataset: Iterable[Mapping[str, Any]]):
    for article in dataset:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


# ---------------------------------------------------------------------------- v1.1

def f1_score(prediction: str, ground_truth: str) -> float:
    """Token-overlap F1 of evaluate-v1.1.py (0 when nothing is shared, including both empty)."""
    prediction_tokens = normalize_answer(prediction).split()
    ground_truth_tokens = normalize_answer(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def exact_match_score(prediction: str, ground_truth: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def evaluate_v1(dataset: Iterable[Mapping[str, Any]], predictions: Mapping[str, str]) -> dict[str, float]:
    """evaluate-v1.1.py: `{"exact_match", "f1"}` in percent, the max over each question's gold
    answers, averaged over every question of `dataset` (a missing prediction scores 0)."""
    exact_match = f1 = 0.0
    total = 0
    for qa in _qas(dataset):
        total += 1
        if qa["id"] not in predictions:
            continue
        ground_truths = [answer["text"] for answer in qa["answers"]]
        prediction = predictions[qa["id"]]
        # max() of an empty list raises in the official script too: a v1.1 question has answers.
        exact_match += max(exact_match_score(prediction, truth) for truth in ground_truths)
        f1 += max(f1_score(prediction, truth) for truth in ground_truths)
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


# ---------------------------------------------------------------------------- v2.0

def _get_tokens(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def compute_exact(a_gold: str, a_pred: str) -> int:
    return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold: str, a_pred: str) -> float:
    """Token-overlap F1 of evaluate-v2.0.py: when either side is empty (no answer) it is 1 if both
    are, else 0."""
    gold_toks, pred_toks = _get_tokens(a_gold), _get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def _raw_scores(dataset, predictions: Mapping[str, str]) -> tuple[dict[str, int], dict[str, float]]:
    exact, f1 = {}, {}
    for qa in _qas(dataset):
        qid = qa["id"]
        gold_answers = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])]
        if not gold_answers:
            gold_answers = [""]  # unanswerable: the only correct answer is the empty string
        if qid not in predictions:
            continue
        prediction = predictions[qid]
        exact[qid] = max(compute_exact(a, prediction) for a in gold_answers)
        f1[qid] = max(compute_f1(a, prediction) for a in gold_answers)
    return exact, f1


def _apply_no_ans_threshold(scores, na_probs, qid_to_has_ans, na_prob_thresh):
    return {qid: float(not qid_to_has_ans[qid]) if na_probs[qid] > na_prob_thresh else s
            for qid, s in scores.items()}


def _eval_dict(exact, f1, qid_list=None) -> dict[str, float]:
    if not qid_list:
        total = len(exact)
        return {"exact": 100.0 * sum(exact.values()) / total, "f1": 100.0 * sum(f1.values()) / total,
                "total": total}
    total = len(qid_list)
    return {"exact": 100.0 * sum(exact[k] for k in qid_list) / total,
            "f1": 100.0 * sum(f1[k] for k in qid_list) / total, "total": total}


def find_best_thresh(predictions: Mapping[str, str], scores: Mapping[str, float], na_probs: Mapping[str, float],
                     qid_to_has_ans: Mapping[str, bool]) -> tuple[float, float]:
    """The no-answer threshold that maximises a score (evaluate-v2.0.py's `find_best_thresh`).

    Start from "every question unanswered" and, in increasing order of `na_probs`, answer one
    question more at a time; keep the best total. Returns (best score in percent, threshold): a
    question is answered when its `na_probs` value is <= the threshold.
    """
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = best_score = num_no_ans
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if predictions[qid] else 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def evaluate_v2(dataset: Iterable[Mapping[str, Any]], predictions: Mapping[str, str],
                na_probs: Mapping[str, float] | None = None, na_prob_thresh: float = 1.0) -> dict[str, float]:
    """evaluate-v2.0.py's output dict (percent): `exact`, `f1`, `total`, `HasAns_exact`, `HasAns_f1`,
    `HasAns_total`, `NoAns_exact`, `NoAns_f1`, `NoAns_total` and, with `na_probs` (the script's
    `--na-prob-file`, e.g. our null_odds.json), `best_exact`, `best_exact_thresh`, `best_f1`,
    `best_f1_thresh`. A question whose `na_probs` value exceeds `na_prob_thresh` counts as
    answered "no answer" whatever its prediction (the script's `--na-prob-thresh`, default 1.0).
    """
    dataset = list(dataset)
    has_na_probs = na_probs is not None
    if na_probs is None:
        na_probs = {k: 0.0 for k in predictions}
    qid_to_has_ans = {qa["id"]: bool(qa["answers"]) for qa in _qas(dataset)}
    missing = [qid for qid in qid_to_has_ans if qid not in predictions]
    if missing:  # the official script dies on these with a KeyError
        raise ValueError(f"no prediction for {len(missing)} of {len(qid_to_has_ans)} questions "
                         f"(evaluate-v2.0.py needs one for every question): {', '.join(missing[:5])}"
                         f"{' ...' if len(missing) > 5 else ''}")
    has_ans_qids = [k for k, v in qid_to_has_ans.items() if v]
    no_ans_qids = [k for k, v in qid_to_has_ans.items() if not v]
    exact_raw, f1_raw = _raw_scores(dataset, predictions)
    exact_thresh = _apply_no_ans_threshold(exact_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    f1_thresh = _apply_no_ans_threshold(f1_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    out = _eval_dict(exact_thresh, f1_thresh)
    if has_ans_qids:
        out.update({f"HasAns_{k}": v for k, v in _eval_dict(exact_thresh, f1_thresh, has_ans_qids).items()})
    if no_ans_qids:
        out.update({f"NoAns_{k}": v for k, v in _eval_dict(exact_thresh, f1_thresh, no_ans_qids).items()})
    if has_na_probs:
        out["best_exact"], out["best_exact_thresh"] = find_best_thresh(predictions, exact_raw, na_probs, qid_to_has_ans)
        out["best_f1"], out["best_f1_thresh"] = find_best_thresh(predictions, f1_raw, na_probs, qid_to_has_ans)
    return out


# ---------------------------------------------------------------------------- for eval_results.json

def as_fractions(results: Mapping[str, float]) -> dict[str, float]:
    """The official results with every score divided by 100 (0-1, as eval_results.json holds);
    counts (`total`, ...) and thresholds are left as they are."""
    return {k: v / 100.0 if k in _PERCENT_FIELDS else v for k, v in results.items()}


def squad_metrics(dataset: Iterable[Mapping[str, Any]], predictions: Mapping[str, str], version: str,
                  na_probs: Mapping[str, float] | None = None) -> dict[str, float]:
    """The metrics `bertforge finetune squad` records, as fractions: `exact_match` and `f1` for both
    versions; for 2.0 also `HasAns_exact`, `HasAns_f1`, `NoAns_exact`, `NoAns_f1` and, with
    `na_probs`, `best_exact`, `best_f1` and their thresholds. The counts stay out (they are not
    averaged across seeds); `evaluate_v1`/`evaluate_v2` give the official dicts in percent."""
    if version == "1.1":
        return as_fractions(evaluate_v1(dataset, predictions))
    if version != "2.0":
        raise ValueError(f"SQuAD version must be '1.1' or '2.0', got {version!r}")
    official = as_fractions(evaluate_v2(dataset, predictions, na_probs))
    metrics = {"exact_match": official.pop("exact"), "f1": official.pop("f1")}
    metrics.update({k: v for k, v in official.items() if not k.endswith("total")})
    return metrics
