"""The peer's SQuAD fine-tune: Hugging Face transformers `AutoModelForQuestionAnswering` + `Trainer`.

What Hugging Face's `examples/pytorch/question-answering/run_qa.py` does (its `prepare_train_features`,
`prepare_validation_features` and `utils_qa.postprocess_qa_predictions`, reproduced below), on the same
split, checkpoint, hyperparameters and maximum length as `bertforge finetune squad`, with the predictions
scored by bertforge's metrics module (`bertforge.metrics.squad`, equal to the official scripts), so that
the numbers sit side by side:

* question and passage tokenized together, `truncation="only_second"`, `max_length=--max-seq-length`,
  `stride=--doc-stride`, overflowing windows kept; note that the tokenizers library's `stride` is the
  number of tokens two windows SHARE, where Google's (and bertforge's) `doc_stride` is the step between
  their starts: with the same number, long passages get fewer windows here (run_qa's standard behaviour,
  kept as it is). The question is not cut separately (run_qa has no max_query_length).
* training targets: the first answer's token span when the window holds it, else [CLS];
* AdamW (ε 1e-6 as bertforge and Google's BERT), linear warm-up over `--warmup-ratio` then linear decay,
  weight decay 0.01, clipping at 1.0; batch order random as run_qa (or grouped by length as bertforge's
  `--group-by-length`, `--sampling group_by_length`);
* evaluation at the end of each epoch: n-best (`--n-best-size`) starts and ends per window, spans with
  end >= start and at most `--max-answer-length` tokens, no max-context check (run_qa's features carry
  none), for v2.0 the minimum [CLS] score over windows against the best span with
  `--null-score-diff-threshold`; the best epoch is reported (bertforge keeps its best epoch the same way).

Also reported: the always-no-answer baseline on the same eval file (every prediction ""), which for
SQuAD 2.0 scores exactly the share of unanswerable questions.

Exactly one JSON line goes to stdout; OUT holds predictions.json, null_odds.json (v2.0),
nbest_predictions.json of the best epoch and summary.json (with each epoch's metrics, the wall time at
its end and its evaluation's seconds, as bertforge's `log.jsonl` has them).

    python scripts/split_squad.py --output-dir /tmp/squad-split
    python benchmarks/squad_peer.py --model MINILM --train-file /tmp/squad-split/train.json \
        --dev-file /tmp/squad-split/eval.json --version 2.0 --output-dir runs/squad_peer
    python benchmarks/squad_peer.py --model MINILM --train-file /tmp/squad-split/train.json \
        --dev-file /tmp/squad-split/eval.json --version 2.0 --output-dir /tmp/p \
        --max-train-examples 16 --max-eval-examples 16 --epochs 1 --max-seq-length 128 --doc-stride 32  # a smoke run
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bertforge.metrics.squad import evaluate_v1, evaluate_v2, squad_metrics  # noqa: E402


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- data (run_qa's layout)

def read_examples(path: str, limit: int | None) -> tuple[list[dict], list[dict]]:
    """The questions as run_qa's `datasets` rows ({id, question, context, answers: {text, answer_start}})
    and the `data` list cut to those questions (what the metrics read)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))["data"]
    rows, kept = [], []
    for article in data:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            qas = []
            for qa in paragraph["qas"]:
                if limit is not None and len(rows) >= limit:
                    break
                rows.append({"id": qa["id"], "question": qa["question"], "context": paragraph["context"],
                             "answers": {"text": [a["text"] for a in qa["answers"]],
                                         "answer_start": [a["answer_start"] for a in qa["answers"]]}})
                qas.append(qa)
            if qas:
                paragraphs.append({**paragraph, "qas": qas})
        if paragraphs:
            kept.append({**article, "paragraphs": paragraphs})
    return rows, kept


