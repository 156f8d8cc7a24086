"""The peer: transformers' `Trainer` side of every fine-tuning comparison, one module for every task family.

bertforge's fine-tuning is compared with Hugging Face transformers fine-tuning the same checkpoint on the same
data (`AutoModelFor...` + `Trainer`, as its `examples/pytorch` scripts do). What every family shares is here once:
the model loaded after seeding (the new head's draw); `TrainingArguments` at the peer's recipe (the family's
learning rate, batch size and epochs; linear warm-up over 10% of the steps then linear decay, weight decay 0.01,
clipping at 1.0, AdamW's ε 1e-6 as the paper, Google's BERT and bertforge, `--adam-epsilon` to change it; batch
order random or `group_by_length`; bf16 autocast where the family offers `--bf16`); threads; `trainer.train`
timed with stdout sent to stderr (stdout carries ONE JSON line); each epoch's evaluation records; each seed's
result written to OUT/seed{N}.json as soon as it is known. A family declares the rest: its flags and defaults
(those of `bertforge finetune FAMILY`), reader, model class, collator, metrics and JSON line (`--help` per family).

    python benchmarks/peer.py glue --task mrpc --model DIR --data-dir ../shared/data/glue --seeds 42,43,44
    python benchmarks/peer.py multi-label --model DIR --data-dir ../shared/data/goemotions --seeds 0,1,2
    python benchmarks/peer.py ner --model DIR --output-dir runs/ner_peer --seeds 3
    python benchmarks/peer.py squad --model DIR --train-file T.json --dev-file D.json --output-dir runs/squad_peer

`benchmarks/glue_peer.py`, `multi_label_peer.py`, `ner_peer.py` and `squad_peer.py` run these under the names the
results and other benchmarks cite (`python benchmarks/glue_peer.py --task ...` is `peer.py glue --task ...`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import inspect
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, NamedTuple, Sequence

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # bertforge (and this package), also where it is not installed

from benchmarks._common import log  # noqa: E402

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer, TrainingArguments

ADAM_EPSILON = 1e-6  # the paper's, Google's BERT's and bertforge's; torch's and transformers' default is 1e-8
CONLL = REPO.parent / "shared" / "data" / "conll2003"
# Keys of an evaluation record that are bookkeeping, not metrics
BOOKKEEPING = ("epoch", "loss", "runtime", "samples_per_second", "steps_per_second")


# ---------------------------------------------------------------------------- what every family shares

def setup(threads: int | None) -> None:
    """torch's threads (when given), transformers' warnings off, and the tokenizers library single-threaded:
    the peer's process uses the threads it is given and writes nothing to stdout but its JSON line."""
    import torch
    import transformers

    if threads:
        torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load_model(auto_class: str, path: str, seed: int, **config: Any) -> PreTrainedModel:
    """`transformers.AUTO_CLASS.from_pretrained(path, **config)` after seeding every random generator with
    `seed`: the new head is drawn the same way for the same seed (as run_glue.py does)."""
    import transformers

    transformers.set_seed(seed)
    return getattr(transformers, auto_class).from_pretrained(path, **config)


def training_arguments(args: argparse.Namespace, output_dir: Path, seed: int, **settings: Any) -> TrainingArguments:
    """The peer's `TrainingArguments`: the recipe every family shares, read from `args` (lr, batch_size, epochs,
    warmup_ratio, weight_decay, adam_epsilon, sampling, bf16, device, progress), plus the family's `settings`
    (how it evaluates, logs and saves)."""
    import torch
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(output_dir), learning_rate=args.lr, per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs, warmup_steps=args.warmup_ratio,  # a float below 1: a ratio of the steps
        weight_decay=args.weight_decay, adam_epsilon=args.adam_epsilon, max_grad_norm=1.0,
        lr_scheduler_type="linear", seed=seed, report_to="none", dataloader_num_workers=0,
        disable_tqdm=not args.progress, bf16=args.bf16, train_sampling_strategy=args.sampling,
        use_cpu=args.device == "cpu" or not torch.cuda.is_available(), **settings)


def make_trainer(args: argparse.Namespace, output_dir: Path, seed: int, model: PreTrainedModel,
                 train: Sequence[dict], *, collator: Callable | None = None, evaluate: Sequence[dict] | None = None,
                 compute_metrics: Callable | None = None, callbacks: Iterable = (), trainer_logs: bool = True,
                 **settings: Any) -> Trainer:
    """The family's `Trainer` over rows of features (dicts). `trainer_logs=False` drops the Trainer's printed
    log dicts (the families that log every 50 steps); the others go to stderr (`timed_train`)."""
    import transformers

    trainer = transformers.Trainer(
        model=model, args=training_arguments(args, output_dir, seed, **settings), train_dataset=train,
        eval_dataset=evaluate, compute_metrics=compute_metrics, data_collator=collator, callbacks=list(callbacks))
    if not trainer_logs:
        trainer.remove_callback(transformers.PrinterCallback)
    return trainer


