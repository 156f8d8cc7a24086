"""The peer's multi-label fine-tuning: transformers' `Trainer` + `AutoModelForSequenceClassification` with
`problem_type="multi_label_classification"` (sigmoid + binary cross-entropy), on GoEmotions' TSV.

The recipe of `bertforge finetune multi-label`: batch 32, AdamW (eps 1e-6, weight decay 0.01), linear
warm-up over 10% of the steps then linear decay, clipping at 1.0, max length 128, an evaluation at each
epoch's end, the best epoch kept. The peer at its best CPU settings: dynamic padding
(`DataCollatorWithPadding`), `group_by_length`, bf16 autocast (`--bf16`). At each evaluation the decision
threshold is tuned on dev the same way as bertforge (one global threshold from 0.01, 0.02, ..., 0.99, the
one with the best macro-F1: bertforge's own `bertforge.tasks.multi_label.tune_thresholds`, when it is
importable, else the same grid here), and every epoch's dev probabilities and gold labels are saved beside the run
(`seed{N}/dev_epoch{E}.npz`, in the Trainer's order of the rows) so that the scores can be recomputed.

    python benchmarks/multi_label_peer.py --model DIR --data-dir ../shared/data/goemotions --seeds 0,1,2 --lr 5e-5 --bf16 \
        --dynamic-padding --group-by-length

Prints ONE JSON line: per seed the best epoch's metrics and the wall time of `trainer.train`, and mean/std.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# bertforge's THRESHOLD_GRID: 0.01 to 0.99, of equally good thresholds the one nearest to 0.5.
GRID = sorted((k / 100 for k in range(1, 100)), key=lambda t: (abs(t - 0.5), t))


def read_tsv(path: Path, num_labels: int) -> tuple[list[str], list[list[int]]]:
    """GoEmotions' rows: text<TAB>comma-separated label ids<TAB>comment id; quotes are not special."""
    texts, labels = [], []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            text, ids, _ = line.rstrip("\n").split("\t")
            texts.append(text)
            row = [0] * num_labels
            for i in ids.split(","):
                row[int(i)] = 1
            labels.append(row)
    return texts, labels


def scores(probabilities, gold) -> dict[str, float]:
    """Macro- and micro-F1 at the global threshold (of GRID) that gives the best macro-F1."""
    import numpy as np

    try:  # bertforge's own tuning, when this commit has it: both sides scored by the same code
        from bertforge.tasks.multi_label import tune_thresholds  # type: ignore
    except ImportError:
        tune_thresholds = None

    def f1s(predicted):
        tp = (predicted & gold).sum(0)
        fp = (predicted & ~gold).sum(0)
        fn = (~predicted & gold).sum(0)
        per_label = np.where(2 * tp + fp + fn > 0, 2 * tp / np.maximum(2 * tp + fp + fn, 1), 0.0)
        micro = 2 * tp.sum() / max(2 * tp.sum() + fp.sum() + fn.sum(), 1)
        return float(per_label.mean()), float(micro)

    gold = gold.astype(bool)
    if tune_thresholds is not None:
        threshold = float(tune_thresholds(probabilities, gold)[0])
    else:
        threshold = max(GRID, key=lambda t: f1s(probabilities >= t)[0])
    macro, micro = f1s(probabilities >= threshold)
    return {"macro_f1": macro, "micro_f1": micro, "threshold": threshold}