def prepare_train_features(examples: list[dict], tokenizer, max_seq_length: int, doc_stride: int) -> list[dict]:
    """run_qa.py's prepare_train_features (pad_on_right: the question first)."""
    questions = [e["question"].lstrip() for e in examples]
    tokenized = tokenizer(questions, [e["context"] for e in examples], truncation="only_second",
                          max_length=max_seq_length, stride=doc_stride, return_overflowing_tokens=True,
                          return_offsets_mapping=True, padding=False)
    sample_mapping = tokenized.pop("overflow_to_sample_mapping")
    offset_mapping = tokenized.pop("offset_mapping")
    features = []
    for i, offsets in enumerate(offset_mapping):
        input_ids = tokenized["input_ids"][i]
        cls_index = input_ids.index(tokenizer.cls_token_id)
        sequence_ids = tokenized.sequence_ids(i)
        answers = examples[sample_mapping[i]]["answers"]
        if len(answers["answer_start"]) == 0:
            start_position = end_position = cls_index
        else:
            start_char = answers["answer_start"][0]
            end_char = start_char + len(answers["text"][0])
            token_start_index = 0
            while sequence_ids[token_start_index] != 1:
                token_start_index += 1
            token_end_index = len(input_ids) - 1
            while sequence_ids[token_end_index] != 1:
                token_end_index -= 1
            if not (offsets[token_start_index][0] <= start_char and offsets[token_end_index][1] >= end_char):
                start_position = end_position = cls_index  # the answer is not in this window
            else:
                while token_start_index < len(offsets) and offsets[token_start_index][0] <= start_char:
                    token_start_index += 1
                start_position = token_start_index - 1
                while offsets[token_end_index][1] >= end_char:
                    token_end_index -= 1
                end_position = token_end_index + 1
        features.append({"input_ids": input_ids, "token_type_ids": tokenized["token_type_ids"][i],
                         "attention_mask": tokenized["attention_mask"][i],
                         "start_positions": start_position, "end_positions": end_position})
    return features


def prepare_validation_features(examples: list[dict], tokenizer, max_seq_length: int, doc_stride: int) -> list[dict]:
    """run_qa.py's prepare_validation_features: offsets of non-passage tokens set to None."""
    questions = [e["question"].lstrip() for e in examples]
    tokenized = tokenizer(questions, [e["context"] for e in examples], truncation="only_second",
                          max_length=max_seq_length, stride=doc_stride, return_overflowing_tokens=True,
                          return_offsets_mapping=True, padding=False)
    sample_mapping = tokenized.pop("overflow_to_sample_mapping")
    features = []
    for i in range(len(tokenized["input_ids"])):
        sequence_ids = tokenized.sequence_ids(i)
        features.append({"input_ids": tokenized["input_ids"][i], "token_type_ids": tokenized["token_type_ids"][i],
                         "attention_mask": tokenized["attention_mask"][i],
                         "example_id": examples[sample_mapping[i]]["id"],
                         "offset_mapping": [o if sequence_ids[k] == 1 else None
                                            for k, o in enumerate(tokenized["offset_mapping"][i])]})
    return features


def postprocess_qa_predictions(examples, features, predictions, version_2_with_negative=False, n_best_size=20,
                               max_answer_length=30, null_score_diff_threshold=0.0):
    """utils_qa.py's postprocess_qa_predictions: (predictions, nbest, null odds) keyed by question id."""
    all_start_logits, all_end_logits = predictions
    example_id_to_index = {k["id"]: i for i, k in enumerate(examples)}
    features_per_example = collections.defaultdict(list)
    for i, feature in enumerate(features):
        features_per_example[example_id_to_index[feature["example_id"]]].append(i)
    all_predictions, all_nbest_json, scores_diff_json = {}, {}, {}
    for example_index, example in enumerate(examples):
        min_null_prediction = None
        prelim_predictions = []
        for feature_index in features_per_example[example_index]:
            start_logits = all_start_logits[feature_index]
            end_logits = all_end_logits[feature_index]
            offset_mapping = features[feature_index]["offset_mapping"]
            feature_null_score = start_logits[0] + end_logits[0]
            if min_null_prediction is None or min_null_prediction["score"] > feature_null_score:
                min_null_prediction = {"offsets": (0, 0), "score": feature_null_score,
                                       "start_logit": start_logits[0], "end_logit": end_logits[0]}
            start_indexes = np.argsort(start_logits)[-1: -n_best_size - 1: -1].tolist()
            end_indexes = np.argsort(end_logits)[-1: -n_best_size - 1: -1].tolist()
            for start_index in start_indexes:
                for end_index in end_indexes:
                    if (start_index >= len(offset_mapping) or end_index >= len(offset_mapping)
                            or offset_mapping[start_index] is None or len(offset_mapping[start_index]) < 2
                            or offset_mapping[end_index] is None or len(offset_mapping[end_index]) < 2):
                        continue
                    if end_index < start_index or end_index - start_index + 1 > max_answer_length:
                        continue
                    prelim_predictions.append({
                        "offsets": (offset_mapping[start_index][0], offset_mapping[end_index][1]),
                        "score": start_logits[start_index] + end_logits[end_index],
                        "start_logit": start_logits[start_index], "end_logit": end_logits[end_index]})
        if version_2_with_negative and min_null_prediction is not None:
            prelim_predictions.append(min_null_prediction)
            null_score = min_null_prediction["score"]
        predictions_ = sorted(prelim_predictions, key=lambda x: x["score"], reverse=True)[:n_best_size]
        if version_2_with_negative and min_null_prediction is not None \
                and not any(p["offsets"] == (0, 0) for p in predictions_):
            predictions_.append(min_null_prediction)
        context = example["context"]
        for pred in predictions_:
            offsets = pred.pop("offsets")
            pred["text"] = context[offsets[0]: offsets[1]]
        if len(predictions_) == 0 or (len(predictions_) == 1 and predictions_[0]["text"] == ""):
            predictions_.insert(0, {"text": "empty", "start_logit": 0.0, "end_logit": 0.0, "score": 0.0})
        scores = np.array([pred.pop("score") for pred in predictions_])
        exp_scores = np.exp(scores - np.max(scores))
        probs = exp_scores / exp_scores.sum()
        for prob, pred in zip(probs, predictions_):
            pred["probability"] = prob
        if not version_2_with_negative:
            all_predictions[example["id"]] = predictions_[0]["text"]
        else:
            i = 0
            while predictions_[i]["text"] == "":
                i += 1
            best_non_null_pred = predictions_[i]
            score_diff = null_score - best_non_null_pred["start_logit"] - best_non_null_pred["end_logit"]
            scores_diff_json[example["id"]] = float(score_diff)
            all_predictions[example["id"]] = "" if score_diff > null_score_diff_threshold else best_non_null_pred["text"]
        all_nbest_json[example["id"]] = [{k: (float(v) if isinstance(v, (np.floating, float)) else v)
                                          for k, v in pred.items()} for pred in predictions_]
    return all_predictions, all_nbest_json, scores_diff_json