class Clock:
    """When `timed_train` started `trainer.train`, for callbacks that report the time within the run."""

    start: float = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def timed_train(trainer: Trainer, clock: Clock | None = None, resume: str | None = None) -> float:
    """`trainer.train(resume_from_checkpoint=resume)`'s wall seconds (evaluations inside it included), with
    whatever the Trainer prints sent to stderr: stdout is for the JSON line."""
    clock = clock or Clock()
    with contextlib.redirect_stdout(sys.stderr):
        clock.start = time.perf_counter()
        trainer.train(resume_from_checkpoint=resume)
    return clock.elapsed()


def evaluations(trainer: Trainer, metric: str) -> list[dict]:
    """Every evaluation the Trainer logged with `metric` (also those before the checkpoint a run resumed from:
    the log history comes back with it): the epoch, then each value without its "eval_" prefix."""
    return [{"epoch": record["epoch"], **{k[len("eval_"):]: v for k, v in record.items() if k.startswith("eval_")}}
            for record in trainer.state.log_history if f"eval_{metric}" in record]


def run_seeds(seeds: Iterable[int], output_dir: Path, run_seed: Callable[[int], dict], resume: bool = False
              ) -> list[dict]:
    """`run_seed(seed)` for each seed, each result written to OUTPUT_DIR/seed{N}.json as soon as it is known
    (with `resume`, a seed whose file exists is read back instead of run again); a seed's checkpoints, which
    only served a resumed run, are removed once its result is written."""
    runs = []
    for seed in seeds:
        done = output_dir / f"seed{seed}.json"
        if resume and done.exists():
            runs.append(json.loads(done.read_text()))
            log(f"seed {seed}: reusing {done}")
            continue
        runs.append(run_seed(seed))
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps(runs[-1]) + "\n")
        for checkpoint in (output_dir / f"seed{seed}").glob("checkpoint-*"):
            shutil.rmtree(checkpoint)  # ~3× the model's size each
    return runs


def epsilon_record(args: argparse.Namespace) -> dict:
    """{"adam_epsilon": ε} where `--adam-epsilon` changed it, else nothing (the JSON of a run at the paper's
    ε keeps the keys it always had)."""
    return {} if args.adam_epsilon == ADAM_EPSILON else {"adam_epsilon": args.adam_epsilon}


def add_epsilon_flag(parser: argparse.ArgumentParser) -> None:
    """`--adam-epsilon`, every family's."""
    parser.add_argument("--adam-epsilon", type=float, default=ADAM_EPSILON,
                        help="AdamW's epsilon (default the paper's 1e-6; torch's and transformers' is 1e-8)")


# ---------------------------------------------------------------------------- sequence classification

def classification_flags(parser: argparse.ArgumentParser, output_dir: str, seeds: str, lr: float) -> None:
    """The flags GLUE and multi-label share (the recipe of `bertforge finetune glue`: batch 32, 3 epochs, 128
    tokens), the peer padding to the maximum length unless `--dynamic-padding`; their fixed settings."""
    parser.add_argument("--model", required=True)
    parser.add_argument("--output-dir", default=output_dir)
    parser.add_argument("--seeds", default=seeds, help="comma-separated")
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--max-train-examples", type=int)
    parser.add_argument("--dynamic-padding", action="store_true", help="pad per batch (not the peer's default)")
    parser.add_argument("--group-by-length", dest="sampling", action="store_const", const="group_by_length",
                        default="random", help="train_sampling_strategy='group_by_length' (4.x: group_by_length="
                                               "True): batches of similar lengths (with --dynamic-padding)")
    parser.add_argument("--bf16", action="store_true", help="TrainingArguments(bf16=True): bf16 autocast on the CPU")
    parser.add_argument("--threads", type=int, default=2)
    add_epsilon_flag(parser)
    parser.set_defaults(warmup_ratio=0.1, weight_decay=0.01, eval_batch_size=128, device="cpu", progress=False,
                        save_steps=None, resume=False)


def classification_rows(tokenizer: PreTrainedTokenizerBase, texts: list[str], pairs: list[str] | None, labels: list,
                        args: argparse.Namespace) -> list[dict]:
    """Each text (and its pair) tokenized, cut at --max-seq-length and padded to it unless --dynamic-padding
    (then the collator pads each batch), with its label."""
    encoded = tokenizer(texts, pairs, truncation=True, max_length=args.max_seq_length,
                        padding=False if args.dynamic_padding else "max_length", return_token_type_ids=True)
    return [{k: encoded[k][i] for k in encoded} | {"labels": labels[i]} for i in range(len(texts))]


