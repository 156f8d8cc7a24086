"""SQuAD span boundaries, bertforge vs the peer, without training (issue #28).

Two checks on the same questions, for each `--input` file (default: the shared v1.1 and v2.0 train
files), at run_squad's defaults (384 tokens, doc stride 128, questions cut at 64 tokens):

1. Training targets. bertforge's windows and start/end targets (`bertforge.tasks.answer.
   convert_examples_to_features`) and the peer's (`prepare_train_features` of Hugging Face's
   run_qa.py as `benchmarks/peer.py` reproduces it, transformers' fast tokenizer of the same
   vocabulary). Each window's target is mapped back to the characters of the passage and compared
   with the first gold answer after the official normalisation (`normalize_answer`): per side, the
   windows whose target text differs from the gold answer, and the questions whose target character
   spans differ between the two sides.
2. Post-processing given the same scores. A synthetic "model" gives every passage token of a
   question one start and one end score (random, plus a peak at the gold answer's first and last
   token, and a rival peak on a neighbouring token, so that boundaries compete); every window of
   either side reads its logits from those scores (plus, with `--window-noise`, a little noise per
   window, so that the max-context rule matters), [CLS] and the question get low scores. bertforge's
   `postprocess` and the peer's `postprocess_qa_predictions` then choose an answer each: how often
   they differ, and the mean answer length in words on each side and of the gold answers.

With `--finetuned DIR` (a model from `bertforge finetune squad`), check 2 runs on that model's logits
instead: each side's windows through the same model, then each side's post-processing.

Exactly one JSON line of counts goes to stdout; examples of each kind of difference go to stderr.

    python benchmarks/squad_targets.py --model MINILM [--input FILE ...] [--seed 1] [--window-noise 0.5]
    python benchmarks/squad_targets.py --model MINILM --finetuned runs/squad --input DEV.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _common import log, quiet_libraries  # noqa: E402

from benchmarks.peer import postprocess_qa_predictions, prepare_train_features, prepare_validation_features  # noqa: E402

from bertforge.metrics.squad import normalize_answer  # noqa: E402
from bertforge.tasks.answer import predict_logits  # noqa: E402
from bertforge.tasks.squad_data import SquadSettings, convert_examples_to_features, read_squad_file  # noqa: E402
from bertforge.tasks.squad_postprocess import postprocess  # noqa: E402
from bertforge.tokenization import BertTokenizer  # noqa: E402

SQUAD = REPO.parent / "shared" / "data" / "squad"
DEFAULT_INPUTS = [SQUAD / "v1.1" / "train-v1.1.first11.json", SQUAD / "v2.0" / "train-v2.0.first10.json"]


def peer_rows(examples) -> list[dict]:
    """bertforge's examples as run_qa's `datasets` rows (first answer first, as both sides train on it)."""
    return [{"id": e.qas_id, "question": e.question, "context": e.context,
             "answers": {"text": [t for t, _ in e.answers], "answer_start": [s for _, s in e.answers]}}
            for e in examples]


def bertforge_targets(examples, features) -> dict[int, list[tuple[int, int]]]:
    """Example index -> the character span of each window's (non-[CLS]) training target."""
    targets: dict[int, list[tuple[int, int]]] = {}
    for feature in features.features:
        i = feature["example_index"]
        targets.setdefault(i, [])
        if feature["start_position"] == 0:
            continue
        window_start = features.spans[i][feature["window_index"]][0]
        offsets = features.offsets[i]
        first = window_start + feature["start_position"] - feature["context_offset"]
        last = window_start + feature["end_position"] - feature["context_offset"]
        targets[i].append((offsets[first][0], offsets[last][1]))
    return targets


def peer_targets(rows, tokenizer, settings: SquadSettings) -> tuple[dict[int, list[tuple[int, int]]], int]:
    """Example index -> the character span of each of the peer's windows' (non-[CLS]) targets, and
    the number of windows. The peer's features carry no offsets, so each question is converted alone
    (its features are its own) and tokenized once more, identically, for the offsets."""
    targets, count = {}, 0
    for i, row in enumerate(rows):
        features = prepare_train_features([row], tokenizer, settings.max_seq_length, settings.doc_stride)
        encoded = tokenizer([row["question"].lstrip()], [row["context"]], truncation="only_second",
                            max_length=settings.max_seq_length, stride=settings.doc_stride,
                            return_overflowing_tokens=True, return_offsets_mapping=True, padding=False)
        count += len(features)
        targets[i] = [(encoded["offset_mapping"][k][f["start_positions"]][0],
                       encoded["offset_mapping"][k][f["end_positions"]][1])
                      for k, f in enumerate(features) if f["start_positions"] != 0]
    return targets, count


