"""Fine-tuning (§3.2, Appendix A.3): the recipe every task shares, on the shared `Trainer`.

A task module (`bertforge.tasks.*`) describes its task as a `FinetuneTask`: the training features and
how to batch them, a `build_model` that puts the task's output layer on the pre-trained encoder, the
loss of a batch (`step_fn`), and `evaluate(model) -> (metrics, predictions)` over its dev set. This
module does the rest, identically for every task:

* the paper's optimiser: AdamW, linear warm-up over `warmup_ratio` of the steps then linear decay,
  weight decay except LayerNorm and biases, global-norm clipping; `precision`, accumulation, DDP,
  exact resume and the wall-clock budget come from the Trainer;
* dynamic padding: a batch is padded to its own longest row, and the encoder runs unpadded (`unpad`:
  only the real tokens go through its dense layers), so uniformly shuffled batches of mixed lengths
  spend nothing on padding; batches of similar length (`group_by_length`, with `FinetuneTask.lengths`)
  remain an option, still somewhat faster (fewer distinct lengths per batch);
* evaluation every `eval_every` steps and at the end of each epoch; the best model by the task's
  main dev metric is kept in OUT (`config.json`, `model.safetensors`, `vocab.txt`, loadable with
  `from_pretrained` here and in Hugging Face transformers) with `eval_results.json`
  (`{"task", "metrics", "epoch", "step"}`, metrics as fractions) and the per-example dev predictions;
* OUT holds a `RUNNING` marker from the start until everything is written: a failed or killed run's
  model and eval_results.json are refused by the loaders (`bertforge._files.check_finished`);
* `finetune_grid` runs the paper's learning-rate grid and repeats seeds, keeping the best run on dev
  and writing mean, std, min and max of every metric to OUT/summary.json.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import logging
import math
import os
import pickle
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from .._files import LOCK, RUNNING, finish_run, mark_running, own_directory
from ..modeling import use_unpadded
from .checkpoint import atomic_write, latest_checkpoint
from .loop import CHECKPOINT_DIR, LOG_NAME, Batch, CountFn, Phase, StepFn, Trainer
from .state import NonFiniteLossError
from .order import length_grouped_order
from .settings import RunSettings, override, setting

logger = logging.getLogger("bertforge")

EVAL_RESULTS = "eval_results.json"
SUMMARY = "summary.json"
PAPER_LR_GRID = (5e-5, 4e-5, 3e-5, 2e-5)  # Appendix A.3 (with batch 16 or 32 and 2-4 epochs)


@dataclass
class FinetuneArguments(RunSettings):
    """The settings every fine-tuning task shares (settings.py declares them). Defaults are the paper's
    GLUE recipe (§4.1, A.3); `bertforge finetune` overrides lr, epochs and batch size per task."""

    lr: float = override(RunSettings, "lr", 2e-5)
    epochs: float = override(RunSettings, "epochs", 3.0)
    warmup_ratio: float = override(RunSettings, "warmup_ratio", 0.1)
    seed: int = override(RunSettings, "seed", 42)
    eval_every: int | None = override(RunSettings, "eval_every",
                                      help="also evaluate every N steps (always at each epoch's end)")
    eval_batch_size: int = override(RunSettings, "eval_batch_size", 128, help="examples per evaluation batch")
    save_every: int | None = override(RunSettings, "save_every", help="training checkpoints every N steps, for "
                                      "--resume (the best model is kept regardless)")
    keep_last: int | None = override(RunSettings, "keep_last", 1)
    max_minutes: float | None = override(RunSettings, "max_minutes",
                                         help="wall-clock budget per run: then stop, evaluate, keep the best")
    resume: bool = override(RunSettings, "resume", False, help="continue OUT's run (a grid: skip finished runs)",
                            action="store_true", nargs=None, const=None, metavar=None)
    # Uniformly shuffled batches by default, as Google's run_classifier and the peer's Trainer: unpadded
    # execution spends no compute on padding, but length-grouped batches still train faster (fewer
    # distinct lengths per batch; BENCHMARKS.md, "Fine-tuning against the peer at its best settings").
    group_by_length: bool = setting(False, "batch examples of similar length (faster: fewer lengths per batch; "
                                    "default: uniformly shuffled batches, as Google's BERT)", negatable=True)


@dataclass
class FinetuneTask:
    """What a task supplies; see the module docstring."""

    name: str  # recorded in eval_results.json and the model's config ("mrpc", "classify", ...)
    build_model: Callable[[], nn.Module]  # the pre-trained encoder with a new head (called after seeding)
    tokenizer: Any  # saved with the model
    train_features: Sequence[dict]
    collate: Callable[[list], Batch]
    step_fn: StepFn
    evaluate: Callable[[nn.Module], tuple[dict[str, float], Any]]  # dev metrics (fractions) and predictions
    main_metric: str
    greater_is_better: bool = True
    write_predictions: Callable[[Path, Any], None] | None = None  # per-example dev predictions into OUT
    lengths: Sequence[int] | None = None  # tokens per training feature, for length-grouped batches
    count_fn: CountFn | None = None  # e.g. labelled tokens for a token-level loss
    extra_files: Callable[[Path], None] | None = None  # anything else the task keeps with the model
    # the likely causes of a non-finite loss in this task, in place of the optimisation's (NonFiniteLossError)
    divergence_advice: str | None = None


def _json_dump(path: Path, value: Any) -> None:
    text = json.dumps(value, indent=2, ensure_ascii=False, allow_nan=True) + "\n"
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def _is_main_process() -> bool:
    """Rank 0 of a multi-process run (or the only process): the one that owns OUT."""
    return int(os.environ.get("RANK", "0")) == 0


def finetune(task: FinetuneTask, args: FinetuneArguments) -> dict[str, Any]:
    """Fine-tune once; returns the best evaluation as written to OUT/eval_results.json. OUT is locked for
    the run (`own_directory`): a second run into it is refused while this one lasts."""
    with own_directory(args.output_dir, f"bertforge fine-tuning ({task.name})", enabled=_is_main_process()):
        return _finetune(task, args)


def check_output_dir(output_dir: str | os.PathLike, resume: bool, grid: Sequence[tuple[float, int]] | None = None
                     ) -> None:
    """Refuse, in one line (ValueError), an OUT that this run would overwrite: a grid's OUT (summary.json)
    for a single run, a single run's OUT (log.jsonl) for a grid, and without `resume` a run already there
    (a checkpoint or log.jsonl; for a `grid` of (learning rate, seed), in any of its run directories).

    `finetune` and `finetune_grid` check this once OUT is theirs; a command whose task is costly to build
    (`distill`: the teacher's pass over the transfer set) calls it first too, before any of that work."""
    output_dir = Path(output_dir)

    def holds_run(directory: Path) -> bool:
        return bool(latest_checkpoint(directory / CHECKPOINT_DIR)) or (directory / LOG_NAME).exists()

    if grid is None:
        if (output_dir / SUMMARY).exists():  # a single run here would overwrite the grid's best model
            raise ValueError(f"{output_dir} holds a learning-rate/seed grid ({SUMMARY}): repeat its --lr-grid/--seeds "
                             "(with --resume to read finished runs back), or choose another --output-dir")
        if not resume and holds_run(output_dir):
            raise ValueError(f"{output_dir} already holds a run: pass --resume to continue it, or another --output-dir")
        return
    if (output_dir / LOG_NAME).exists():  # the grid would overwrite that run's model with its best one
        raise ValueError(f"{output_dir} holds a single run ({LOG_NAME}), not a learning-rate/seed grid: "
                         "choose another --output-dir for the grid")
    if not resume:
        for lr, seed in grid:
            if holds_run(output_dir / _run_name(lr, seed)):
                raise ValueError(f"{output_dir / _run_name(lr, seed)} already holds a run: pass --resume to continue "
                                 "the grid, or another --output-dir")


def _finetune(task: FinetuneTask, args: FinetuneArguments) -> dict[str, Any]:
    output_dir = Path(args.output_dir)
    check_output_dir(output_dir, args.resume)
    torch.manual_seed(args.seed)  # the new head's initial weights depend on the seed, as in the paper's restarts
    model = task.build_model()
    if args.unpad:
        use_unpadded(model)
    order_fn = None
    if args.group_by_length and task.lengths is not None:
        lengths = list(task.lengths)
        order_fn = functools.partial(length_grouped_order, lengths, args.batch_size * args.grad_accum)

    training = args.training_arguments(
        output_dir=output_dir, drop_last=False, save_final=bool(args.save_every), eval_each_epoch=True,
        best_metric=task.main_metric, greater_is_better=task.greater_is_better)
    latest: dict[str, Any] = {}

    def evaluator(module: nn.Module) -> dict[str, float]:
        metrics, latest["predictions"] = task.evaluate(module)
        return metrics

    def on_best(module: nn.Module, record: dict[str, Any]) -> None:
        module.save_pretrained(output_dir)
        task.tokenizer.save_pretrained(output_dir)
        if task.extra_files is not None:
            task.extra_files(output_dir)
        if task.write_predictions is not None:
            task.write_predictions(output_dir, latest["predictions"])
        _json_dump(output_dir / EVAL_RESULTS, _eval_results(task.name, record))

    settings = {"the training data (--train-file or --data-dir, --max-seq-length, --max-train-examples)":
                features_fingerprint(task.train_features), "--group-by-length": order_fn is not None}
    trainer = Trainer(model, training, collate=task.collate, step_fn=task.step_fn,
                      phases=[Phase(task.train_features, order_fn=order_fn)], count_fn=task.count_fn,
                      evaluator=evaluator, on_best=on_best, settings=settings,
                      checkpoint_extra={"finetuning": {"task": task.name}})
    # A directory: its latest checkpoint, or the newest older one if that cannot be read.
    resume = output_dir / CHECKPOINT_DIR if args.resume and latest_checkpoint(output_dir / CHECKPOINT_DIR) else None
    if trainer.context.is_main:  # until the end, OUT's model and results are not a finished run's
        mark_running(output_dir, f"bertforge fine-tuning ({task.name})")
    started = time.perf_counter()
    try:
        result = trainer.train(resume_from=resume)
    except NonFiniteLossError as error:
        if task.divergence_advice is None:
            raise
        raise error.with_advice(task.divergence_advice) from None
    wall = time.perf_counter() - started
    if trainer.context.is_main:
        best = json.loads((output_dir / EVAL_RESULTS).read_text(encoding="utf-8"))
        best["budget_spent"] = result.budget_spent
        best["wall_seconds"] = round(wall, 2)  # this run's training and evaluations (not a resumed run's earlier part)
        _json_dump(output_dir / EVAL_RESULTS, best)
        finish_run(output_dir)
    trainer.context.barrier()
    return json.loads((output_dir / EVAL_RESULTS).read_text(encoding="utf-8"))


def features_fingerprint(features: Sequence[Any]) -> str:
    """A SHA-256 of the training features' content (ids, labels, ...), feature by feature: the same data,
    made by the same code, gives the same hash.

    Recorded in checkpoints so that a resumed run on other data (another file, --max-seq-length or
    --max-train-examples) is refused instead of silently continuing on it.
    """
    digest = hashlib.sha256(str(len(features)).encode())
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=4)
    pickler.fast = True  # no memo: equal values give equal bytes, whether or not they are the same object
    for feature in features:
        buffer.seek(0)
        buffer.truncate()
        pickler.dump(feature)
        digest.update(buffer.getbuffer())
    return digest.hexdigest()