def classify(args: argparse.Namespace, seed: int, tokenizer: PreTrainedTokenizerBase, train: list[dict],
             dev: list[dict], compute_metrics: Callable, metric: str, config: dict,
             names: Sequence[str] | None = None, checkpoints: bool = False) -> dict:
    """One seed of `AutoModelForSequenceClassification` + `Trainer`: an evaluation at each epoch's end, the best
    epoch by `metric` reported with its `names` (default: every metric of the evaluation), every epoch's, the
    training loss every 50 steps and the wall time of `trainer.train`. With `checkpoints` (GLUE), `--save-steps`
    checkpoints every N steps and `--resume` continues a seed cut off mid-run from its last one."""
    from transformers import DataCollatorWithPadding, TrainerCallback

    output_dir = Path(args.output_dir) / f"seed{seed}"
    model = load_model("AutoModelForSequenceClassification", args.model, seed, **config)
    steps_per_epoch = math.ceil(len(train) / args.batch_size)

    class SaveAfterEpochEvaluation(TrainerCallback):
        """A step checkpoint on an epoch's last step is taken after that epoch's evaluation instead of
        before it, so that a run resumed from it still knows the epoch's dev score."""

        def on_step_end(self, _args, state, control, **_):
            if state.global_step % steps_per_epoch == 0:
                control.should_save = False

        def on_epoch_end(self, _args, state, control, **_):
            control.should_save = True

    saving = dict(save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500,
                  save_total_limit=1) if checkpoints else dict(save_strategy="no")
    trainer = make_trainer(
        args, output_dir, seed, model, train, evaluate=dev, compute_metrics=compute_metrics,
        collator=DataCollatorWithPadding(tokenizer) if args.dynamic_padding else None, trainer_logs=False,
        callbacks=[SaveAfterEpochEvaluation()] if args.save_steps else [],
        per_device_eval_batch_size=args.eval_batch_size, eval_strategy="epoch", logging_steps=50, **saving)
    # A seed cut off mid-run (the process stopped) continues from its last checkpoint: the Trainer restores
    # the optimizer, schedule, RNG states and log history, and skips the batches already seen. It writes
    # trainer_state.json last, so a checkpoint without it was cut off while being written.
    complete = [c for c in output_dir.glob("checkpoint-*") if (c / "trainer_state.json").exists()]
    checkpoint = str(max(complete, key=lambda c: int(c.name.split("-")[1]))) if args.resume and complete else None
    wall = timed_train(trainer, resume=checkpoint)
    evals = evaluations(trainer, metric)
    best = max(evals, key=lambda r: r[metric])
    names = names or [m for m in best if m not in BOOKKEEPING]
    result = {"seed": seed, "metrics": {m: best[m] for m in names}, "epoch": best["epoch"], "wall_seconds": wall,
              "evals": [{m: r[m] for m in ["epoch", *names] if m in r} for r in evals],
              # the training loss every 50 steps, to compare runs' courses
              "train_loss": [[r["step"], r["loss"]] for r in trainer.state.log_history if "loss" in r]}
    return result | ({"resumed_from": Path(checkpoint).name} if checkpoint else {})  # wall_seconds: the resumed part


def classification_report(args: argparse.Namespace, run_seed: Callable[[int], dict], benchmark: str, source: dict,
                          summarised: Sequence[str] | None = None) -> None:
    """Run every seed of --seeds and print the ONE JSON line: the settings, each `summarised` metric's summary
    over seeds (default: every metric all seeds report) and each seed's run."""
    import transformers

    from bertforge.training.finetune import describe

    setup(args.threads)
    runs = run_seeds([int(s) for s in args.seeds.split(",")], Path(args.output_dir), run_seed, resume=args.resume)
    names = summarised or sorted(set.intersection(*(set(r["metrics"]) for r in runs)))
    print(json.dumps({"benchmark": benchmark, "framework": "transformers " + transformers.__version__, **source,
                      "lr": args.lr, "epochs": args.epochs, "batch_size": args.batch_size,
                      "max_seq_length": args.max_seq_length, "threads": args.threads,
                      "padding": "batch" if args.dynamic_padding else "max_length",
                      "group_by_length": args.sampling == "group_by_length", "bf16": args.bf16, **epsilon_record(args),
                      "summary": {n: describe([r["metrics"][n] for r in runs]) for n in names}, "runs": runs}))


