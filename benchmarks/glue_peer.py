"""The peer's GLUE fine-tuning: transformers' `Trainer` + `AutoModelForSequenceClassification`.

Same checkpoint, data (read by bertforge's GLUE reader, so both see the same examples), sequence
length, hyperparameters and seeds as `bertforge finetune glue`: batch 32, AdamW (ε 1e-6, weight
decay 0.01), linear warm-up over 10% of the steps then linear decay, clipping at 1.0, evaluation at
each epoch's end, the best epoch's dev metric reported (bertforge keeps its best epoch's model too).
Inputs are padded to `--max-seq-length`, as the peer's `run_glue.py` does by default.

    python benchmarks/glue_peer.py --task mrpc --model DIR --data-dir ../shared/data/glue --seeds 42,43,44

Prints ONE JSON line: per seed the best epoch's metrics and the wall time, and mean/std/min/max.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def run_seed(args, seed: int) -> dict:
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

    from bertforge.metrics.glue import glue_metrics, main_metric
    from bertforge.tasks.glue_data import get_task, read_glue_examples

    spec = get_task(args.task)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    labels = spec.label_list
    label_map = None if labels is None else {label: i for i, label in enumerate(labels)}

    class Dataset(torch.utils.data.Dataset):
        def __init__(self, examples):
            pairs = examples[0].text_b is not None
            encoded = tokenizer([e.text_a for e in examples], [e.text_b for e in examples] if pairs else None,
                                truncation=True, max_length=args.max_seq_length,
                                padding="max_length" if not args.dynamic_padding else False,
                                return_token_type_ids=True)
            self.rows = [{k: encoded[k][i] for k in encoded} for i in range(len(examples))]
            for row, example in zip(self.rows, examples):
                row["labels"] = float(example.label) if label_map is None else label_map[example.label]

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return self.rows[i]

    train = Dataset(read_glue_examples(spec, args.data_dir, "train")[:args.max_train_examples])
    dev_split = spec.dev_splits[0]
    dev = Dataset(read_glue_examples(spec, args.data_dir, dev_split))
    transformers.set_seed(seed)  # before the new classifier head is drawn, as run_glue.py does
    model = AutoModelForSequenceClassification.from_pretrained(
        args.model, num_labels=spec.num_labels,
        problem_type="regression" if labels is None else "single_label_classification")

    def compute_metrics(prediction):
        logits = prediction.predictions
        predicted = logits[:, 0] if labels is None else np.argmax(logits, -1)
        return glue_metrics(spec.split(dev_split).metrics_task, predicted, prediction.label_ids)

    output_dir = Path(args.output_dir) / f"seed{seed}"
    training_args = TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=128,
        learning_rate=args.lr, num_train_epochs=args.epochs, warmup_steps=0.1, weight_decay=0.01,  # a float: a ratio
        adam_epsilon=1e-6, max_grad_norm=1.0, lr_scheduler_type="linear", seed=seed, eval_strategy="epoch",
        save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500, save_total_limit=1,
        logging_steps=50, report_to="none", use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=True, bf16=args.bf16,
        # transformers 5 spells 4.x's group_by_length=True this way (LengthGroupedSampler)
        **({"train_sampling_strategy": "group_by_length"} if args.group_by_length else {}))
    trainer = Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=dev,
                      compute_metrics=compute_metrics,
                      data_collator=transformers.DataCollatorWithPadding(tokenizer) if args.dynamic_padding else None)
    trainer.remove_callback(transformers.PrinterCallback)  # its log dicts would go to stdout, beside the JSON line
    steps_per_epoch = math.ceil(len(train) / args.batch_size)

    class SaveAfterEpochEvaluation(transformers.TrainerCallback):
        """A step checkpoint on an epoch's last step is taken after that epoch's evaluation instead of
        before it, so that a run resumed from it still knows the epoch's dev score."""

        def on_step_end(self, _args, state, control, **_):
            if state.global_step % steps_per_epoch == 0:
                control.should_save = False

        def on_epoch_end(self, _args, state, control, **_):
            control.should_save = True

    if args.save_steps:
        trainer.add_callback(SaveAfterEpochEvaluation)
    # A seed cut off mid-run (the process stopped) continues from its last checkpoint: the Trainer restores
    # the optimizer, schedule, RNG states and log history, and skips the batches already seen. It writes
    # trainer_state.json last, so a checkpoint without it was cut off while being written.
    complete = [c for c in output_dir.glob("checkpoint-*") if (c / "trainer_state.json").exists()]
    checkpoint = str(max(complete, key=lambda c: int(c.name.split("-")[1]))) if args.resume and complete else None
    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=checkpoint)
    wall = time.perf_counter() - started
    evals = [{k[len("eval_"):]: v for k, v in record.items() if k.startswith("eval_")} | {"epoch": record["epoch"]}
             for record in trainer.state.log_history if f"eval_{main_metric(spec.name)}" in record]
    best = max(evals, key=lambda r: r[main_metric(spec.name)])
    names = [m for m in best if m not in ("epoch", "loss", "runtime", "samples_per_second", "steps_per_second")]
    result = {"seed": seed, "metrics": {m: best[m] for m in names}, "epoch": best["epoch"], "wall_seconds": wall,
              # every epoch's dev metrics and the training loss every 50 steps, to compare runs' courses
              "evals": [{m: r[m] for m in ["epoch", *names] if m in r} for r in evals],
              "train_loss": [[r["step"], r["loss"]] for r in trainer.state.log_history if "loss" in r]}
    return result | ({"resumed_from": Path(checkpoint).name} if checkpoint else {})  # wall_seconds: the resumed part


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--output-dir", default="/tmp/glue_peer")
    parser.add_argument("--seeds", default="42", help="comma-separated")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--max-train-examples", type=int)
    parser.add_argument("--dynamic-padding", action="store_true", help="pad per batch (not the peer's default)")
    parser.add_argument("--group-by-length", action="store_true",
                        help="train_sampling_strategy='group_by_length' (4.x: group_by_length=True): "
                             "batches of similar lengths (with --dynamic-padding)")
    parser.add_argument("--bf16", action="store_true", help="TrainingArguments(bf16=True): bf16 autocast on the CPU")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--save-steps", type=int,
                        help="checkpoint every N steps, so that --resume continues a seed cut off mid-run")
    parser.add_argument("--resume", action="store_true",
                        help="reuse OUTPUT_DIR/seed{N}.json of seeds already run (an interrupted run's finished seeds)"
                             " and, with --save-steps, continue an unfinished seed from its last checkpoint")
    args = parser.parse_args()

    import torch
    import transformers

    from bertforge.training.finetune import describe

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    runs = []
    for seed in args.seeds.split(","):  # each seed's result is kept on disk as soon as it is known
        done = Path(args.output_dir) / f"seed{seed}.json"
        if args.resume and done.exists():
            runs.append(json.loads(done.read_text()))
            print(f"seed {seed}: reusing {done}", file=sys.stderr)
            continue
        runs.append(run_seed(args, int(seed)))
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps(runs[-1]) + "\n")
        for checkpoint in (Path(args.output_dir) / f"seed{seed}").glob("checkpoint-*"):
            shutil.rmtree(checkpoint)  # it only served --resume; ~3× the model's size, kept per seed otherwise
    names = sorted(set.intersection(*(set(r["metrics"]) for r in runs)))
    print(json.dumps({"benchmark": "glue_peer", "framework": "transformers " + transformers.__version__,
                      "task": args.task, "lr": args.lr, "epochs": args.epochs, "batch_size": args.batch_size,
                      "max_seq_length": args.max_seq_length, "threads": args.threads,
                      "padding": "batch" if args.dynamic_padding else "max_length",
                      "group_by_length": args.group_by_length, "bf16": args.bf16,
                      "summary": {n: describe([r["metrics"][n] for r in runs]) for n in names}, "runs": runs}))


if __name__ == "__main__":
    main()