def _eval_results(task: str, record: dict[str, Any]) -> dict[str, Any]:
    metrics = {k[len("eval_"):]: v for k, v in record.items() if k.startswith("eval_")}
    return {"task": task, "metrics": metrics, "epoch": record.get("epoch"), "step": record["step"]}


# -- learning-rate grid and seeds ------------------------------------------------------------------

def describe(values: Sequence[float]) -> dict[str, float]:
    """mean, std (sample, ddof=1; 0 for one run), min, max and n of one metric over runs."""
    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if len(array) > 1 else 0.0,
            "min": float(array.min()), "max": float(array.max()), "n": int(len(array))}


def _run_name(lr: float, seed: int) -> str:
    return f"lr{lr:g}-seed{seed}"


def grid_runs(lr: float, seed: int, lrs: Sequence[float] | None = None, seeds: Sequence[int] | None = None
              ) -> list[tuple[float, int]] | None:
    """The (learning rate, seed) of each run `finetune_grid` makes for these arguments; None for a single run
    into OUT itself (neither `lrs` nor `seeds` given)."""
    if lrs is None and seeds is None:
        return None
    return [(each_lr, each_seed) for each_lr in (lrs or [lr]) for each_seed in (seeds or [seed])]


def finetune_grid(task: FinetuneTask, args: FinetuneArguments, lrs: Sequence[float] | None = None,
                  seeds: Sequence[int] | None = None) -> dict[str, Any]:
    """Every (learning rate, seed) into OUT/lr{lr}-seed{seed}/; the learning rate with the best mean main
    dev metric wins, and its best seed's model is copied into OUT itself (so OUT is usable as a model
    directory). OUT/summary.json holds every run and mean/std/min/max of every metric per learning rate.

    With neither `lrs` nor `seeds` given this is a plain `finetune` into OUT (`args.lr`, `args.seed`). Given
    either, the grid layout is used even for one run, so that the layout follows from the command: the same
    command with `args.resume` reads finished runs (an eval_results.json and no checkpoint left to resume)
    back instead of training again, and never trains into OUT itself.
    """
    if lrs is None and seeds is None:
        return finetune(task, args)
    with own_directory(args.output_dir, f"bertforge fine-tuning grid ({task.name})", enabled=_is_main_process()):
        return _finetune_grid(task, args, list(lrs or [args.lr]), list(seeds or [args.seed]))