# ---------------------------------------------------------------------------- GLUE

def glue_flags(parser: argparse.ArgumentParser) -> None:
    """GLUE's flags: the task, its data, the classification flags, and checkpoints to resume from."""
    parser.add_argument("--task", required=True)
    parser.add_argument("--data-dir", required=True)
    classification_flags(parser, output_dir="/tmp/glue_peer", seeds="42", lr=2e-5)
    parser.add_argument("--save-steps", type=int,
                        help="checkpoint every N steps, so that --resume continues a seed cut off mid-run")
    parser.add_argument("--resume", action="store_true",
                        help="reuse OUTPUT_DIR/seed{N}.json of seeds already run (an interrupted run's finished seeds)"
                             " and, with --save-steps, continue an unfinished seed from its last checkpoint")


def glue(args: argparse.Namespace) -> None:
    """The peer's GLUE fine-tuning: transformers' `Trainer` + `AutoModelForSequenceClassification`.

    Same checkpoint, data (read by bertforge's GLUE reader, so both see the same examples), sequence length,
    hyperparameters and seeds as `bertforge finetune glue` (batch 32, 3 epochs); evaluation at each epoch's end,
    the best epoch's dev metric reported (bertforge keeps its best epoch's model too). Inputs are padded to
    `--max-seq-length`, as the peer's `run_glue.py` does by default; the peer at its best CPU settings:
    `--dynamic-padding --group-by-length --bf16`. `--save-steps N --resume` continues a run cut off mid-way.

        python benchmarks/glue_peer.py --task mrpc --model DIR --data-dir ../shared/data/glue --seeds 42,43,44

    Prints ONE JSON line: per seed the best epoch's metrics, every epoch's, the training loss every 50 steps and
    the wall time of `trainer.train`, and mean/std/min/max over seeds.
    """
    from transformers import AutoTokenizer

    from bertforge.metrics.glue import glue_metrics, main_metric
    from bertforge.tasks.glue_data import get_task, read_glue_examples

    spec = get_task(args.task)
    labels = spec.label_list
    label_map = None if labels is None else {label: i for i, label in enumerate(labels)}
    dev_split = spec.dev_splits[0]

    def run_seed(seed: int) -> dict:
        tokenizer = AutoTokenizer.from_pretrained(args.model)

        def rows(examples) -> list[dict]:
            pairs = examples[0].text_b is not None
            return classification_rows(
                tokenizer, [e.text_a for e in examples], [e.text_b for e in examples] if pairs else None,
                [float(e.label) if label_map is None else label_map[e.label] for e in examples], args)

        def compute_metrics(prediction) -> dict:
            logits = prediction.predictions
            predicted = logits[:, 0] if labels is None else np.argmax(logits, -1)
            return glue_metrics(spec.split(dev_split).metrics_task, predicted, prediction.label_ids)

        train = rows(read_glue_examples(spec, args.data_dir, "train")[:args.max_train_examples])
        dev = rows(read_glue_examples(spec, args.data_dir, dev_split))
        config = dict(num_labels=spec.num_labels,
                      problem_type="regression" if labels is None else "single_label_classification")
        return classify(args, seed, tokenizer, train, dev, compute_metrics, main_metric(spec.name), config,
                        checkpoints=True)

    classification_report(args, run_seed, "glue_peer", {"task": args.task})


# ---------------------------------------------------------------------------- multi-label (GoEmotions)

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


