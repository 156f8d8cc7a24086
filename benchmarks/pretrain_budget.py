"""Pre-training under a fixed wall-clock budget: bertforge vs the peer, same data, config and recipe.

    python benchmarks/pretrain_budget.py --framework ours --train DIR --eval DIR --minutes 30 --out runs/ours
    python benchmarks/pretrain_budget.py --framework peer --train DIR --eval DIR --minutes 30 --out runs/peer

`ours` runs `bertforge pretrain` (run_pretraining, its own trainer); `peer` runs transformers'
`BertForPreTraining` in a plain loop: AdamW (β 0.9/0.999, ε 1e-6, weight decay 0.01 except LayerNorm
and biases), linear warm-up then linear decay over the same `--max-steps`, global-norm clipping at
1.0, the same batches in the same order (bertforge's epoch permutation). Both stop when the budget
is spent and evaluate on held-out instances every `--eval-every` steps and at the end: masked-LM
loss (mean over masked tokens), perplexity, masked-LM and NSP accuracy. Each writes OUT/log.jsonl
and prints ONE JSON line with its last evaluation.

    python benchmarks/pretrain_budget.py --framework ours --quick      # seconds: the test, backs no figure

`--quick`: the `tiny` preset for 4 steps (batch 8, evaluation every 2) on instances that
`prepare_pretraining` makes from Shakespeare's speeches with MiniLM's vocabulary (train and held-out
from different speeches), in a temporary directory that also holds OUT.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from _common import minilm_dir, quick_pretraining_data


def peer_run(args) -> dict:
    import torch
    import transformers

    from bertforge.modeling import BertConfig as OurConfig
    from bertforge.pretraining.dataset import PretrainingDataset, collate
    from bertforge.training.loop import epoch_permutation

    torch.manual_seed(args.seed)
    train, held_out = PretrainingDataset(args.train, seed=args.seed), PretrainingDataset(args.eval, seed=args.seed)
    ours = OurConfig.preset(args.config, vocab_size=train.index["vocab_size"])
    config = transformers.BertConfig(**{k: v for k, v in ours.to_dict().items()
                                        if k not in ("extra", "is_causal", "num_labels", "model_type")})
    model = transformers.BertForPreTraining(config)
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.999), eps=1e-6)
    warmup = args.warmup_steps

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (args.max_steps - step) / max(1, args.max_steps - warmup))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)

    def hf_batch(batch):
        labels = torch.full_like(batch["input_ids"], -100)
        valid = batch["masked_lm_labels"] != -100
        rows = torch.arange(len(labels))[:, None].expand_as(valid)
        labels[rows[valid], batch["masked_lm_positions"][valid]] = batch["masked_lm_labels"][valid]
        return dict(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                    attention_mask=batch["attention_mask"], labels=labels,
                    next_sentence_label=batch["next_sentence_label"])

    def evaluate() -> dict:
        model.eval()
        loss_sum = tokens = correct = nsp_correct = pairs = 0.0
        with torch.no_grad():
            for start in range(0, len(held_out), args.batch_size):
                batch = hf_batch(collate([held_out[i] for i in range(start, min(len(held_out), start + args.batch_size))]))
                out = model(**{k: v for k, v in batch.items() if k not in ("labels", "next_sentence_label")})
                mask = batch["labels"] != -100
                logits, labels = out.prediction_logits[mask], batch["labels"][mask]
                loss_sum += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
                tokens += float(mask.sum())
                correct += float((logits.argmax(-1) == labels).sum())
                nsp_correct += float((out.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"]).sum())
                pairs += len(batch["next_sentence_label"])
        model.train()
        loss = loss_sum / tokens
        return {"eval_mlm_loss": loss, "eval_perplexity": math.exp(loss), "eval_mlm_accuracy": correct / tokens,
                "eval_nsp_accuracy": nsp_correct / pairs}

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = (out_dir / "log.jsonl").open("w")
    model.train()
    step, epoch, started, last = 0, 0, time.perf_counter(), None
    budget, paused = args.minutes * 60, 0.0  # evaluation does not count against the budget (as in ours)

    def training_time() -> float:
        return time.perf_counter() - started - paused

    steps_per_epoch = len(train) // args.batch_size
    while step < args.max_steps and training_time() < budget:
        order = epoch_permutation(len(train), args.seed, epoch)
        for b in range(steps_per_epoch):
            if step >= args.max_steps or training_time() >= budget:
                break
            batch = hf_batch(collate([train[int(i)] for i in order[b * args.batch_size:(b + 1) * args.batch_size]]))
            out = model(**batch)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % args.log_every == 0:
                log.write(json.dumps({"step": step, "loss": out.loss.item(), "lr": scheduler.get_last_lr()[0],
                                      "elapsed": training_time()}) + "\n")
            if step % args.eval_every == 0:
                pause, elapsed = time.perf_counter(), training_time()  # evaluation does not count
                last = {"step": step, **evaluate(), "elapsed": elapsed}
                log.write(json.dumps(last) + "\n")
                log.flush()
                paused += time.perf_counter() - pause
        epoch += 1
    elapsed = training_time()
    last = {"step": step, **evaluate(), "elapsed": elapsed}
    log.write(json.dumps(last) + "\n")
    log.close()
    return last


def ours_run(args) -> dict:
    from bertforge.pretraining.trainer import PretrainingArguments, run_pretraining

    run_pretraining(PretrainingArguments(
        data=args.train, eval_data=args.eval, output_dir=args.out, config=args.config, vocab=args.vocab,
        batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup_steps, max_steps=args.max_steps,
        max_minutes=args.minutes, seed=args.seed, log_every=args.log_every, eval_every=args.eval_every,
        save_every=0, keep_last=1, num_threads=args.threads, progress=False))
    records = [json.loads(line) for line in (Path(args.out) / "log.jsonl").read_text().splitlines()]
    return [r for r in records if "eval_mlm_loss" in r][-1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=("ours", "peer"), required=True)
    parser.add_argument("--train", help="prepared instances (required unless --quick)")
    parser.add_argument("--eval", help="prepared held-out instances (required unless --quick)")
    parser.add_argument("--vocab", help="vocab.txt of the data (ours; default TRAIN/vocab.txt)")
    parser.add_argument("--out", help="the run's directory (required unless --quick)")
    parser.add_argument("--config", default="mini")
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--max-steps", type=int, default=20000, help="the schedule's length (decay to 0 there)")
    parser.add_argument("--warmup-steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="the tiny preset, 4 steps, toy data (the test)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    with contextlib.ExitStack() as stack:
        if args.quick:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pretrain-budget-")))
            args.train = str(quick_pretraining_data(scratch / "train", speeches=160))
            args.eval = str(quick_pretraining_data(scratch / "heldout", files=1, speeches=40))
            args.vocab, args.out = str(minilm_dir() / "vocab.txt"), str(scratch / "out")
            args.config, args.max_steps, args.warmup_steps, args.batch_size = "tiny", 4, 2, 8
            args.log_every, args.eval_every = 1, 2
        elif not (args.train and args.eval and args.out):
            parser.error("--train, --eval and --out are required (or --quick)")
        started = time.time()
        result = ours_run(args) if args.framework == "ours" else peer_run(args)
    print(json.dumps({"benchmark": "pretrain_budget", **({"quick": True} if args.quick else {}),
                      "framework": args.framework, "config": args.config,
                      "minutes": args.minutes, "threads": args.threads, "batch_size": args.batch_size, "lr": args.lr,
                      "seed": args.seed, "wall_seconds": round(time.time() - started, 1), **result}))


if __name__ == "__main__":
    sys.exit(main())