def compare_targets(examples, ours, theirs, shown: int) -> dict:
    counts = {"answerable": 0, "bertforge_windows_with_answer": 0, "peer_windows_with_answer": 0,
              "bertforge_target_not_gold": 0, "peer_target_not_gold": 0,
              "bertforge_questions_without_target": 0, "peer_questions_without_target": 0,
              "questions_whose_targets_differ": 0, "bertforge_target_words": 0.0, "peer_target_words": 0.0}
    words = {"bertforge": [], "peer": []}
    for i, example in enumerate(examples):
        if example.is_impossible:
            continue
        counts["answerable"] += 1
        gold = normalize_answer(example.answers[0][0])
        for side, spans in (("bertforge", ours.get(i, [])), ("peer", theirs.get(i, []))):
            counts[f"{side}_windows_with_answer"] += len(spans)
            if not spans:
                counts[f"{side}_questions_without_target"] += 1
                continue
            words[side].append(len(example.context[spans[0][0]:spans[0][1]].split()))
            for start, end in spans:
                if normalize_answer(example.context[start:end]) != gold:
                    counts[f"{side}_target_not_gold"] += 1
        if set(ours.get(i, [])) != set(theirs.get(i, [])):
            counts["questions_whose_targets_differ"] += 1
            if shown > 0:
                shown -= 1
                log(f"  targets differ, {example.qas_id}: gold {example.answers[0][0]!r}; bertforge "
                    f"{[example.context[s:e] for s, e in ours.get(i, [])]}; peer "
                    f"{[example.context[s:e] for s, e in theirs.get(i, [])]}")
    for side in words:
        counts[f"{side}_target_words"] = round(float(np.mean(words[side])), 3) if words[side] else None
    return counts


