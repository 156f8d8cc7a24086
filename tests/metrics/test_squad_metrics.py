"""SQuAD EM/F1 against the official evaluation scripts.

The oracle below is the official `evaluate-v1.1.py` and `evaluate-v2.0.py` logic, copied function for
function (file handling and printing left out), so that `bertforge.metrics.squad` is checked against
the algorithm the leaderboard uses rather than against itself; a few values are also worked out by
hand.
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections import Counter

import pytest

from bertforge.metrics.squad import (as_fractions, compute_f1, evaluate_v1, evaluate_v2, f1_score,
                                     normalize_answer, squad_metrics)

# ============================================================================ the official scripts
# ---------------------------------------------------------------------------- evaluate-v1.1.py


def v1_normalize_answer(s):
    """Lower text and remove punctuation, articles and extra whitespace."""
    def remove_articles(text):
        return re.sub(r'\b(a|an|the)\b', ' ', text)

    def white_space_fix(text):
        return ' '.join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return ''.join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def v1_f1_score(prediction, ground_truth):
    prediction_tokens = v1_normalize_answer(prediction).split()
    ground_truth_tokens = v1_normalize_answer(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def v1_exact_match_score(prediction, ground_truth):
    return (v1_normalize_answer(prediction) == v1_normalize_answer(ground_truth))


def v1_metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    scores_for_ground_truths = []
    for ground_truth in ground_truths:
        score = metric_fn(prediction, ground_truth)
        scores_for_ground_truths.append(score)
    return max(scores_for_ground_truths)


def v1_evaluate(dataset, predictions):
    f1 = exact_match = total = 0
    for article in dataset:
        for paragraph in article['paragraphs']:
            for qa in paragraph['qas']:
                total += 1
                if qa['id'] not in predictions:
                    continue  # "Unanswered question ... will receive score 0."
                ground_truths = list(map(lambda x: x['text'], qa['answers']))
                prediction = predictions[qa['id']]
                exact_match += v1_metric_max_over_ground_truths(v1_exact_match_score, prediction, ground_truths)
                f1 += v1_metric_max_over_ground_truths(v1_f1_score, prediction, ground_truths)
    exact_match = 100.0 * exact_match / total
    f1 = 100.0 * f1 / total
    return {'exact_match': exact_match, 'f1': f1}


# ---------------------------------------------------------------------------- evaluate-v2.0.py


def make_qid_to_has_ans(dataset):
    qid_to_has_ans = {}
    for article in dataset:
        for p in article['paragraphs']:
            for qa in p['qas']:
                qid_to_has_ans[qa['id']] = bool(qa['answers'])
    return qid_to_has_ans


def normalize_answer_v2(s):
    """Lower text and remove punctuation, articles and extra whitespace."""
    def remove_articles(text):
        regex = re.compile(r'\b(a|an|the)\b', re.UNICODE)
        return re.sub(regex, ' ', text)

    def white_space_fix(text):
        return ' '.join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return ''.join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def get_tokens(s):
    if not s:
        return []
    return normalize_answer_v2(s).split()


def compute_exact_v2(a_gold, a_pred):
    return int(normalize_answer_v2(a_gold) == normalize_answer_v2(a_pred))


def compute_f1_v2(a_gold, a_pred):
    gold_toks = get_tokens(a_gold)
    pred_toks = get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        # If either is no-answer, then F1 is 1 if they agree, 0 otherwise
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def get_raw_scores(dataset, preds):
    exact_scores = {}
    f1_scores = {}
    for article in dataset:
        for p in article['paragraphs']:
            for qa in p['qas']:
                qid = qa['id']
                gold_answers = [a['text'] for a in qa['answers'] if normalize_answer_v2(a['text'])]
                if not gold_answers:
                    # For unanswerable questions, only correct answer is empty string
                    gold_answers = ['']
                if qid not in preds:
                    continue  # "Missing prediction for ..."
                a_pred = preds[qid]
                # Take max over all gold answers
                exact_scores[qid] = max(compute_exact_v2(a, a_pred) for a in gold_answers)
                f1_scores[qid] = max(compute_f1_v2(a, a_pred) for a in gold_answers)
    return exact_scores, f1_scores


def apply_no_ans_threshold(scores, na_probs, qid_to_has_ans, na_prob_thresh):
    new_scores = {}
    for qid, s in scores.items():
        pred_na = na_probs[qid] > na_prob_thresh
        if pred_na:
            new_scores[qid] = float(not qid_to_has_ans[qid])
        else:
            new_scores[qid] = s
    return new_scores


def make_eval_dict(exact_scores, f1_scores, qid_list=None):
    if not qid_list:
        total = len(exact_scores)
        return collections.OrderedDict([
            ('exact', 100.0 * sum(exact_scores.values()) / total),
            ('f1', 100.0 * sum(f1_scores.values()) / total),
            ('total', total),
        ])
    else:
        total = len(qid_list)
        return collections.OrderedDict([
            ('exact', 100.0 * sum(exact_scores[k] for k in qid_list) / total),
            ('f1', 100.0 * sum(f1_scores[k] for k in qid_list) / total),
            ('total', total),
        ])


def merge_eval(main_eval, new_eval, prefix):
    for k in new_eval:
        main_eval['%s_%s' % (prefix, k)] = new_eval[k]


def find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = num_no_ans
    best_score = cur_score
    best_thresh = 0.0
    qid_list = sorted(na_probs, key=lambda k: na_probs[k])
    for i, qid in enumerate(qid_list):
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            if preds[qid]:
                diff = -1
            else:
                diff = 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def find_all_best_thresh(main_eval, preds, exact_raw, f1_raw, na_probs, qid_to_has_ans):
    best_exact, exact_thresh = find_best_thresh(preds, exact_raw, na_probs, qid_to_has_ans)
    best_f1, f1_thresh = find_best_thresh(preds, f1_raw, na_probs, qid_to_has_ans)
    main_eval['best_exact'] = best_exact
    main_eval['best_exact_thresh'] = exact_thresh
    main_eval['best_f1'] = best_f1
    main_eval['best_f1_thresh'] = f1_thresh


def v2_evaluate(dataset, preds, na_probs=None, na_prob_thresh=1.0):
    """main() of evaluate-v2.0.py, minus the files: OPTS.na_prob_file given <=> na_probs is not None."""
    na_prob_file = na_probs is not None
    if not na_prob_file:
        na_probs = {k: 0.0 for k in preds}
    qid_to_has_ans = make_qid_to_has_ans(dataset)  # maps qid to True/False
    has_ans_qids = [k for k, v in qid_to_has_ans.items() if v]
    no_ans_qids = [k for k, v in qid_to_has_ans.items() if not v]
    exact_raw, f1_raw = get_raw_scores(dataset, preds)
    exact_thresh = apply_no_ans_threshold(exact_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    f1_thresh = apply_no_ans_threshold(f1_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    out_eval = make_eval_dict(exact_thresh, f1_thresh)
    if has_ans_qids:
        has_ans_eval = make_eval_dict(exact_thresh, f1_thresh, qid_list=has_ans_qids)
        merge_eval(out_eval, has_ans_eval, 'HasAns')
    if no_ans_qids:
        no_ans_eval = make_eval_dict(exact_thresh, f1_thresh, qid_list=no_ans_qids)
        merge_eval(out_eval, no_ans_eval, 'NoAns')
    if na_prob_file:
        find_all_best_thresh(out_eval, preds, exact_raw, f1_raw, na_probs, qid_to_has_ans)
    return dict(out_eval)


# ============================================================================ hand-made data


def _qa(qid, answers, impossible=False):
    return {"id": qid, "question": f"question {qid}?", "is_impossible": impossible,
            "answers": [{"text": t, "answer_start": 0} for t in answers]}


# Gold answers and predictions chosen for the normalisation's corners.
V1_CASES = [
    # (id, gold answers, prediction)
    ("case", ["Denver Broncos"], "denver broncos"),
    ("punct", ["Saint-Denis"], "SaintDenis"),  # punctuation removed, not replaced by a space
    ("punct-space", ["Saint-Denis"], "Saint Denis"),
    ("articles", ["the Eiffel Tower"], "Eiffel Tower"),
    ("article-inside-word", ["theory of a thesis"], "theory of thesis"),  # 'theory'/'thesis' keep 'the'
    ("an-article", ["an apple"], "apple."),
    ("whitespace", ["New   York\tCity"], " new york  city "),
    ("unicode-punct", ["1914–1918"], "1914 1918"),  # the en dash is not in string.punctuation
    ("curly-quote", ["Nature’s way"], "Natures way"),
    ("accent", ["Édouard"], "edouard"),  # lower-cased but accents kept: no match
    ("multi-gold", ["Barack Obama", "Obama", "President Obama"], "President Barack Obama"),
    ("partial", ["the cat sat on the mat"], "a cat on a mat"),
    ("repeats", ["yes yes no"], "yes yes yes"),  # Counter intersection: 2 shared, not 3
    ("zero", ["Paris"], "London"),
    ("empty-pred", ["Paris"], ""),
    ("only-article-pred", ["Paris"], "the"),
    ("gold-only-punct", ["?!"], "?"),  # both normalise to "": EM 1, F1 0 in v1.1
    ("number", ["$1.5 million"], "1.5 million"),
]


def v1_dataset():
    qas = [_qa(qid, gold) for qid, gold, _ in V1_CASES] + [_qa("missing", ["Rome"])]
    return [{"title": "A", "paragraphs": [{"context": "...", "qas": qas[:10]}]},
            {"title": "B", "paragraphs": [{"context": "...", "qas": qas[10:]}]}]


V1_PREDICTIONS = {qid: prediction for qid, _, prediction in V1_CASES}  # "missing" has none


V2_CASES = [
    ("has-exact", ["Normandy", "Normandy, France"], "normandy"),
    ("has-partial", ["10th and 11th centuries", "in the 10th and 11th centuries"], "the 10th century"),
    ("has-wrong", ["Rollo"], "Charles"),
    ("has-empty-pred", ["William"], ""),  # said no answer to an answerable question
    ("has-articles-gold", ["the", "a Viking"], "Viking"),  # 'the' normalises to "" and is dropped
    ("no-ans-right", [], ""),
    ("no-ans-wrong", [], "some text"),
    ("no-ans-punct-pred", [], "."),  # normalises to "": counts as no answer
    ("has-multi", ["Frankish", "the Franks", "Franks"], "Franks"),
    ("no-ans-wrong-2", [], "the Normans"),
]

NA_PROBS = {  # null odds as bertforge writes them (any real number; ties and negatives included)
    "has-exact": -3.0, "has-partial": 0.5, "has-wrong": 0.5, "has-empty-pred": 2.0, "has-articles-gold": -1.0,
    "no-ans-right": 4.0, "no-ans-wrong": 1.5, "no-ans-punct-pred": -0.5, "has-multi": 0.0, "no-ans-wrong-2": 3.0,
}


def v2_dataset(missing: bool = False):
    qas = [_qa(qid, gold, impossible=not gold) for qid, gold, _ in V2_CASES]
    if missing:
        qas.append(_qa("missing-no-ans", [], impossible=True))
    return [{"title": "Normans", "paragraphs": [{"context": "...", "qas": qas[:4]}, {"context": "...", "qas": qas[4:]}]}]


V2_PREDICTIONS = {qid: prediction for qid, _, prediction in V2_CASES}


def assert_same(ours: dict, official: dict) -> None:
    assert list(ours) == list(official)  # same fields, same order
    for key, value in official.items():
        assert ours[key] == pytest.approx(value, abs=1e-9, rel=0), key


# ============================================================================ tests


def test_normalisation_matches_the_official_function():
    texts = [c[2] for c in V1_CASES] + [g for c in V1_CASES for g in c[1]] + \
        ["The  A-Team's (1983)", "AN  ANT", "anthe", "a.b.c", "  ", "Ça, c'est «la» vie!", "ﬁ ligature"]
    for text in texts:
        assert normalize_answer(text) == v1_normalize_answer(text) == normalize_answer_v2(text), text
    assert normalize_answer("The  A-Team's (1983)") == "ateams 1983"
    assert normalize_answer("theory of a thesis") == "theory of thesis"


def test_hand_computed_f1():
    assert f1_score("a cat on a mat", "the cat sat on the mat") == pytest.approx(2 * 1.0 * 0.75 / 1.75)
    assert f1_score("yes yes yes", "yes yes no") == pytest.approx(2 / 3)
    assert f1_score("", "") == 0  # v1.1: nothing shared
    assert compute_f1("", "") == 1 and compute_f1("the", "") == 1  # v2.0: both "no answer"
    assert compute_f1("Paris", "") == 0


def test_v1_equals_the_official_script():
    dataset = v1_dataset()
    ours, official = evaluate_v1(dataset, V1_PREDICTIONS), v1_evaluate(dataset, V1_PREDICTIONS)
    assert_same(ours, official)
    # 19 questions (one without a prediction, scored 0): exact matches are case, punct, articles,
    # article-inside-word, an-article, whitespace, curly-quote, gold-only-punct.
    assert ours["exact_match"] == pytest.approx(100.0 * 8 / 19)


def test_v2_equals_the_official_script_without_and_with_na_probs():
    dataset = v2_dataset()
    plain = evaluate_v2(dataset, V2_PREDICTIONS)
    assert_same(plain, v2_evaluate(dataset, V2_PREDICTIONS))
    assert plain["HasAns_total"] == 6 and plain["NoAns_total"] == 4
    assert plain["NoAns_exact"] == pytest.approx(50.0)  # no-ans-right and the "." prediction
    ours = evaluate_v2(dataset, V2_PREDICTIONS, NA_PROBS)
    assert_same(ours, v2_evaluate(dataset, V2_PREDICTIONS, NA_PROBS))
    # --na-prob-thresh 1.0: the wrong answers with odds 1.5 and 3.0 count as "no answer" (right).
    assert ours["NoAns_exact"] == pytest.approx(100.0)
    for thresh in (-1.0, 0.5, 2.5):  # --na-prob-thresh
        assert_same(evaluate_v2(dataset, V2_PREDICTIONS, NA_PROBS, thresh),
                    v2_evaluate(dataset, V2_PREDICTIONS, NA_PROBS, thresh))


def test_v2_missing_predictions_and_only_answerable_questions():
    dataset = v2_dataset(missing=True)  # the official script dies on a question without a prediction
    with pytest.raises(KeyError):
        v2_evaluate(dataset, V2_PREDICTIONS, NA_PROBS)
    with pytest.raises(ValueError, match="missing-no-ans"):
        evaluate_v2(dataset, V2_PREDICTIONS, NA_PROBS)
    answerable = [{"title": "t", "paragraphs": [{"context": "...", "qas": [
        _qa(qid, gold) for qid, gold, _ in V2_CASES if gold]}]}]
    ours = evaluate_v2(answerable, V2_PREDICTIONS)
    assert "NoAns_exact" not in ours
    assert_same(ours, v2_evaluate(answerable, V2_PREDICTIONS))


def test_random_predictions_match_the_official_scripts():
    import random

    rng = random.Random(0)
    words = ["the", "a", "cat", "Cat", "mat,", "sat", "on", "an", "(big)", "dog", "-", "Dog's"]
    qas, preds, na = [], {}, {}
    for i in range(300):
        qid = f"q{i}"
        gold = [] if rng.random() < 0.4 else [" ".join(rng.choices(words, k=rng.randint(1, 4)))
                                             for _ in range(rng.randint(1, 3))]
        qas.append(_qa(qid, gold, impossible=not gold))
        preds[qid] = "" if rng.random() < 0.3 else " ".join(rng.choices(words, k=rng.randint(1, 5)))
        na[qid] = round(rng.uniform(-5, 5), 1)  # rounding makes ties
    dataset = [{"title": "r", "paragraphs": [{"context": "...", "qas": qas}]}]
    assert_same(evaluate_v2(dataset, preds, na), v2_evaluate(dataset, preds, na))
    answerable = [{"title": "r", "paragraphs": [{"context": "...", "qas": [q for q in qas if q["answers"]]}]}]
    assert_same(evaluate_v1(answerable, preds), v1_evaluate(answerable, preds))


def test_fractions_for_eval_results():
    dataset = v2_dataset()
    official = v2_evaluate(dataset, V2_PREDICTIONS, NA_PROBS)
    metrics = squad_metrics(dataset, V2_PREDICTIONS, "2.0", NA_PROBS)
    assert metrics["exact_match"] == pytest.approx(official["exact"] / 100, abs=1e-12)
    assert metrics["f1"] == pytest.approx(official["f1"] / 100, abs=1e-12)
    assert metrics["best_f1"] == pytest.approx(official["best_f1"] / 100, abs=1e-12)
    assert metrics["best_f1_thresh"] == official["best_f1_thresh"]  # a threshold, not a score: unscaled
    assert not any(k.endswith("total") for k in metrics)
    assert set(metrics) == {"exact_match", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1",
                            "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"}
    v1 = squad_metrics(v1_dataset(), V1_PREDICTIONS, "1.1")
    assert v1 == pytest.approx(as_fractions(v1_evaluate(v1_dataset(), V1_PREDICTIONS)))
    assert math.isclose(v1["f1"] * 100, v1_evaluate(v1_dataset(), V1_PREDICTIONS)["f1"], abs_tol=1e-9)
    with pytest.raises(ValueError, match="version"):
        squad_metrics(dataset, V2_PREDICTIONS, "3.0")
