"""The training loop every bertforge task shares: pre-training and every fine-tuning task.

A task supplies a map-style dataset, its `collate`, and a `step_fn(model, batch) -> (loss, metrics)`;
the `Trainer` owns everything else: data order, gradient accumulation, mixed precision, clipping,
AdamW and the linear schedule, logging, evaluation, checkpoints, exact resume and data parallelism.
Its rooms: this file (set-up, the optimizer step, the loop), order.py (which examples each step and
process reads), window.py (metrics summed between log lines), evaluation.py (evaluation and the best
model), state.py (checkpoints, exact resume, divergence), distributed.py (processes, DDP and FSDP
wrapping). The Trainer knows no model class: a module that needs preparing for CPU training says so
(`prepare_cpu_training`), and one that FSDP should shard as a unit says so (`fsdp_unit`).

The settings it reads, `TrainingArguments`, are declared in settings.py (each training setting once).

**Batches.** `batch_size` is the micro-batch of all processes together; each of the W processes of a
`torchrun` job reads `batch_size / W` examples of it, and one optimizer step consumes
`batch_size × grad_accum` examples: the global batch is the same at any W.

**Losses.** `step_fn` returns the mean loss of its micro-batch, or a dict of such means (one per
loss term, e.g. {"mlm_loss": ..., "nsp_loss": ...}, whose sum is trained). `count_fn(batch)` says
over how many units each mean was taken (default: the examples; for a token-level loss, the labelled
tokens). The Trainer weights each micro-batch's term by its share of the step's units across all
micro-batches and processes, so that the gradient is that of the mean over the whole global batch:
accumulating 2 × 4 examples, or splitting them over 2 processes, gives the step of 8 in one go.

**Metrics.** `metrics` maps names to a value (averaged over micro-batches) or to a pair
(numerator, denominator), summed over the logging window and the processes (window.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from tqdm.auto import tqdm

from ..modeling import compile_per_token_parts
from ..modeling.packing import keep_host_copy
from . import checkpoint as ckpt
from .distributed import DistributedContext, configure_threads, grad_scaler, setup, wrap_model
from .embedding_grads import SparseEmbeddingGrads
from .evaluation import Evaluation
from .memory import keep_freed_memory
from .optim import build_optimizer
from .order import (DataPosition, Phase, StepPlan, epoch_permutation, phase_steps,  # noqa: F401 (re-exported)
                    prefetched, training_steps)
from .schedule import budget_schedule, linear_schedule
from .settings import TrainingArguments
from .state import EXPLODING_FACTOR, RESUME_SETTINGS, NonFiniteLossError, TrainingState  # noqa: F401 (re-exported)
from .window import MetricWindow, default_count, default_tokens

logger = logging.getLogger("bertforge")

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
LOG_NAME = "log.jsonl"
CHECKPOINT_DIR = "checkpoints"

Batch = dict[str, torch.Tensor]
Metrics = Mapping[str, Any]
StepFn = Callable[[nn.Module, Batch], tuple[torch.Tensor | Mapping[str, torch.Tensor], Metrics]]
EvalFn = Callable[[nn.Module, Batch], Metrics]
CountFn = Callable[[Batch], float | Mapping[str, float]]


@dataclass
class TrainResult:
    step: int
    last_log: dict[str, Any] | None
    checkpoint: Path | None
    eval: dict[str, float] | None = None
    best: dict[str, Any] | None = None  # the evaluation record with the best `best_metric`
    budget_spent: bool = False  # stopped by max_minutes before the last step


def _bucket_packed_rows(model: nn.Module) -> None:
    """Let each submodule that knows how prepare itself for training on CPU (`prepare_cpu_training`: BERT
    encoders round their packed lengths up to a few sizes, so that oneDNN meets few matrix shapes).

    The Trainer knows no model class: the model-specific part lives with the model (modeling/).
    """
    for module in model.modules():
        prepare = getattr(module, "prepare_cpu_training", None)
        if callable(prepare):
            prepare()


class Trainer(TrainingState, Evaluation):
    """One training loop for every task; see the module docstring for the contract."""

    def __init__(
        self,
        model: nn.Module,
        args: TrainingArguments,
        train_dataset: Sequence | None = None,
        collate: Callable[[list], Batch] | None = None,
        step_fn: StepFn | None = None,
        *,
        phases: Sequence[Phase] | None = None,
        count_fn: CountFn | None = None,
        tokens_fn: Callable[[Batch], int] | None = None,
        eval_dataset: Sequence | None = None,
        eval_fn: EvalFn | None = None,
        evaluator: Callable[[nn.Module], Mapping[str, float]] | None = None,
        on_best: Callable[[nn.Module, dict[str, Any]], None] | None = None,
        summarize_fn: Callable[[dict[str, float]], dict[str, float]] | None = None,
        optimizer_fn: Callable[[nn.Module], torch.optim.Optimizer] | None = None,
        checkpoint_extra: dict[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
        context: DistributedContext | None = None,
    ):
        """`settings`: what else changes the run's result, by the flag (or words) that set it, e.g.
        {"--data": <the data's fingerprint>}; saved in checkpoints, and a resume with other values is refused.
        The TrainingArguments that matter (RESUME_SETTINGS) and the examples per phase are compared anyway."""
        if step_fn is None or collate is None:
            raise ValueError("the Trainer needs a step_fn and a collate function")
        if (train_dataset is None) == (phases is None):
            raise ValueError("give either train_dataset or phases")
        self.args = args
        self.phases = list(phases) if phases is not None else [Phase(train_dataset)]
        self.collate, self.step_fn = collate, step_fn
        self.count_fn = count_fn or default_count
        self.tokens_fn = tokens_fn or default_tokens
        self.eval_dataset, self.eval_fn, self.summarize_fn = eval_dataset, eval_fn, summarize_fn
        if evaluator is not None and eval_dataset is not None:
            raise ValueError("give either eval_dataset (batch metrics) or evaluator (whole-set metrics), not both")
        if args.best_metric and evaluator is None and eval_dataset is None:
            raise ValueError(f"best_metric={args.best_metric!r} needs evaluation data or an evaluator")
        self.evaluator, self.on_best = evaluator, on_best
        self.checkpoint_extra = checkpoint_extra or {}
        self.settings = dict(settings or {})
        self.output_dir = Path(args.output_dir)
        self.checkpoint_dir = self.output_dir / CHECKPOINT_DIR
        self.log_path = self.output_dir / LOG_NAME

        self.context = context or setup(args.device)
        configure_threads(self.context, args.num_threads)
        self.device = self.context.device
        if self.device.type == "cpu" and args.keep_freed_memory:
            keep_freed_memory()
        self.module = model.to(self.device)  # the bare model: what is saved and evaluated
        if args.compile:
            compile_per_token_parts(self.module)  # in place: the same module types and state_dict keys
        self.model = self._wrap(self.module)  # what step_fn calls: the module, or its DDP / FSDP wrapper
        self.optimizer = (optimizer_fn or self._default_optimizer)(self.model)

        self.plans = [StepPlan(len(p.dataset), p.batch_size or args.batch_size, args.grad_accum,
                               self.context.world_size, self.context.rank, args.drop_last) for p in self.phases]
        self.phase_steps = self._phase_steps()
        self.total_steps = sum(self.phase_steps)
        self.scheduler = budget_schedule(self.optimizer, args.warmup_steps, args.warmup_ratio) if args.budget_schedule \
            else linear_schedule(self.optimizer, self.total_steps, args.warmup_steps, args.warmup_ratio)
        self.autocast_dtype = PRECISIONS[args.precision]
        self.scaler = self._grad_scaler()
        if self.device.type == "cpu":
            _bucket_packed_rows(self.module)
        # Large embedding tables' gradients as the rows a step touched (embedding_grads.py), while `train` runs.
        self.embedding_grads = (SparseEmbeddingGrads(self.module, zero_rows_only=optimizer_fn is None)
                                if self.device.type == "cpu"
                                and not self.context.is_distributed and not self._is_fsdp else None)

        self.step = 0
        self.position = DataPosition()
        self.window = MetricWindow()
        self.first_bad_step = torch.full((), -1, dtype=torch.int64, device=self.device)
        self.last_checkpoint: Path | None = None
        # Checkpoints saved while the logged loss was finite and not exploding, (step, path), oldest first.
        self.good_checkpoints: list[tuple[int, Path]] = []
        self.reference_loss: float | None = None  # the job's first logged training loss
        self._window_start_step = 0  # the step of the last log record: the current window follows it
        self._diverging = False
        self.last_log: dict[str, Any] | None = None
        self.last_lr = self.scheduler.get_last_lr()[0]
        self._loss_names: set[str] = set()
        self.best: dict[str, Any] | None = None
        self.train_seconds = 0.0  # training time of earlier runs of this job (resume), for max_minutes
        self.run_seconds = 0.0  # training time of this run so far (evaluation and saving excluded)
        self._run_started, self._paused_seconds = None, 0.0  # this run's clock: start, evaluation and saving

    # -- set-up -----------------------------------------------------------------------------------

    def _wrap(self, model: nn.Module) -> nn.Module:
        if self.args.fsdp and not self.context.is_distributed:
            logger.warning("fsdp without torchrun: one process, nothing to shard")
        wrapped = wrap_model(model, self.context, fsdp=self.args.fsdp,
                             find_unused_parameters=self.args.find_unused_parameters)
        self._is_fsdp = isinstance(wrapped, FullyShardedDataParallel)
        return wrapped

    def _default_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return build_optimizer(model, self.args.lr, self.args.weight_decay, eps=self.args.adam_epsilon)

    def _grad_scaler(self):
        return grad_scaler(self.args.precision, self.device, sharded=self._is_fsdp)

    def _phase_steps(self) -> list[int]:
        return phase_steps(self.phases, self.plans, self.args.max_steps, self.args.epochs)

    # -- data -------------------------------------------------------------------------------------

    def _steps(self) -> Iterator[tuple[DataPosition, list[Batch]]]:
        """From the current position on: (position after the step, this process's micro-batches). On CUDA
        the batches are pinned and read two steps ahead on a thread (`prefetched`): the steps do not wait
        for the device, so the host may read while the device computes."""
        cuda = self.device.type == "cuda"
        steps = training_steps(self.phases, self.plans, self.phase_steps, self.position, self.step, self.args.seed,
                               self.collate, self.args.num_workers, pin_memory=cuda)
        return prefetched(steps, device=self.device) if cuda else steps

    def _to_device(self, batch: Batch) -> Batch:
        """The batch on the device, each tensor copied without waiting (pinned on CUDA) and carrying its
        host tensor (`keep_host_copy`): what a model reads of a batch's shape (its examples' lengths)
        it reads there, so that a step never waits for the device."""
        return {k: keep_host_copy(v.to(self.device, non_blocking=True), v) if isinstance(v, torch.Tensor) else v
                for k, v in batch.items()}

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    # -- one optimizer step ------------------------------------------------------------------------

    def train_step(self, micro_batches: list[Batch]) -> int:
        """One optimizer step: forward and backward over this process's micro-batches (CPU tensors), clipping,
        AdamW and the schedule. Returns the tokens read. `train` calls it; a benchmark may too."""
        context, world = self.context, self.context.world_size
        # Units per loss term and micro-batch (a number for every term, or a dict per term), known
        # before the forward passes, so each term can be weighted by its share of the global batch.
        counts = [self.count_fn(batch) for batch in micro_batches]
        names = sorted(counts[0]) if isinstance(counts[0], Mapping) else ["*"]
        local = torch.tensor([[float(c[n]) if n != "*" else float(c) for n in names] for c in counts],
                             dtype=torch.float64).sum(0)
        if context.is_distributed:  # one small collective per step; none in a single process
            local = context.all_reduce_sum(local.to(self.device)).cpu()
        totals = dict(zip(names, local.tolist()))
        step_loss = torch.zeros((), device=self.device)
        tokens = 0
        for index, batch in enumerate(micro_batches):
            tokens += self.tokens_fn(batch)
            batch = self._to_device(batch)
            last = index == len(micro_batches) - 1
            sync = contextlib.nullcontext() if last or not context.is_distributed else self.model.no_sync()
            with sync:
                with self._autocast():
                    losses, metrics = self.step_fn(self.model, batch)
                if not isinstance(losses, Mapping):
                    losses = {"loss": losses}
                self._loss_names.update(losses)
                objective = None
                for name, value in losses.items():
                    key = "*" if names == ["*"] else name
                    if key not in totals:
                        raise ValueError(f"count_fn gives counts for {names}, but step_fn returns the loss {name!r}")
                    count = float(counts[index][key]) if key != "*" else float(counts[index])
                    if count == 0:  # e.g. no masked token in this micro-batch: the term has no mean
                        continue
                    value = value.float()
                    term = value * (count * world / totals[key])
                    objective = term if objective is None else objective + term
                    self.window.add(name, value * count, count)
                for name, value in metrics.items():
                    self.window.add_metric(name, value)
                if objective is not None:
                    step_loss = step_loss + objective.detach() / world
                    (self.scaler.scale(objective) if self.scaler else objective).backward()
        self._optimizer_step(step_loss)
        return tokens

    def _optimizer_step(self, step_loss: torch.Tensor) -> None:
        table_norms = self.embedding_grads.densify() if self.embedding_grads else {}
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        clip_in_step = False
        if self.args.max_grad_norm:
            max_norm = self.args.max_grad_norm
            if self._is_fsdp:
                norm = self.model.clip_grad_norm_(max_norm)
            elif self.scaler is None and getattr(self.optimizer, "_step_supports_amp_scaling", False):
                # A fused optimizer divides each gradient by `grad_scale` in its own pass over it (the
                # hook GradScaler uses): clip_grad_norm_'s factor min(1, max_norm / (norm + 1e-6)) as a
                # divisor saves a read and write of every gradient.
                # the norms of sparse table gradients from their rows, not their dense buffers
                norm = torch.nn.utils.get_total_norm(
                    [p.grad for p in self.module.parameters() if p.grad is not None and p not in table_norms]
                    + list(table_norms.values()))
                self.optimizer.grad_scale = torch.clamp((norm + 1e-6) / max_norm, min=1.0)
                clip_in_step = True
            else:
                norm = torch.nn.utils.clip_grad_norm_(
                    [p for p in self.module.parameters() if p.grad is not None], max_norm)
            self.window.add("grad_norm", norm.detach() / self.context.world_size, 1.0 / self.context.world_size)
        self.last_lr = self.scheduler.get_last_lr()[0]  # the rate this step used
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            try:
                self.optimizer.step()
            finally:
                if clip_in_step:
                    self.optimizer.grad_scale = None
        if self.args.budget_schedule:
            self.scheduler.lr_lambdas[0].fraction = self._budget_fraction()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        # Remember the first step whose loss was not finite, without waiting for the device.
        bad = ~torch.isfinite(step_loss) & (self.first_bad_step < 0)
        self.first_bad_step = torch.where(bad, torch.full_like(self.first_bad_step, self.step), self.first_bad_step)

    # -- logging, evaluation, checkpoints ----------------------------------------------------------

    def _log(self, tokens: float, elapsed: float, window_seconds: float) -> dict[str, Any]:
        """The log record of the window that ends at this step (reduced over the processes)."""
        values = self.window.reduce(self.context)
        self.window = MetricWindow()
        record: dict[str, Any] = {"step": self.step, "epoch": self.position.epoch}
        if len(self.phases) > 1:
            record["phase"] = self.position.phase + 1
        if "loss" not in values:  # the trained loss is the sum of the terms
            record["loss"] = sum(values[n] for n in sorted(self._loss_names))
        record.update(values)
        record["lr"] = self.last_lr
        record["tokens_per_second"] = tokens / window_seconds if window_seconds > 0 else float("nan")
        record["elapsed"] = elapsed
        if self.scaler:
            record["loss_scale"] = float(self.scaler.get_scale())
        if self.summarize_fn:
            record.update(self.summarize_fn(record))
        return record

    def _write_log(self, record: dict[str, Any]) -> None:
        if self.context.is_main:
            with self.log_path.open("a", encoding="utf-8") as file:
                file.write(json.dumps(record, allow_nan=True) + "\n")

    # -- the loop ---------------------------------------------------------------------------------

    def _budget_fraction(self) -> float:
        """The share of max_minutes spent by the end of this step; the largest of all processes', so that
        every process steps with the same learning rate."""
        seconds = self.train_seconds
        if self._run_started is not None:
            seconds += time.perf_counter() - self._run_started - self._paused_seconds
        fraction = torch.tensor(seconds / (60 * self.args.max_minutes), dtype=torch.float64, device=self.device)
        return float(self.context.all_reduce_max(fraction)) if self.context.is_distributed else float(fraction)

    def _budget_spent(self) -> bool:
        """Whether max_minutes is used up (any process past it stops them all, at the same step)."""
        if self.args.max_minutes is None:
            return False
        if self.args.budget_schedule:  # measured and agreed on at this step's scheduler update: no second collective
            return self.scheduler.lr_lambdas[0].fraction >= 1.0
        spent = torch.tensor(int(self.train_seconds + self.run_seconds >= 60 * self.args.max_minutes),
                             device=self.device)
        return bool(self.context.all_reduce_max(spent)) if self.context.is_distributed else bool(spent)

    def train(self, resume_from: str | os.PathLike | None = None, stop_at_step: int | None = None) -> TrainResult:
        """Train to the last step (or `stop_at_step`), resuming from a checkpoint file or directory if given.

        With `max_minutes`, training stops at the first step that ends past the budget and finishes as at the
        last step: a log line, the final evaluation and the final checkpoint (a resumed run counts the time
        of the earlier runs). Evaluation and saving do not count against the budget.
        """
        args, context = self.args, self.context
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if resume_from is not None:
            state, path = ckpt.load_checkpoint(resume_from)
            self.load_state(state, path)
            self.last_checkpoint = path
            self._truncate_log(self.step)
            if context.is_main:
                logger.info("resumed from %s at step %d", path, self.step)
        else:
            ckpt.seed_everything(args.seed + context.rank)
        end = self.total_steps if stop_at_step is None else min(stop_at_step, self.total_steps)
        context.barrier()
        bar = tqdm(total=self.total_steps, initial=self.step, unit="step", dynamic_ncols=True,
                   disable=not (args.progress and context.is_main))
        self.module.train()
        self._run_started = started = time.perf_counter()
        self._paused_seconds = 0.0
        window_start, paused, tokens = started, 0.0, 0.0  # eval and saving do not count in the throughput
        eval_results, budget_spent = None, False
        stack = contextlib.ExitStack()
        try:
            if self.embedding_grads:
                stack.enter_context(self.embedding_grads)
            steps = self._steps()
            stack.callback(steps.close)  # on CUDA, stops the thread that reads ahead
            while self.step < end:
                self.position, micro_batches = next(steps)
                tokens += self.train_step(micro_batches)
                bar.update(1)
                self.run_seconds = time.perf_counter() - started - self._paused_seconds
                budget_spent = self._budget_spent()
                at_end = self.step == end or budget_spent
                finished = self.step == self.total_steps or budget_spent
                if self.step % args.log_every == 0 or at_end:
                    self._check_finite()
                    now = time.perf_counter()
                    total_tokens = float(context.all_reduce_sum(torch.tensor(tokens, device=self.device)))
                    record = self._log(total_tokens, self.train_seconds + self.run_seconds, now - window_start - paused)
                    tokens, window_start, paused = 0.0, now, 0.0
                    self._check_health(record)
                    self._write_log(record)
                    self.last_log = record
                    bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}")
                eval_due = args.eval_every and self.step % args.eval_every == 0
                epoch_end = args.eval_each_epoch and self.position.step_in_epoch == \
                    self.plans[self.position.phase].steps_per_epoch
                has_eval = self.eval_dataset is not None or self.evaluator is not None
                if has_eval and (eval_due or epoch_end or finished):
                    self._check_finite()
                    pause = time.perf_counter()
                    eval_results = self._run_eval(self.train_seconds + self.run_seconds)
                    paused += time.perf_counter() - pause
                    self._paused_seconds += time.perf_counter() - pause
                if (args.save_every and self.step % args.save_every == 0) or (at_end and args.save_final):
                    pause = time.perf_counter()
                    self.save()
                    paused += time.perf_counter() - pause
                    self._paused_seconds += time.perf_counter() - pause
                if budget_spent:
                    if context.is_main:
                        logger.info("the budget of %g minutes is spent: stopped at step %d of %d",
                                    args.max_minutes, self.step, self.total_steps)
                    break
            self._check_finite()
        finally:
            stack.close()
            bar.close()
        return TrainResult(self.step, self.last_log, self.last_checkpoint, eval_results, self.best, budget_spent)