def synthetic_scores(examples, features, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per example, (start, end) scores for each passage token: N(0, 1), +4 at the gold answer's
    first/last token, +3.5 at a rival one token outside it (before the start, after the end: the
    kind of boundary error that lengthens a span)."""
    rng = np.random.default_rng(seed)
    scores = []
    for i, example in enumerate(examples):
        offsets = features.offsets[i]
        n = len(offsets)
        start, end = rng.normal(size=n), rng.normal(size=n)
        if example.answers and n:
            text, char = example.answers[0]
            first = next((t for t, (s, e) in enumerate(offsets) if e > char), n - 1)
            last = max([t for t, (s, e) in enumerate(offsets) if s < char + len(text)] or [first])
            start[first] += 4.0
            end[last] += 4.0
            start[max(0, first - 1)] += 3.5 * (first > 0)
            end[min(n - 1, last + 1)] += 3.5 * (last + 1 < n)
        scores.append((start, end))
    return scores


def synthetic_logits(rows, features, peer_features, scores, window_noise: float, seed: int):
    """Both sides' window logits from the shared per-token `scores` (bertforge's as `postprocess` takes
    them, the peer's as `postprocess_qa_predictions` does)."""
    rng = np.random.default_rng(seed + 1)
    token_of = [{offset: t for t, offset in enumerate(offsets)} for offsets in features.offsets]
    ours = []
    for feature in features.features:
        i, n = feature["example_index"], len(feature["input_ids"])
        window_start, window_end = features.spans[i][feature["window_index"]]
        start, end = np.full(n, -5.0), np.full(n, -5.0)
        first = feature["context_offset"]
        start[first:first + window_end - window_start] = scores[i][0][window_start:window_end]
        end[first:first + window_end - window_start] = scores[i][1][window_start:window_end]
        ours.append((start + window_noise * rng.normal(size=n), end + window_noise * rng.normal(size=n)))
    index_of = {row["id"]: i for i, row in enumerate(rows)}
    starts, ends = [], []
    for feature in peer_features:
        i, n = index_of[feature["example_id"]], len(feature["input_ids"])
        start, end = np.full(n, -5.0), np.full(n, -5.0)
        for k, offset in enumerate(feature["offset_mapping"]):
            if offset is not None:
                t = token_of[i][tuple(offset)]
                start[k], end[k] = scores[i][0][t], scores[i][1][t]
        starts.append(start + window_noise * rng.normal(size=n))
        ends.append(end + window_noise * rng.normal(size=n))
    return ours, (starts, ends)


def model_logits(model, features, peer_features, pad_token_id: int):
    """Both sides' window logits from one fine-tuned model: each side's rows through the same model."""
    ours = predict_logits(model, features.features, 64, pad_token_id)
    theirs = predict_logits(model, [{k: f[k] for k in ("input_ids", "token_type_ids")} for f in peer_features],
                            64, pad_token_id)
    return ours, ([s for s, _ in theirs], [e for _, e in theirs])


def compare_postprocessing(examples, rows, features, peer_features, ours, theirs_logits, v2: bool, shown: int) -> dict:
    """The answers of bertforge's `postprocess` and of the peer's `postprocess_qa_predictions`."""
    mine = postprocess(examples, features, ours, version_2_with_negative=v2)
    theirs, _, _ = postprocess_qa_predictions(rows, peer_features, theirs_logits, version_2_with_negative=v2)
    answerable = [e for e in examples if not e.is_impossible]
    counts = {"questions": len(examples), "answers_differ": 0, "bertforge_longer": 0, "peer_longer": 0,
              "bertforge_exact": 0, "peer_exact": 0,
              "bertforge_words": 0.0, "peer_words": 0.0, "gold_words": 0.0}
    for example in answerable:
        gold = normalize_answer(example.answers[0][0])
        a, b = mine.best_span[example.qas_id] if v2 else mine.predictions[example.qas_id], theirs[example.qas_id]
        counts["bertforge_exact"] += normalize_answer(a) == gold
        counts["peer_exact"] += normalize_answer(b) == gold
        if a != b:
            counts["answers_differ"] += 1
            counts["bertforge_longer"] += len(a) > len(b)
            counts["peer_longer"] += len(b) > len(a)
            if shown > 0:
                shown -= 1
                log(f"  answers differ, {example.qas_id}: gold {example.answers[0][0]!r}; bertforge {a!r}; peer {b!r}")
    for key, texts in (("bertforge_words", [mine.best_span[e.qas_id] for e in answerable]),
                       ("peer_words", [theirs[e.qas_id] for e in answerable]),
                       ("gold_words", [e.answers[0][0] for e in answerable])):
        counts[key] = round(float(np.mean([len(t.split()) for t in texts])), 3) if texts else None
    return counts


def compare_file(examples, tokenizer, peer_tokenizer, settings: SquadSettings, window_noise: float = 0.5,
                 seed: int = 1, show: int = 0, model=None) -> dict:
    """Both checks (see the module docstring) on one file's questions; v2.0 when any is unanswerable.
    With `model` (a `BertForQuestionAnswering`), post-processing compares on its logits instead of
    synthetic ones."""
    v2 = any(e.is_impossible for e in examples)
    rows = peer_rows(examples)
    train = convert_examples_to_features(examples, tokenizer, settings, is_training=True)
    theirs, peer_windows = peer_targets(rows, peer_tokenizer, settings)
    targets = {"bertforge_windows": len(train.features), "peer_windows": peer_windows,
               "bertforge_skipped": len(train.skipped),
               **compare_targets(examples, bertforge_targets(examples, train), theirs, show)}
    features = convert_examples_to_features(examples, tokenizer, settings)
    peer_features = prepare_validation_features(rows, peer_tokenizer, settings.max_seq_length, settings.doc_stride)
    if model is None:
        scores = synthetic_scores(examples, features, seed)
        ours, theirs_logits = synthetic_logits(rows, features, peer_features, scores, window_noise, seed)
    else:
        ours, theirs_logits = model_logits(model, features, peer_features, tokenizer.pad_token_id)
    post = compare_postprocessing(examples, rows, features, peer_features, ours, theirs_logits, v2, show)
    return {"version": "2.0" if v2 else "1.1", "targets": targets, "postprocessing": post}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint directory (its vocab.txt for both sides)")
    parser.add_argument("--input", nargs="+", default=[str(p) for p in DEFAULT_INPUTS], help="SQuAD JSON files")
    parser.add_argument("--max-seq-length", type=int, default=384)
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--max-query-length", type=int, default=64)
    parser.add_argument("--window-noise", type=float, default=0.5,
                        help="standard deviation of the per-window noise added to the shared scores")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--finetuned", help="a model from `bertforge finetune squad`: compare post-processing on "
                                            "its logits (GPU if there is one) instead of synthetic ones")
    parser.add_argument("--max-questions", type=int, help="the first N questions of each file")
    parser.add_argument("--show", type=int, default=8, help="examples of each kind of difference logged")
    args = parser.parse_args()
    quiet_libraries()
    from transformers import AutoTokenizer

    settings = SquadSettings(max_seq_length=args.max_seq_length, doc_stride=args.doc_stride,
                             max_query_length=args.max_query_length)
    tokenizer = BertTokenizer.from_pretrained(args.model)
    peer_tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = None
    if args.finetuned:
        from bertforge.modeling import BertForQuestionAnswering

        model = BertForQuestionAnswering.from_pretrained(args.finetuned)
        model.to("cuda" if torch.cuda.is_available() else "cpu")
    result = {"settings": vars(settings), "logits": f"model {args.finetuned}" if model is not None else
              f"synthetic, window noise {args.window_noise}, seed {args.seed}", "files": {}}
    for path in args.input:
        examples = read_squad_file(path).examples[:args.max_questions]
        log(f"{path}: {len(examples)} questions")
        result["files"][Path(path).name] = compare_file(examples, tokenizer, peer_tokenizer, settings,
                                                        args.window_noise, args.seed, args.show, model)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
