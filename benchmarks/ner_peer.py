"""The peer's CoNLL NER fine-tune: Hugging Face transformers `AutoModelForTokenClassification` + `Trainer`.

What Hugging Face's `examples/pytorch/token-classification/run_ner.py` does, on the same files, checkpoint,
hyperparameters, seeds and maximum length as `bertforge finetune ner`, scored with bertforge's metric
(`bertforge.tasks.conll.ner_metrics`, conlleval semantics), so the two numbers are comparable:

* words tokenized with `is_split_into_words=True`, truncated to `--max-seq-length`; the first sub-token
  of each word carries its label, the other sub-tokens -100 (run_ner's `label_all_tokens=False`);
* AdamW (ε 1e-6 as bertforge and Google's BERT), linear warm-up over `--warmup-ratio` of the steps then
  linear decay, weight decay 0.01, clipping at 1.0; evaluation at the end of each epoch and the best
  epoch's entity F1 reported (bertforge keeps the best epoch's model the same way);
* scoring: every dev word gets a tag; a word cut off by truncation (none at 128 tokens on CoNLL dev
  without document context, barely any in train) is predicted "O", so the gold side is the whole dev file.

The peer has no document context: compare it with `bertforge finetune ner` without `--document-context`.
Exactly one JSON line goes to stdout (per-seed best F1 and epoch, mean/std over seeds, seconds);
OUT/summary.json holds the same with every epoch's metrics.

    python benchmarks/ner_peer.py --model MINILM --output-dir runs/ner_peer --seeds 3
    python benchmarks/ner_peer.py --model MINILM --output-dir /tmp/p --max-train-examples 64 \
        --max-eval-examples 32 --epochs 1 --seeds 1          # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATA = REPO.parent / "shared" / "data" / "conll2003"

from bertforge.tasks.conll import label_list_from, ner_metrics, read_conll  # noqa: E402


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def encode(tokenizer, sentences, label_map, max_length: int) -> list[dict]:
    """run_ner's tokenize_and_align_labels: the first sub-token of each word labelled, the rest -100."""
    encoded = tokenizer([s.words for s in sentences], is_split_into_words=True, truncation=True,
                        max_length=max_length)
    rows = []
    for index, sentence in enumerate(sentences):
        word_ids = encoded.word_ids(index)
        labels, previous = [], None
        for word in word_ids:
            labels.append(-100 if word is None or word == previous else label_map[sentence.tags[word]])
            previous = word
        rows.append({"input_ids": encoded["input_ids"][index], "attention_mask": encoded["attention_mask"][index],
                     "token_type_ids": encoded["token_type_ids"][index], "labels": labels})
    return rows


def decode(predictions: np.ndarray, rows: list[dict], sentences, labels: list[str]) -> list[list[str]]:
    """Each word's tag from its first sub-token (the labelled positions, in word order); "O" for words
    cut off by truncation."""
    tags = []
    for prediction, row, sentence in zip(predictions, rows, sentences):
        first = [i for i, label in enumerate(row["labels"]) if label != -100]
        words = [labels[int(prediction[i])] for i in first]
        tags.append(words + ["O"] * (len(sentence) - len(words)))
    return tags