def scores(probabilities: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Macro- and micro-F1 at the global threshold (of GRID) that gives the best macro-F1."""
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


def multi_label_flags(parser: argparse.ArgumentParser) -> None:
    """Multi-label's flags: GoEmotions' folder and the classification flags (lr 5e-5, seed 0)."""
    parser.add_argument("--data-dir", required=True, help="GoEmotions: train.tsv, dev.tsv, emotions.txt")
    classification_flags(parser, output_dir="/tmp/multi_label_peer", seeds="0", lr=5e-5)


def multi_label(args: argparse.Namespace) -> None:
    """The peer's multi-label fine-tuning: transformers' `Trainer` + `AutoModelForSequenceClassification` with
    `problem_type="multi_label_classification"` (sigmoid + binary cross-entropy), on GoEmotions' TSV.

    The recipe of `bertforge finetune multi-label` (batch 32, 3 epochs, 128 tokens), an evaluation at each epoch's
    end, the best epoch kept. The peer at its best CPU settings: `--dynamic-padding --group-by-length --bf16`. At
    each evaluation the decision threshold is tuned on dev the same way as bertforge (one global threshold from
    0.01, 0.02, ..., 0.99, the one with the best macro-F1: bertforge's own `bertforge.tasks.multi_label.
    tune_thresholds`, when it is importable, else the same grid here), and every epoch's dev probabilities and gold
    labels are saved beside the run (`seed{N}/dev_epoch{E}.npz`, in the Trainer's order of the rows) so that the
    scores can be recomputed.

        python benchmarks/multi_label_peer.py --model DIR --data-dir ../shared/data/goemotions --seeds 0,1,2 \\
            --lr 5e-5 --bf16 --dynamic-padding --group-by-length

    Prints ONE JSON line: per seed the best epoch's metrics and the wall time of `trainer.train`, and mean/std;
    each seed's result also goes to stderr as soon as it is known.
    """
    from transformers import AutoTokenizer

    names = [n for n in Path(args.data_dir, "emotions.txt").read_text(encoding="utf-8").split("\n") if n]

    def run_seed(seed: int) -> dict:
        tokenizer = AutoTokenizer.from_pretrained(args.model)

        def rows(path: Path, limit: int | None = None) -> list[dict]:
            texts, labels = read_tsv(path, len(names))
            texts, labels = texts[:limit], labels[:limit]
            return classification_rows(tokenizer, texts, None, [[float(v) for v in row] for row in labels], args)

        train = rows(Path(args.data_dir, "train.tsv"), args.max_train_examples)
        dev = rows(Path(args.data_dir, "dev.tsv"))
        output_dir = Path(args.output_dir) / f"seed{seed}"
        output_dir.mkdir(parents=True, exist_ok=True)
        epoch = [0]

        def compute_metrics(prediction) -> dict:
            epoch[0] += 1
            probabilities = 1 / (1 + np.exp(-prediction.predictions.astype(np.float64)))
            # The Trainer's order of the dev rows (not the file's, under group_by_length), with their gold labels
            np.savez(output_dir / f"dev_epoch{epoch[0]}.npz", probabilities=probabilities.astype(np.float32),
                     labels=prediction.label_ids > 0.5)
            return scores(probabilities, prediction.label_ids > 0.5)

        config = dict(num_labels=len(names), problem_type="multi_label_classification",
                      id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
        result = classify(args, seed, tokenizer, train, dev, compute_metrics, "macro_f1", config,
                          names=("macro_f1", "micro_f1", "threshold"))
        print(json.dumps(result), file=sys.stderr, flush=True)
        return result

    classification_report(args, run_seed, "multi_label_peer", {"data": "goemotions"},
                          summarised=("macro_f1", "micro_f1"))


# ---------------------------------------------------------------------------- NER and SQuAD's shared flags

def trainer_flags(parser: argparse.ArgumentParser, unit: str, script: str) -> None:
    """The flags NER and SQuAD share, with `bertforge finetune ner`'s and `squad`'s defaults (`unit`: what an
    example is; `script`: the transformers example whose batch order is the default)."""
    parser.add_argument("--model", required=True, help="checkpoint directory (the one given to bertforge)")
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--eval-batch-size", type=int, default=128)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    add_epsilon_flag(parser)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--max-train-examples", type=int, help=f"first N training {unit} (smoke runs)")
    parser.add_argument("--max-eval-examples", type=int, help=f"first N eval {unit} (smoke runs)")
    parser.add_argument("--num-threads", dest="threads", type=int, help="torch threads")
    parser.add_argument("--device", help="cpu to force the CPU (default: the GPU if there is one)")
    parser.add_argument("--progress", action="store_true", help="transformers' progress bars")
    parser.set_defaults(bf16=False)
    parser.add_argument("--sampling", default="random", choices=("random", "group_by_length"),
                        help=f"batch order: random as {script} (default), or group_by_length as bertforge's "
                             "--group-by-length")


def hyperparameters(args: argparse.Namespace, names: Sequence[str]) -> dict:
    """The settings a NER or SQuAD summary records (and ε where --adam-epsilon changed it)."""
    return {k: getattr(args, k) for k in names} | epsilon_record(args)


# ---------------------------------------------------------------------------- NER (CoNLL)

def ner_flags(parser: argparse.ArgumentParser) -> None:
    """NER's flags: the CoNLL files (default: ../shared/data/conll2003), `bertforge finetune ner`'s defaults."""
    parser.add_argument("--train-file", default=str(CONLL / "train.txt"))
    parser.add_argument("--dev-file", default=str(CONLL / "valid.txt"))
    trainer_flags(parser, "sentences", "run_ner")
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--seeds", type=int, default=1, help="seeds --seed, --seed+1, ... (as bertforge --seeds)")


def encode_words(tokenizer: PreTrainedTokenizerBase, sentences: Sequence, label_map: dict[str, int],
                 max_length: int) -> list[dict]:
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


def decode_words(predictions: np.ndarray, rows: list[dict], sentences: Sequence, labels: list[str]) -> list[list[str]]:
    """Each word's tag from its first sub-token (the labelled positions, in word order); "O" for words
    cut off by truncation."""
    tags = []
    for prediction, row, sentence in zip(predictions, rows, sentences):
        first = [i for i, label in enumerate(row["labels"]) if label != -100]
        words = [labels[int(prediction[i])] for i in first]
        tags.append(words + ["O"] * (len(sentence) - len(words)))
    return tags


def ner(args: argparse.Namespace) -> int:
    """The peer's CoNLL NER fine-tune: Hugging Face transformers `AutoModelForTokenClassification` + `Trainer`.

    What Hugging Face's `examples/pytorch/token-classification/run_ner.py` does, on the same files, checkpoint,
    hyperparameters, seeds and maximum length as `bertforge finetune ner`, scored with bertforge's metric
    (`bertforge.tasks.conll.ner_metrics`, conlleval semantics), so the two numbers are comparable:

    * words tokenized with `is_split_into_words=True`, truncated to `--max-seq-length`; the first sub-token
      of each word carries its label, the other sub-tokens -100 (run_ner's `label_all_tokens=False`);
    * evaluation at the end of each epoch and the best epoch's entity F1 reported (bertforge keeps the best
      epoch's model the same way); batch order random as run_ner, or `--sampling group_by_length`;
    * scoring: every dev word gets a tag; a word cut off by truncation (none at 128 tokens on CoNLL dev
      without document context, barely any in train) is predicted "O", so the gold side is the whole dev file.

    The peer has no document context: compare it with `bertforge finetune ner` without `--document-context`.
    Exactly one JSON line goes to stdout (per-seed best F1 and epoch, mean/std over seeds, seconds);
    OUT/summary.json holds the same with every epoch's metrics (OUT/seed{N}.json: each seed's, once known).

        python benchmarks/ner_peer.py --model MINILM --output-dir runs/ner_peer --seeds 3
        python benchmarks/ner_peer.py --model MINILM --output-dir /tmp/p --max-train-examples 64 \\
            --max-eval-examples 32 --epochs 1 --seeds 1          # a smoke run
    """
    from transformers import AutoTokenizer, DataCollatorForTokenClassification

    from bertforge.tasks.conll import label_list_from, ner_metrics, read_conll
    from bertforge.training.finetune import describe

    setup(args.threads)
    train = read_conll(args.train_file)[:args.max_train_examples]
    dev = read_conll(args.dev_file)[:args.max_eval_examples]
    labels = label_list_from(train)
    label_map = {label: i for i, label in enumerate(labels)}
    gold = [s.tags for s in dev]
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    def run_seed(seed: int) -> dict:
        log(f"peer: seed {seed}, {len(train)} training and {len(dev)} dev sentences")
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        train_rows = encode_words(tokenizer, train, label_map, args.max_seq_length)
        dev_rows = encode_words(tokenizer, dev, label_map, args.max_seq_length)
        truncated = sum(sum(label != -100 for label in r["labels"]) < len(s) for r, s in zip(dev_rows, dev))

        def compute_metrics(prediction) -> dict:
            logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
            return ner_metrics(gold, decode_words(logits.argmax(-1), dev_rows, dev, labels))

        model = load_model("AutoModelForTokenClassification", args.model, seed, num_labels=len(labels),
                           id2label=dict(enumerate(labels)), label2id=label_map)
        trainer = make_trainer(
            args, output_dir / f"seed{seed}", seed, model, train_rows, evaluate=dev_rows,
            compute_metrics=compute_metrics, collator=DataCollatorForTokenClassification(tokenizer),
            per_device_eval_batch_size=args.eval_batch_size, data_seed=seed, eval_strategy="epoch",
            save_strategy="no", logging_strategy="epoch")
        seconds = timed_train(trainer)
        history = evaluations(trainer, "f1")
        best = max(history, key=lambda h: h["f1"])
        log(f"peer: seed {seed}: best dev F1 {best['f1']:.4f} at epoch {best['epoch']:g} ({seconds:.0f} s)")
        return {"seed": seed, "f1": best["f1"], "best_epoch": best["epoch"], "seconds": seconds,
                "dev_sentences_truncated": truncated, "epochs": history}

    runs = run_seeds(range(args.seed, args.seed + args.seeds), output_dir, run_seed)
    summary = {"peer": "transformers AutoModelForTokenClassification + Trainer", "model": args.model,
               "train_sentences": len(train), "dev_sentences": len(dev),
               "hyperparameters": hyperparameters(args, ("lr", "epochs", "batch_size", "max_seq_length",
                                                         "warmup_ratio", "weight_decay", "sampling")),
               "f1": describe([r["f1"] for r in runs]), "runs": runs}
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}
                     | {"runs": [{k: r[k] for k in ("seed", "f1", "best_epoch", "seconds")} for r in runs]}))
    return 0


# ---------------------------------------------------------------------------- SQuAD (run_qa's layout)

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


def windows(examples: list[dict], tokenizer: PreTrainedTokenizerBase, max_seq_length: int, doc_stride: int
            ) -> Any:
    """run_qa.py's tokenization of both kinds of features: question (its leading spaces stripped) and passage
    together, only the passage cut, overflowing windows kept (`stride`: the tokens two windows share), with
    offsets and the window -> question mapping."""
    questions = [e["question"].lstrip() for e in examples]
    return tokenizer(questions, [e["context"] for e in examples], truncation="only_second",
                     max_length=max_seq_length, stride=doc_stride, return_overflowing_tokens=True,
                     return_offsets_mapping=True, padding=False)


def prepare_train_features(examples: list[dict], tokenizer: PreTrainedTokenizerBase, max_seq_length: int,
                           doc_stride: int) -> list[dict]:
    """run_qa.py's prepare_train_features (pad_on_right: the question first)."""
    tokenized = windows(examples, tokenizer, max_seq_length, doc_stride)
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


def prepare_validation_features(examples: list[dict], tokenizer: PreTrainedTokenizerBase, max_seq_length: int,
                                doc_stride: int) -> list[dict]:
    """run_qa.py's prepare_validation_features: offsets of non-passage tokens set to None."""
    tokenized = windows(examples, tokenizer, max_seq_length, doc_stride)
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


def postprocess_qa_predictions(examples: list[dict], features: list[dict], predictions: tuple[Sequence, Sequence],
                               version_2_with_negative: bool = False, n_best_size: int = 20,
                               max_answer_length: int = 30, null_score_diff_threshold: float = 0.0
                               ) -> tuple[dict, dict, dict]:
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
        scores_ = np.array([pred.pop("score") for pred in predictions_])
        exp_scores = np.exp(scores_ - np.max(scores_))
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
            all_predictions[example["id"]] = ("" if score_diff > null_score_diff_threshold
                                              else best_non_null_pred["text"])
        all_nbest_json[example["id"]] = [{k: (float(v) if isinstance(v, (np.floating, float)) else v)
                                          for k, v in pred.items()} for pred in predictions_]
    return all_predictions, all_nbest_json, scores_diff_json


def predict(model: PreTrainedModel, features: list[dict], tokenizer: PreTrainedTokenizerBase, batch_size: int
            ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Start and end logits of every feature (its own length), in feature order."""
    import torch
    from transformers import DataCollatorWithPadding

    collator = DataCollatorWithPadding(tokenizer)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    starts, ends = [], []
    keys = ("input_ids", "token_type_ids", "attention_mask")
    with torch.no_grad():
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


def squad_flags(parser: argparse.ArgumentParser) -> None:
    """SQuAD's flags: the files and version, `bertforge finetune squad`'s defaults, run_qa's post-processing."""
    parser.add_argument("--train-file", required=True, help="e.g. the train.json of scripts/split_squad.py")
    parser.add_argument("--dev-file", required=True, help="e.g. the eval.json of scripts/split_squad.py")
    parser.add_argument("--version", choices=("1.1", "2.0"), default="2.0")
    trainer_flags(parser, "questions", "run_qa")
    # bertforge finetune squad's defaults (epochs and batch size: per version, as there)
    parser.add_argument("--epochs", type=float, help="default 3 (v1.1) or 2 (v2.0)")
    parser.add_argument("--batch-size", type=int, help="default 32 (v1.1) or 48 (v2.0)")
    parser.add_argument("--max-seq-length", type=int, default=384)
    parser.add_argument("--doc-stride", type=int, default=128)
    parser.add_argument("--n-best-size", type=int, default=20)
    parser.add_argument("--max-answer-length", type=int, default=30)
    parser.add_argument("--null-score-diff-threshold", type=float, default=0.0)


def squad(args: argparse.Namespace) -> int:
    """The peer's SQuAD fine-tune: Hugging Face transformers `AutoModelForQuestionAnswering` + `Trainer`.

    What Hugging Face's `examples/pytorch/question-answering/run_qa.py` does (its `prepare_train_features`,
    `prepare_validation_features` and `utils_qa.postprocess_qa_predictions`, reproduced in benchmarks/peer.py),
    on the same split, checkpoint, hyperparameters and maximum length as `bertforge finetune squad`, with the
    predictions scored by bertforge's metrics module (`bertforge.metrics.squad`, equal to the official scripts),
    so that the numbers sit side by side:

    * question and passage tokenized together, `truncation="only_second"`, `max_length=--max-seq-length`,
      `stride=--doc-stride`, overflowing windows kept; note that the tokenizers library's `stride` is the
      number of tokens two windows SHARE, where Google's (and bertforge's) `doc_stride` is the step between
      their starts: with the same number, long passages get fewer windows here (run_qa's standard behaviour,
      kept as it is). The question is not cut separately (run_qa has no max_query_length).
    * training targets: the first answer's token span when the window holds it, else [CLS]; batch order random
      as run_qa (or grouped by length as bertforge's `--group-by-length`, `--sampling group_by_length`);
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
        python benchmarks/squad_peer.py --model MINILM --train-file /tmp/squad-split/train.json \\
            --dev-file /tmp/squad-split/eval.json --version 2.0 --output-dir runs/squad_peer
    """
    v2 = args.version == "2.0"
    args.epochs = args.epochs if args.epochs is not None else (2.0 if v2 else 3.0)
    args.batch_size = args.batch_size if args.batch_size is not None else (48 if v2 else 32)
    setup(args.threads)
    from transformers import AutoTokenizer, DataCollatorWithPadding, TrainerCallback

    from bertforge.metrics.squad import evaluate_v1, evaluate_v2, squad_metrics

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
    clock = Clock()

    def evaluate(model, epoch: float) -> None:
        """Score the dev file after an epoch; the history records the wall time at the epoch's end
        (`elapsed_seconds`, training and earlier evaluations) and this evaluation's own seconds."""
        elapsed = clock.elapsed()
        logits = predict(model, dev_features, tokenizer, args.eval_batch_size)
        predictions, nbest, null_odds = postprocess_qa_predictions(
            dev_examples, dev_features, logits, v2, args.n_best_size, args.max_answer_length,
            args.null_score_diff_threshold)
        official = evaluate_v2(dev_data, predictions, null_odds) if v2 else evaluate_v1(dev_data, predictions)
        metrics = squad_metrics(dev_data, predictions, args.version, null_odds if v2 else None)
        history.append({"epoch": epoch, **metrics, "elapsed_seconds": round(elapsed, 2),
                        "eval_seconds": round(clock.elapsed() - elapsed, 2)})
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

    model = load_model("AutoModelForQuestionAnswering", args.model, args.seed)
    trainer = make_trainer(args, output_dir / "trainer", args.seed, model, train_features,
                           collator=DataCollatorWithPadding(tokenizer), callbacks=[EvaluateEachEpoch()],
                           data_seed=args.seed, eval_strategy="no", save_strategy="no", logging_strategy="epoch")
    seconds = timed_train(trainer, clock)
    summary = {"peer": "transformers AutoModelForQuestionAnswering + Trainer (run_qa preprocessing, utils_qa "
                       "post-processing)", "model": args.model, "version": args.version,
               "train_questions": len(train_examples), "train_windows": len(train_features),
               "eval_questions": len(dev_examples), "eval_windows": len(dev_features),
               "hyperparameters": hyperparameters(args, (
                   "lr", "epochs", "batch_size", "max_seq_length", "doc_stride", "n_best_size", "max_answer_length",
                   "null_score_diff_threshold", "warmup_ratio", "weight_decay", "seed", "sampling")),
               "best_epoch": best.get("epoch"), "metrics": best.get("metrics"),
               "official": best.get("official"), "always_no_answer": baseline, "seconds": seconds,
               "epochs": history}
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "epochs"}))
    return 0


# ---------------------------------------------------------------------------- the command line

class Family(NamedTuple):
    """A task family's peer: its flags and its run (whose docstring is its `--help`)."""

    flags: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]


FAMILIES = {"glue": Family(glue_flags, glue), "multi-label": Family(multi_label_flags, multi_label),
            "ner": Family(ner_flags, ner), "squad": Family(squad_flags, squad)}


def main(argv: list[str] | None = None) -> int:
    """`peer.py FAMILY FLAGS...`: parse the family's flags and run it; the exit status is its."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    families = parser.add_subparsers(dest="family", required=True, metavar="FAMILY")
    for name, family in FAMILIES.items():
        description = inspect.cleandoc(family.run.__doc__)
        sub = families.add_parser(name, help=description.splitlines()[0], description=description,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        family.flags(sub)
        sub.set_defaults(run=family.run)
    args = parser.parse_args(argv)
    return args.run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