def _finetune_grid(task: FinetuneTask, args: FinetuneArguments, lrs: list[float], seeds: list[int]) -> dict[str, Any]:
    output_dir = Path(args.output_dir)
    check_output_dir(output_dir, resume=True, grid=[])  # a single run's OUT; each run's own is judged by `finetune`
    if _is_main_process():  # OUT gets the best run's model only when every run is done
        mark_running(output_dir, f"bertforge fine-tuning grid ({task.name})")
    runs = []
    for lr in lrs:
        for seed in seeds:
            run_dir = output_dir / _run_name(lr, seed)
            done = (run_dir / EVAL_RESULTS).is_file() and (run_dir / LOG_NAME).is_file() and \
                not (run_dir / RUNNING).exists() and \
                json.loads((run_dir / EVAL_RESULTS).read_text()).get("budget_spent") is not None
            if args.resume and done:
                results = json.loads((run_dir / EVAL_RESULTS).read_text(encoding="utf-8"))
                logger.info("%s: finished earlier, read back", run_dir)
            else:
                logger.info("fine-tuning %s with lr %g, seed %d", task.name, lr, seed)
                results = finetune(task, dataclasses.replace(args, output_dir=run_dir, lr=lr, seed=seed))
            runs.append({"lr": lr, "seed": seed, "dir": str(run_dir), **results})
    main = task.main_metric
    sign = 1.0 if task.greater_is_better else -1.0
    by_lr = {}
    for lr in lrs:
        chosen = [r for r in runs if r["lr"] == lr]
        names = sorted(set.intersection(*(set(r["metrics"]) for r in chosen)))
        by_lr[f"{lr:g}"] = {name: describe([r["metrics"][name] for r in chosen]) for name in names}

    def score(value: float) -> float:
        return sign * value if math.isfinite(value) else -math.inf

    best_lr = max(lrs, key=lambda lr: score(by_lr[f"{lr:g}"][main]["mean"]))
    best_run = max((r for r in runs if r["lr"] == best_lr), key=lambda r: score(r["metrics"][main]))
    summary = {"task": task.name, "main_metric": main, "lr_grid": lrs, "seeds": seeds, "best_lr": best_lr,
               "metrics": by_lr[f"{best_lr:g}"], "best_run": best_run, "by_lr": by_lr, "runs": runs}
    _copy_model(Path(best_run["dir"]), output_dir)
    _json_dump(output_dir / SUMMARY, summary)
    if _is_main_process():
        finish_run(output_dir)
    return summary


def _copy_model(source: Path, target: Path) -> None:
    """The files of a finished run (model, tokenizer, eval results, predictions), not its checkpoints or log."""
    for path in source.iterdir():
        if path.is_file() and path.name not in (LOG_NAME, LOCK):
            shutil.copy2(path, target / path.name)
