"""SQuAD error analysis: where two systems' answers differ, by kind of question, answer and passage (#28).

For each `--side NAME=PRED.json[,PRED.json...]` (one `predictions.json` per seed: `{id: answer}`, as
`bertforge finetune squad` and `benchmarks/squad_peer.py` write them), on the answerable questions of
`--dev-file`, by the official v1.1 formulas (max over the gold answers, bertforge's metrics module):

* EM and F1 overall and per slice, the mean over seeds (and their std when there are several):
  - the question's wh-word (what, which, who, when, where, why, how many / how much, other how, other),
    the slices of Rajpurkar et al. (2016, Table 3) that need no parser;
  - the first gold answer's length in words (1, 2-3, 4-6, 7+);
  - the passage's length in words, in quartiles of the questions;
* the mean predicted answer length in words against the gold answers';
* boundary errors: predictions that are not an exact match but overlap a gold answer (F1 > 0), split
  into too long (the prediction contains the gold answer), too short (the gold answer contains the
  prediction) and shifted, as fractions of the questions.

Exactly one JSON line goes to stdout.

    python benchmarks/squad_errors.py --dev-file DEV.json \\
        --side bertforge=runs/ours/seed1/predictions.json,runs/ours/seed2/predictions.json \\
        --side peer=runs/peer/seed1/predictions.json,runs/peer/seed2/predictions.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bertforge.metrics.squad import exact_match_score, f1_score, normalize_answer  # noqa: E402

WH_WORDS = ("how many", "how much", "what", "which", "who", "whom", "whose", "when", "where", "why", "how")


def wh_word(question: str) -> str:
    """The question's wh-word slice (the first one it contains, longest match first)."""
    text = " " + " ".join(question.lower().replace("?", " ").split()) + " "
    hits = [(text.find(f" {w} "), w) for w in WH_WORDS if f" {w} " in text]
    if not hits:
        return "other"
    word = min(hits, key=lambda hit: (hit[0], -len(hit[1])))[1]
    return {"whom": "who", "whose": "who", "how much": "how many / how much",
            "how many": "how many / how much", "how": "other how"}.get(word, word)


def answer_length_slice(answer: str) -> str:
    n = len(answer.split())
    return "1" if n <= 1 else "2-3" if n <= 3 else "4-6" if n <= 6 else "7+"


def read_questions(path: Path) -> list[dict]:
    """The answerable questions of a SQuAD file: id, question, gold answers, passage length in words."""
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    questions = []
    for article in data:
        for paragraph in article["paragraphs"]:
            words = len(paragraph["context"].split())
            for qa in paragraph["qas"]:
                answers = [a["text"] for a in qa.get("answers", [])]
                if answers and not qa.get("is_impossible", False):
                    questions.append({"id": qa["id"], "question": qa["question"], "answers": answers,
                                      "passage_words": words})
    if not questions:
        raise SystemExit(f"{path}: no answerable question")
    return questions


def boundary(prediction: str, answers: list[str]) -> str | None:
    """'too long', 'too short' or 'shifted' for an overlapping non-exact prediction, else None."""
    if any(exact_match_score(prediction, a) for a in answers):
        return None
    scored = max(answers, key=lambda a: f1_score(prediction, a))
    if f1_score(prediction, scored) == 0:
        return None
    p, g = normalize_answer(prediction), normalize_answer(scored)
    return "too long" if g in p else "too short" if p in g else "shifted"


def score_seed(questions: list[dict], predictions: dict[str, str], slices: dict[str, dict[str, str]]) -> dict:
    """EM/F1 (percent) overall and per slice, answer lengths and boundary errors for one seed."""
    missing = [q["id"] for q in questions if q["id"] not in predictions]
    if missing:
        raise SystemExit(f"a predictions file lacks {len(missing)} of the dev file's questions, e.g. {missing[0]}")
    per_question = {}
    for q in questions:
        prediction = predictions[q["id"]]
        per_question[q["id"]] = (100.0 * max(exact_match_score(prediction, a) for a in q["answers"]),
                                 100.0 * max(f1_score(prediction, a) for a in q["answers"]),
                                 boundary(prediction, q["answers"]), len(prediction.split()))
    result = {"overall": mean_scores(list(per_question.values()))}
    for kind, assignment in slices.items():
        groups: dict[str, list] = {}
        for q in questions:
            groups.setdefault(assignment[q["id"]], []).append(per_question[q["id"]])
        result[kind] = {name: mean_scores(rows) | {"n": len(rows)} for name, rows in sorted(groups.items())}
    result["predicted_words"] = statistics.fmean(row[3] for row in per_question.values())
    for kind in ("too long", "too short", "shifted"):
        result[f"boundary_{kind.replace(' ', '_')}"] = (
            100.0 * sum(row[2] == kind for row in per_question.values()) / len(per_question))
    return result


def mean_scores(rows: list) -> dict:
    return {"exact_match": statistics.fmean(r[0] for r in rows), "f1": statistics.fmean(r[1] for r in rows)}


def over_seeds(values: list[float]) -> dict:
    out = {"mean": round(statistics.fmean(values), 2)}
    if len(values) > 1:
        out["std"] = round(statistics.stdev(values), 2)
    return out


def combine(seeds: list[dict]) -> dict:
    """Mean (and std) over seeds of every number in the per-seed results."""
    first = seeds[0]
    if isinstance(first, dict):
        return {key: (first[key] if key == "n" else combine([s[key] for s in seeds])) for key in first}
    return over_seeds(seeds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dev-file", type=Path, required=True, help="the SQuAD file the predictions answer")
    parser.add_argument("--side", action="append", required=True, metavar="NAME=PRED.json[,PRED.json...]",
                        help="a system and its predictions.json files, one per seed (repeat for each system)")
    args = parser.parse_args(argv)
    questions = read_questions(args.dev_file)
    order = sorted(q["passage_words"] for q in questions)
    cuts = [order[len(order) * k // 4] for k in (1, 2, 3)]

    def quartile(words: int) -> str:
        k = sum(words >= c for c in cuts)
        low = order[0] if k == 0 else cuts[k - 1]
        high = cuts[k] - 1 if k < 3 else order[-1]
        return f"Q{k + 1} ({low}-{high} words)"

    slices = {"wh_word": {q["id"]: wh_word(q["question"]) for q in questions},
              "answer_words": {q["id"]: answer_length_slice(q["answers"][0]) for q in questions},
              "passage_words": {q["id"]: quartile(q["passage_words"]) for q in questions}}
    report = {"benchmark": "squad_errors", "dev_file": args.dev_file.name, "questions": len(questions),
              "gold_words": round(statistics.fmean(len(q["answers"][0].split()) for q in questions), 3),
              "sides": {}}
    for spec in args.side:
        name, _, files = spec.partition("=")
        if not name or not files:
            parser.error(f"--side {spec!r}: expected NAME=PRED.json[,PRED.json...]")
        seeds = []
        for file in files.split(","):
            path = Path(file)
            if not path.is_file():
                parser.error(f"--side {name}: {path} not found")
            seeds.append(score_seed(questions, json.loads(path.read_text(encoding="utf-8")), slices))
        report["sides"][name] = {"seeds": len(seeds), **combine(seeds)}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