# ---------------------------------------------------------------------------- training and evaluation

@torch.no_grad()
def predict(model, features: list[dict], tokenizer, batch_size: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Start and end logits of every feature (its own length), in feature order."""
    from transformers import DataCollatorWithPadding

    collator = DataCollatorWithPadding(tokenizer)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    starts, ends = [], []
    keys = ("input_ids", "token_type_ids", "attention_mask")
    for begin in range(0, len(features), batch_size):
        rows = features[begin:begin + batch_size]
        batch = collator([{k: f[k] for k in keys} for f in rows])
        out = model(**{k: v.to(device) for k, v in batch.items()})
        for row, feature in enumerate(rows):
            n = len(feature["input_ids"])
            starts.append(out.start_logits[row, :n].float().cpu().numpy())
            ends.append(out.end_logits[row, :n].float().cpu().numpy())
    model.train(was_training)
    return starts, ends


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint directory (the one given to bertforge)")
    parser.add_argument("--train-file", required=True, help="e.g. the train.json of scripts/split_squad.py")
    parser.add_argument("--dev-file", required=True, help="e.g. the eval.json of scripts/split_squad.py")
    parser.add_argument("--version", choices=("1.1", "2.0"), default="2.0")
    parser.add_argument("--output-dir", required=True)
    # bertforge finetune squad's defaults (epochs and batch size: per version, as there)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--epochs", type=float, help="default 3 (v1.1) or 2 (v2.0)")
    parser.add_argument("--batch-size", type=int, help="default 32 (v1.1) or 48 (v2.0)")
    parser.add_argument("--eval-batch-size", type=int, default=128)
    parser.add_argument("--max-seq-length", type=int, default=384)
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--n-best-size", type=int, default=20)
    parser.add_argument("--max-answer-length", type=int, default=30)
    parser.add_argument("--null-score-diff-threshold", type=float, default=0.0)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--sampling", default="random", choices=("random", "group_by_length"),
                        help="batch order: random as run_qa (default), or group_by_length as bertforge's --group-by-length")
    parser.add_argument("--max-train-examples", type=int, help="first N training questions (smoke runs)")
    parser.add_argument("--max-eval-examples", type=int, help="first N eval questions (smoke runs)")
    parser.add_argument("--num-threads", type=int, help="torch threads")
    parser.add_argument("--device", help="cpu to force the CPU (default: the GPU if there is one)")
    parser.add_argument("--progress", action="store_true", help="transformers' progress bars")
    args = parser.parse_args()
    v2 = args.version == "2.0"
    args.epochs = args.epochs if args.epochs is not None else (2.0 if v2 else 3.0)
    args.batch_size = args.batch_size if args.batch_size is not None else (48 if v2 else 32)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    from transformers import (AutoModelForQuestionAnswering, AutoTokenizer, DataCollatorWithPadding, Trainer,
                              TrainerCallback, TrainingArguments)

    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    train_examples, _ = read_examples(args.train_file, args.max_train_examples)
    dev_examples, dev_data = read_examples(args.dev_file, args.max_eval_examples)
    if not v2 and any(not e["answers"]["text"] for e in train_examples + dev_examples):
        raise SystemExit("unanswerable questions in the data: this is SQuAD 2.0, use --version 2.0")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    train_features = prepare_train_features(train_examples, tokenizer, args.max_seq_length, args.doc_stride)
    dev_features = prepare_validation_features(dev_examples, tokenizer, args.max_seq_length, args.doc_stride)
    log(f"peer: {len(train_examples)} training questions -> {len(train_features)} windows; "
        f"{len(dev_examples)} eval questions -> {len(dev_features)} windows")
    baseline_predictions = {e["id"]: "" for e in dev_examples}
    baseline = evaluate_v2(dev_data, baseline_predictions) if v2 else evaluate_v1(dev_data, baseline_predictions)
    history: list[dict] = []
    best: dict = {}
    clock = {"start": 0.0}  # set when training starts

    def evaluate(model, epoch: float) -> None:
        """Score the dev file after an epoch; the history records the wall time at the epoch's end
        (`elapsed_seconds`, training and earlier evaluations) and this evaluation's own seconds."""
        elapsed = time.perf_counter() - clock["start"]
        logits = predict(model, dev_features, tokenizer, args.eval_batch_size)
        predictions, nbest, null_odds = postprocess_qa_predictions(
            dev_examples, dev_features, logits, v2, args.n_best_size, args.max_answer_length,
            args.null_score_diff_threshold)
        official = evaluate_v2(dev_data, predictions, null_odds) if v2 else evaluate_v1(dev_data, predictions)
        metrics = squad_metrics(dev_data, predictions, args.version, null_odds if v2 else None)
        history.append({"epoch": epoch, **metrics, "elapsed_seconds": round(elapsed, 2),
                        "eval_seconds": round(time.perf_counter() - clock["start"] - elapsed, 2)})
        log(f"peer: epoch {epoch:g}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        if not best or metrics["f1"] > best["metrics"]["f1"]:
            best.update(epoch=epoch, metrics=metrics, official=official)
            (output_dir / "predictions.json").write_text(json.dumps(predictions, indent=2) + "\n")
            (output_dir / "nbest_predictions.json").write_text(json.dumps(nbest, indent=2) + "\n")
            if v2:
                (output_dir / "null_odds.json").write_text(json.dumps(null_odds, indent=2) + "\n")

    class EvaluateEachEpoch(TrainerCallback):
        def on_epoch_end(self, _args, state, _control, model=None, **_):
            evaluate(model, round(state.epoch or 0.0, 4))

    torch.manual_seed(args.seed)
    model = AutoModelForQuestionAnswering.from_pretrained(args.model)
    training = TrainingArguments(
        output_dir=str(output_dir / "trainer"), learning_rate=args.lr, per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs, warmup_steps=args.warmup_ratio, weight_decay=args.weight_decay,
        adam_epsilon=1e-6, max_grad_norm=1.0, lr_scheduler_type="linear", seed=args.seed, data_seed=args.seed,
        eval_strategy="no", save_strategy="no", logging_strategy="epoch", report_to="none",
        disable_tqdm=not args.progress, train_sampling_strategy=args.sampling,
        use_cpu=args.device == "cpu" or not torch.cuda.is_available())
    trainer = Trainer(model=model, args=training, train_dataset=train_features,
                      data_collator=DataCollatorWithPadding(tokenizer), callbacks=[EvaluateEachEpoch()])
    start = clock["start"] = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs; stdout is for the JSON line
        trainer.train()
    seconds = time.perf_counter() - start
    summary = {"peer": "transformers AutoModelForQuestionAnswering + Trainer (run_qa preprocessing, utils_qa "
                       "post-processing)", "model": args.model, "version": args.version,
               "train_questions": len(train_examples), "train_windows": len(train_features),
               "eval_questions": len(dev_examples), "eval_windows": len(dev_features),
               "hyperparameters": {k: getattr(args, k) for k in (
                   "lr", "epochs", "batch_size", "max_seq_length", "doc_stride", "n_best_size", "max_answer_length",
                   "null_score_diff_threshold", "warmup_ratio", "weight_decay", "seed", "sampling")},
               "best_epoch": best.get("epoch"), "metrics": best.get("metrics"),
               "official": best.get("official"), "always_no_answer": baseline, "seconds": seconds,
               "epochs": history}
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "epochs"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