def run_seed(args, seed: int) -> dict:
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

    names = Path(args.data_dir, "emotions.txt").read_text(encoding="utf-8").split("\n")
    names = [n for n in names if n]
    tokenizer = AutoTokenizer.from_pretrained(args.model)

    class Dataset(torch.utils.data.Dataset):
        def __init__(self, path: Path, limit: int | None = None):
            texts, labels = read_tsv(path, len(names))
            texts, labels = texts[:limit], labels[:limit]
            encoded = tokenizer(texts, truncation=True, max_length=args.max_seq_length,
                                padding=False if args.dynamic_padding else "max_length", return_token_type_ids=True)
            self.rows = [{k: encoded[k][i] for k in encoded} | {"labels": [float(v) for v in labels[i]]}
                         for i in range(len(texts))]

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return self.rows[i]

    train = Dataset(Path(args.data_dir, "train.tsv"), args.max_train_examples)
    dev = Dataset(Path(args.data_dir, "dev.tsv"))
    transformers.set_seed(seed)  # before the new classifier head is drawn, as run_glue.py does
    model = AutoModelForSequenceClassification.from_pretrained(
        args.model, num_labels=len(names), problem_type="multi_label_classification",
        id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    output_dir = Path(args.output_dir) / f"seed{seed}"
    output_dir.mkdir(parents=True, exist_ok=True)
    epoch = [0]

    def compute_metrics(prediction):
        epoch[0] += 1
        probabilities = 1 / (1 + np.exp(-prediction.predictions.astype(np.float64)))
        # The Trainer's order of the dev rows (not the file's, under group_by_length), with their gold labels
        np.savez(output_dir / f"dev_epoch{epoch[0]}.npz", probabilities=probabilities.astype(np.float32),
                 labels=prediction.label_ids > 0.5)
        return scores(probabilities, prediction.label_ids > 0.5)

    training_args = TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=128,
        learning_rate=args.lr, num_train_epochs=args.epochs, warmup_steps=0.1, weight_decay=0.01,  # a float: a ratio
        adam_epsilon=1e-6, max_grad_norm=1.0, lr_scheduler_type="linear", seed=seed, eval_strategy="epoch",
        save_strategy="no", logging_steps=50, report_to="none", use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=True, bf16=args.bf16,
        # transformers 5 spells 4.x's group_by_length=True this way (LengthGroupedSampler)
        **({"train_sampling_strategy": "group_by_length"} if args.group_by_length else {}))
    trainer = Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=dev,
                      compute_metrics=compute_metrics,
                      data_collator=transformers.DataCollatorWithPadding(tokenizer) if args.dynamic_padding else None)
    trainer.remove_callback(transformers.PrinterCallback)  # its log dicts would go to stdout, beside the JSON line
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    evals = [{k[len("eval_"):]: v for k, v in record.items() if k.startswith("eval_")} | {"epoch": record["epoch"]}
             for record in trainer.state.log_history if "eval_macro_f1" in record]
    best = max(evals, key=lambda r: r["macro_f1"])
    return {"seed": seed, "metrics": {m: best[m] for m in ("macro_f1", "micro_f1", "threshold")},
            "epoch": best["epoch"], "wall_seconds": wall,
            "evals": [{m: r[m] for m in ("epoch", "macro_f1", "micro_f1", "threshold")} for r in evals],
            "train_loss": [[r["step"], r["loss"]] for r in trainer.state.log_history if "loss" in r]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data-dir", required=True, help="GoEmotions: train.tsv, dev.tsv, emotions.txt")
    parser.add_argument("--output-dir", default="/tmp/multi_label_peer")
    parser.add_argument("--seeds", default="0", help="comma-separated")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--max-train-examples", type=int)
    parser.add_argument("--dynamic-padding", action="store_true", help="pad per batch")
    parser.add_argument("--group-by-length", action="store_true", help="train_sampling_strategy='group_by_length'")
    parser.add_argument("--bf16", action="store_true", help="TrainingArguments(bf16=True): bf16 autocast on the CPU")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch
    import transformers

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    runs = []
    for seed in args.seeds.split(","):  # each seed's result is kept on disk as soon as it is known
        runs.append(run_seed(args, int(seed)))
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
        Path(args.output_dir, f"seed{seed}.json").write_text(json.dumps(runs[-1]) + "\n")
    summary = {}
    for name in ("macro_f1", "micro_f1"):
        values = [r["metrics"][name] for r in runs]
        mean = sum(values) / len(values)
        std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
        summary[name] = {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": len(values)}
    print(json.dumps({"benchmark": "multi_label_peer", "framework": "transformers " + transformers.__version__,
                      "data": "goemotions", "lr": args.lr, "epochs": args.epochs, "batch_size": args.batch_size,
                      "max_seq_length": args.max_seq_length, "threads": args.threads,
                      "padding": "batch" if args.dynamic_padding else "max_length",
                      "group_by_length": args.group_by_length, "bf16": args.bf16, "summary": summary, "runs": runs}))


if __name__ == "__main__":
    main()