def run_seed(args, seed: int, train, dev, labels: list[str]) -> dict:
    from transformers import (AutoModelForTokenClassification, AutoTokenizer, DataCollatorForTokenClassification,
                              Trainer, TrainerCallback, TrainingArguments)

    label_map = {label: i for i, label in enumerate(labels)}
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    train_rows = encode(tokenizer, train, label_map, args.max_seq_length)
    dev_rows = encode(tokenizer, dev, label_map, args.max_seq_length)
    truncated = sum(sum(label != -100 for label in r["labels"]) < len(s) for r, s in zip(dev_rows, dev))
    gold = [s.tags for s in dev]
    history: list[dict] = []

    def compute_metrics(prediction) -> dict:
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        return ner_metrics(gold, decode(logits.argmax(-1), dev_rows, dev, labels))

    class Record(TrainerCallback):
        def on_evaluate(self, _args, state, _control, metrics=None, **_):
            history.append({"epoch": state.epoch, **{k[5:]: v for k, v in (metrics or {}).items()
                                                     if k.startswith("eval_")}})

    torch.manual_seed(seed)
    model = AutoModelForTokenClassification.from_pretrained(
        args.model, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label_map)
    training = TrainingArguments(
        output_dir=str(Path(args.output_dir) / f"seed{seed}"), learning_rate=args.lr,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=args.eval_batch_size,
        num_train_epochs=args.epochs, warmup_steps=args.warmup_ratio, weight_decay=args.weight_decay,
        adam_epsilon=1e-6, max_grad_norm=1.0, lr_scheduler_type="linear", seed=seed, data_seed=seed,
        eval_strategy="epoch", save_strategy="no", logging_strategy="epoch", report_to="none",
        disable_tqdm=not args.progress, train_sampling_strategy=args.sampling,
        use_cpu=args.device == "cpu" or not torch.cuda.is_available())
    trainer = Trainer(model=model, args=training, train_dataset=train_rows, eval_dataset=dev_rows,
                      data_collator=DataCollatorForTokenClassification(tokenizer), compute_metrics=compute_metrics,
                      callbacks=[Record()])
    start = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs; stdout is for the JSON line
        trainer.train()
    seconds = time.perf_counter() - start
    best = max(history, key=lambda h: h["f1"])
    return {"seed": seed, "f1": best["f1"], "best_epoch": best["epoch"], "seconds": seconds,
            "dev_sentences_truncated": truncated, "epochs": history}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint directory (the one given to bertforge)")
    parser.add_argument("--train-file", default=str(DATA / "train.txt"))
    parser.add_argument("--dev-file", default=str(DATA / "valid.txt"))
    parser.add_argument("--output-dir", required=True)
    # bertforge finetune ner's defaults
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--eval-batch-size", type=int, default=128)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--seeds", type=int, default=1, help="seeds --seed, --seed+1, ... (as bertforge --seeds)")
    parser.add_argument("--sampling", default="random", choices=("random", "group_by_length"),
                        help="batch order: random as run_ner (default), or group_by_length as bertforge's --group-by-length")
    parser.add_argument("--max-train-examples", type=int, help="first N training sentences (smoke runs)")
    parser.add_argument("--max-eval-examples", type=int, help="first N dev sentences (smoke runs)")
    parser.add_argument("--num-threads", type=int, help="torch threads")
    parser.add_argument("--device", help="cpu to force the CPU (default: the GPU if there is one)")
    parser.add_argument("--progress", action="store_true", help="transformers' progress bars")
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)

    train = read_conll(args.train_file)[:args.max_train_examples]
    dev = read_conll(args.dev_file)[:args.max_eval_examples]
    labels = label_list_from(train)
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    runs = []
    for seed in range(args.seed, args.seed + args.seeds):
        log(f"peer: seed {seed}, {len(train)} training and {len(dev)} dev sentences")
        runs.append(run_seed(args, seed, train, dev, labels))
        log(f"peer: seed {seed}: best dev F1 {runs[-1]['f1']:.4f} at epoch {runs[-1]['best_epoch']:g} "
            f"({runs[-1]['seconds']:.0f} s)")
    f1s = [r["f1"] for r in runs]
    summary = {"peer": "transformers AutoModelForTokenClassification + Trainer", "model": args.model,
               "train_sentences": len(train), "dev_sentences": len(dev),
               "hyperparameters": {k: getattr(args, k) for k in ("lr", "epochs", "batch_size", "max_seq_length",
                                                                   "warmup_ratio", "weight_decay", "sampling")},
               "f1": {"mean": statistics.fmean(f1s), "std": statistics.stdev(f1s) if len(f1s) > 1 else 0.0,
                      "min": min(f1s), "max": max(f1s), "n": len(f1s)},
               "runs": runs}
    (Path(args.output_dir) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}
                     | {"runs": [{k: r[k] for k in ("seed", "f1", "best_epoch", "seconds")} for r in runs]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
