"""The training loop every bertforge task shares: pre-training and every fine-tuning task.

A task supplies a map-style dataset, its `collate`, and a `step_fn(model, batch) -> (loss, metrics)`;
the `Trainer` owns everything else: data order, gradient accumulation, mixed precision, clipping,
AdamW and the linear schedule, logging, evaluation, checkpoints, exact resume and data parallelism.

**Batches.** `batch_size` is the micro-batch of all processes together; each of the W processes of a
`torchrun` job reads `batch_size / W` examples of it, and one optimizer step consumes
`batch_size × grad_accum` examples: the global batch is the same at any W.

**Data order.** Each epoch visits the dataset in a permutation drawn from a generator seeded with
(seed, epoch); a step takes the next `batch_size × grad_accum` indices and each process reads its
own slice of every micro-batch. The data position is therefore (epoch, steps done in the epoch), and
a resumed run continues with the exact next batch.

**Resume.** A checkpoint records the settings that change the result (RESUME_SETTINGS, the examples
per phase and the caller's `settings`, e.g. a data fingerprint); a resumed run with other values is
refused, naming each flag. A new learning rate is applied from the resumed step on (logged).

**Divergence.** A non-finite loss stops training (NonFiniteLossError) with `latest` rewound to the
last checkpoint saved before the loss became non-finite or exploded (EXPLODING_FACTOR times the
first logged loss); while the loss explodes, that checkpoint is never pruned.

**Losses.** `step_fn` returns the mean loss of its micro-batch, or a dict of such means (one per
loss term, e.g. {"mlm_loss": ..., "nsp_loss": ...}, whose sum is trained). `count_fn(batch)` says
over how many units each mean was taken (default: the examples; for a token-level loss, the labelled
tokens). The Trainer weights each micro-batch's term by its share of the step's units across all
micro-batches and processes, so that the gradient is that of the mean over the whole global batch:
accumulating 2 × 4 examples, or splitting them over 2 processes, gives the step of 8 in one go.

**Metrics.** `metrics` maps names to a value (averaged over micro-batches) or to a pair
(numerator, denominator), summed over the logging window and the processes before dividing: e.g.
("correct", "count") for an accuracy. They are reduced only at logging steps, so the loop does not
wait on the device every step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from ..modeling import BertModel
from ..modeling.inference import DEFAULT_ROW_BUCKET
from . import checkpoint as ckpt
from .distributed import DistributedContext, configure_threads, setup
from .memory import keep_freed_memory
from .optim import build_optimizer
from .schedule import budget_schedule, linear_schedule
from .settings import TrainingArguments

logger = logging.getLogger("bertforge")

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
LOG_NAME = "log.jsonl"
CHECKPOINT_DIR = "checkpoints"

Batch = dict[str, torch.Tensor]
Metrics = Mapping[str, Any]
StepFn = Callable[[nn.Module, Batch], tuple[torch.Tensor | Mapping[str, torch.Tensor], Metrics]]
EvalFn = Callable[[nn.Module, Batch], Metrics]
CountFn = Callable[[Batch], float | Mapping[str, float]]


# A logged training loss above this many times the job's first logged loss marks the run as diverging:
# checkpoints saved in such a window are not offered as the checkpoint to go back to.
EXPLODING_FACTOR = 10.0

# TrainingArguments fields that change a run's result, each named by the flag that sets it: a resumed run
# must have the checkpoint's (`lr` is applied from the resumed step on instead, see `Trainer.load_state`).
RESUME_SETTINGS = ("batch_size", "grad_accum", "seed", "warmup_steps", "warmup_ratio", "weight_decay",
                   "max_grad_norm", "precision", "drop_last")


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the last checkpoint saved before the
    run diverged (training then resumes from it: `latest` points there)."""


@dataclass
class Phase:
    """A stretch of training on one dataset, e.g. BERT's 90% of steps at 128 tokens, then 10% at 512."""

    dataset: Sequence
    steps: int | None = None  # None: the remaining steps (or `epochs` passes)
    batch_size: int | None = None  # default: TrainingArguments.batch_size
    name: str = ""
    # An epoch's example order, order_fn(seed, epoch) -> a permutation of range(len(dataset)); default
    # a uniform shuffle. E.g. `length_grouped_order`: batches of similar lengths pad little.
    order_fn: Callable[[int, int], Sequence[int]] | None = None


@dataclass
class TrainResult:
    step: int
    last_log: dict[str, Any] | None
    checkpoint: Path | None
    eval: dict[str, float] | None = None
    best: dict[str, Any] | None = None  # the evaluation record with the best `best_metric`
    budget_spent: bool = False  # stopped by max_minutes before the last step


@dataclass
class DataPosition:
    phase: int = 0
    epoch: int = 0
    step_in_epoch: int = 0  # steps of this epoch already done


def epoch_permutation(size: int, seed: int, epoch: int, phase: int = 0) -> torch.Tensor:
    """The order of an epoch: a permutation from a generator seeded with (seed, epoch) (and the phase after the first)."""
    entropy = [seed, epoch] if phase == 0 else [seed, epoch, phase]
    generator = torch.Generator().manual_seed(int(np.random.SeedSequence(entropy).generate_state(1)[0]))
    return torch.randperm(size, generator=generator)


class StepPlan:
    """Which examples each process reads at each step of an epoch."""

    def __init__(self, size: int, batch_size: int, grad_accum: int, world_size: int, rank: int, drop_last: bool):
        if batch_size % world_size:
            raise ValueError(f"batch size {batch_size} is not divisible by the {world_size} processes")
        self.size, self.batch_size, self.grad_accum = size, batch_size, grad_accum
        self.world_size, self.rank = world_size, rank
        self.step_size = batch_size * grad_accum
        usable = size - size % world_size  # an incomplete step still splits evenly over the processes
        self.usable = (size // self.step_size) * self.step_size if drop_last else usable
        self.steps_per_epoch = math.ceil(self.usable / self.step_size)
        if self.steps_per_epoch == 0:
            raise ValueError(f"the dataset has {size} examples, fewer than one step of batch size "
                             f"{batch_size} × grad accumulation {grad_accum}")

    def micro_batches(self, order: torch.Tensor, step: int) -> list[list[int]]:
        """This process's micro-batches (lists of dataset indices) of step `step` of the epoch."""
        chunk = order[step * self.step_size: min((step + 1) * self.step_size, self.usable)].tolist()
        micro = []
        for start in range(0, len(chunk), self.batch_size):
            part = chunk[start: start + self.batch_size]
            share = len(part) // self.world_size
            micro.append(part[self.rank * share: (self.rank + 1) * share])
        return micro


def default_count(batch: Batch) -> float:
    return float(len(next(iter(batch.values()))))


def default_tokens(batch: Batch) -> int:
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    if "input_ids" in batch:
        return batch["input_ids"].numel()
    return len(next(iter(batch.values())))


class _Window:
    """Sums over the steps since the last log: (numerator, denominator) per name, kept on the device."""

    def __init__(self):
        self.sums: dict[str, list] = {}

    def add(self, name: str, numerator, denominator=1.0) -> None:
        if isinstance(numerator, torch.Tensor):
            numerator = numerator.detach().double()
        if isinstance(denominator, torch.Tensor):
            denominator = denominator.detach().double()
        entry = self.sums.get(name)
        if entry is None:
            self.sums[name] = [numerator, denominator]
        else:
            entry[0] = entry[0] + numerator
            entry[1] = entry[1] + denominator

    def reduce(self, context: DistributedContext) -> dict[str, float]:
        """Sum over processes, then divide: one transfer from the device for all names."""
        if not self.sums:
            return {}
        names = sorted(self.sums)
        values = torch.stack([torch.as_tensor(self.sums[n][i], dtype=torch.float64, device=context.device)
                              for n in names for i in (0, 1)])
        values = context.all_reduce_sum(values).tolist()
        return {n: (values[2 * i] / values[2 * i + 1] if values[2 * i + 1] else float("nan"))
                for i, n in enumerate(names)}

    def state(self) -> dict[str, list[float]]:
        return {n: [float(a), float(b)] for n, (a, b) in self.sums.items()}

    def load(self, state: dict[str, list[float]]) -> None:
        self.sums = {n: [float(a), float(b)] for n, (a, b) in state.items()}


def _plain(value: Any) -> Any:
    """A setting as compared on resume: tuples as lists (a checkpoint stores lists)."""
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _show(value: Any) -> str:
    return "none" if value is None else (",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value))


def _is_pair(value) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == 2


def _bucket_packed_rows(model: nn.Module) -> None:
    """Round the unpadded path's packed length up to a few sizes (`Packing`'s row_bucket) in every encoder.

    On CPU the matmuls of training run in oneDNN (fp32 too, not only under autocast), which builds and
    caches a kernel for each matrix shape (up to ONEDNN_PRIMITIVE_CACHE_CAPACITY, 1,024 by default), and
    unpadded batches have a new number of real tokens nearly every step: without buckets `mini` reached
    3.5 GB in 1,000 fp32 steps (1.6 GB with them) and grew from 2.5 to 3.9 GB over 200 bf16 steps, 20%
    slower; with them memory grows by under 0.1 GB after warm-up (BENCHMARKS.md). The filler rows attend
    to nothing and are dropped, so losses and gradients are those of the exact packing.
    """
    for module in model.modules():
        if isinstance(module, BertModel) and module.unpad_row_bucket == 0:
            module.unpad_row_bucket = DEFAULT_ROW_BUCKET


class Trainer:
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

        self.step = 0
        self.position = DataPosition()
        self.window = _Window()
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
        self._is_fsdp = False
        if self.args.fsdp:
            if not self.context.is_distributed:
                logger.warning("fsdp without torchrun: one process, nothing to shard")
                return model
            from torch.distributed.fsdp import FullyShardedDataParallel
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy

            from ..modeling.bert import TransformerLayer

            self._is_fsdp = True
            # One FSDP unit per Transformer layer (gathered just for its forward and backward), the rest
            # (embeddings tied to the MLM decoder, heads) in the root unit. use_orig_params: parameters
            # keep their names (weight-decay groups) and the state_dict its layout.
            layers = any(isinstance(m, TransformerLayer) for m in model.modules())
            return FullyShardedDataParallel(model, use_orig_params=True, device_id=self.device,
                                            auto_wrap_policy=ModuleWrapPolicy({TransformerLayer}) if layers else None)
        if self.context.is_distributed:
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(model, device_ids=[self.device] if self.device.type == "cuda" else None,
                                           find_unused_parameters=self.args.find_unused_parameters)
        return model

    def _default_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return build_optimizer(model, self.args.lr, self.args.weight_decay)

    def _grad_scaler(self):
        if self.args.precision != "fp16":
            return None
        if self._is_fsdp:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            return ShardedGradScaler(self.device.type)
        return torch.amp.GradScaler(self.device.type)

    def _phase_steps(self) -> list[int]:
        args, steps = self.args, []
        if args.max_steps is None and args.epochs is None and any(p.steps is None for p in self.phases):
            raise ValueError("say how long to train: max_steps or epochs")
        for index, (phase, plan) in enumerate(zip(self.phases, self.plans)):
            if phase.steps is not None:
                steps.append(phase.steps)
                continue
            remaining = None if args.max_steps is None else args.max_steps - sum(
                p.steps or 0 for i, p in enumerate(self.phases) if i != index)
            by_epochs = None if args.epochs is None else math.ceil(args.epochs * plan.steps_per_epoch)
            count = min(x for x in (remaining, by_epochs) if x is not None)
            if count < 1:
                raise ValueError(f"phase {index + 1} gets {count} steps: max_steps ({args.max_steps}) leaves none")
            steps.append(count)
        return steps

    # -- data -------------------------------------------------------------------------------------

    def _steps(self) -> Iterator[tuple[DataPosition, list[Batch]]]:
        """From the current position on: (position after the step, this process's micro-batches)."""
        position = dataclasses.replace(self.position)
        done = self.step
        while position.phase < len(self.phases):
            phase, plan = self.phases[position.phase], self.plans[position.phase]
            phase_end = sum(self.phase_steps[: position.phase + 1])
            if done >= phase_end:
                position = DataPosition(position.phase + 1)
                continue
            if position.step_in_epoch >= plan.steps_per_epoch:
                position = DataPosition(position.phase, position.epoch + 1)
                continue
            if hasattr(phase.dataset, "set_epoch"):
                phase.dataset.set_epoch(position.epoch)
            if phase.order_fn is not None:
                order = torch.as_tensor(phase.order_fn(self.args.seed, position.epoch), dtype=torch.long)
                if len(order) != plan.size:
                    raise ValueError(f"order_fn gave {len(order)} indices for a dataset of {plan.size}")
            else:
                order = epoch_permutation(plan.size, self.args.seed, position.epoch, position.phase)
            last = min(plan.steps_per_epoch, position.step_in_epoch + phase_end - done)
            steps = [plan.micro_batches(order, s) for s in range(position.step_in_epoch, last)]
            loader = DataLoader(phase.dataset, batch_sampler=[m for step in steps for m in step],
                                collate_fn=self.collate, num_workers=self.args.num_workers,
                                pin_memory=self.device.type == "cuda",
                                generator=torch.Generator())  # never draws from the global RNG
            batches = iter(loader)
            for step in steps:
                micro = [next(batches) for _ in step]
                position = DataPosition(position.phase, position.epoch, position.step_in_epoch + 1)
                done += 1
                yield position, micro

    def _to_device(self, batch: Batch) -> Batch:
        return {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v
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
                    self.window.add(name, *(value if _is_pair(value) else (value, 1.0)))
                if objective is not None:
                    step_loss = step_loss + objective.detach() / world
                    (self.scaler.scale(objective) if self.scaler else objective).backward()
        self._optimizer_step(step_loss)
        return tokens

    def _optimizer_step(self, step_loss: torch.Tensor) -> None:
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.args.max_grad_norm:
            if self._is_fsdp:
                norm = self.model.clip_grad_norm_(self.args.max_grad_norm)
            else:
                norm = torch.nn.utils.clip_grad_norm_(
                    [p for p in self.module.parameters() if p.grad is not None], self.args.max_grad_norm)
            self.window.add("grad_norm", norm.detach() / self.context.world_size, 1.0 / self.context.world_size)
        self.last_lr = self.scheduler.get_last_lr()[0]  # the rate this step used
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.args.budget_schedule:
            self.scheduler.lr_lambdas[0].fraction = self._budget_fraction()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        # Remember the first step whose loss was not finite, without waiting for the device.
        bad = ~torch.isfinite(step_loss) & (self.first_bad_step < 0)
        self.first_bad_step = torch.where(bad, torch.full_like(self.first_bad_step, self.step), self.first_bad_step)

    def _check_finite(self) -> None:
        first_bad = int(self.context.all_reduce_max(self.first_bad_step.clone()))
        if first_bad < 0:
            return
        good = [(step, path) for step, path in self.good_checkpoints if step < first_bad and path.exists()]
        if self.context.is_main and self.checkpoint_dir.is_dir():
            # `latest` goes back to the good checkpoint and the later ones are set aside, so that --resume
            # continues from before the divergence.
            moved = ckpt.rewind(self.checkpoint_dir, good[-1][1] if good else None)
            if moved:
                logger.warning("set aside checkpoints saved after the divergence began: %s",
                               ", ".join(p.name for p in moved))
        self.context.barrier()
        if good:
            where = (f"the last checkpoint from before it is {good[-1][1]} (step {good[-1][0]}), where --resume "
                     "continues")
        else:
            where = "no checkpoint from before it was kept: start again"
        raise NonFiniteLossError(
            f"the loss is not finite (NaN or inf) at step {first_bad}; training stopped; {where}. "
            "Lower the learning rate (--lr: a resumed run applies the new rate from its step on), use a longer "
            "warm-up or clip gradients (--max-grad-norm).")

    def _check_health(self, record: dict[str, Any]) -> None:
        """Note whether a log record's training loss is finite and not exploding (over EXPLODING_FACTOR times
        the job's first logged loss); checkpoints saved within an unhealthy window stop counting as good."""
        loss = record.get("loss")
        if loss is None:
            return
        healthy = math.isfinite(loss) and (self.reference_loss is None or loss <= EXPLODING_FACTOR *
                                           max(self.reference_loss, 1e-3))
        if healthy and self.reference_loss is None:
            self.reference_loss = float(loss)
        if not healthy:
            self.good_checkpoints = [(s, p) for s, p in self.good_checkpoints if s <= self._window_start_step]
            if not self._diverging and self.context.is_main:
                logger.warning("step %d: the training loss %.4g is over %g times the first logged one (%.4g): "
                               "diverging? Checkpoints from here are not offered to resume from",
                               record["step"], loss, EXPLODING_FACTOR, self.reference_loss)
        self._diverging = not healthy
        self._window_start_step = record["step"]

    # -- logging, evaluation, checkpoints ----------------------------------------------------------

    def _log(self, tokens: float, elapsed: float, window_seconds: float) -> dict[str, Any]:
        """The log record of the window that ends at this step (reduced over the processes)."""
        values = self.window.reduce(self.context)
        self.window = _Window()
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

    def evaluate(self) -> dict[str, float]:
        """Metrics over the eval dataset (split over the processes), named eval_*.

        `eval_fn(model, batch)` gives them; without one, the step_fn's losses and metrics are used.
        """
        if self.evaluator is not None:
            return self._evaluate_whole()
        if self.eval_dataset is None:
            return {}
        context = self.context
        batch_size = self.args.eval_batch_size or max(1, self.args.batch_size // context.world_size)
        indices = list(range(context.rank, len(self.eval_dataset), context.world_size))
        chunks = [indices[i: i + batch_size] for i in range(0, len(indices), batch_size)]
        rounds = len(chunks)
        if self._is_fsdp:
            # FSDP gathers parameters with collectives in every forward: each process runs as many
            # batches; one that has run out repeats its last and discards the result.
            rounds = math.ceil(math.ceil(len(self.eval_dataset) / context.world_size) / batch_size)
        model = self.model if self._is_fsdp else self.module  # DDP's forward would sync buffers
        window = _Window()
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                for index in range(rounds):
                    chunk = chunks[min(index, len(chunks) - 1)] if chunks else [0]
                    cpu_batch = self.collate([self.eval_dataset[i] for i in chunk])
                    batch = self._to_device(cpu_batch)
                    with self._autocast():
                        if self.eval_fn is not None:
                            metrics = dict(self.eval_fn(model, batch))
                        else:
                            losses, metrics = self.step_fn(model, batch)
                            metrics = dict(metrics)
                            count = self.count_fn(cpu_batch)
                            for name, value in (losses.items() if isinstance(losses, Mapping) else [("loss", losses)]):
                                n = float(count[name] if isinstance(count, Mapping) else count)
                                metrics[name] = (value.float() * n, n) if n else (0.0, 0.0)
                    if index >= len(chunks):
                        continue
                    for name, value in metrics.items():
                        window.add(name, *(value if _is_pair(value) else (value, 1.0)))
        finally:
            self.module.train(was_training)
        return {f"eval_{name}": value for name, value in window.reduce(context).items()}

    def _evaluate_whole(self) -> dict[str, float]:
        """The evaluator's metrics, named eval_*. Every process runs it on the whole set (metrics such as F1 or
        a correlation do not split into per-batch sums); the results are the main process's."""
        if self._is_fsdp:
            raise ValueError("an evaluator needs the whole model in each process: not available under FSDP")
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad(), self._autocast():
                results = dict(self.evaluator(self.module))
        finally:
            self.module.train(was_training)
        if self.context.is_distributed:  # the same numbers everywhere, whatever the kernels' rounding
            results = self.context.all_gather_object(results)[0]
        return {f"eval_{name}": float(value) for name, value in results.items()}

    def _is_better(self, record: dict[str, Any]) -> bool:
        key = f"eval_{self.args.best_metric}"
        if key not in record:
            raise KeyError(f"best_metric {self.args.best_metric!r}: the evaluation gave only "
                           f"{sorted(k[5:] for k in record if k.startswith('eval_'))}")
        value = record[key]
        if not math.isfinite(value):
            return self.best is None
        if self.best is None or not math.isfinite(self.best[key]):
            return True
        return value > self.best[key] if self.args.greater_is_better else value < self.best[key]

    def _run_eval(self, elapsed: float) -> dict[str, float]:
        results = self.evaluate()
        if results:
            record = {"step": self.step, "epoch": self._epochs_done(), **results, "elapsed": elapsed}
            if self.summarize_fn:
                record.update(self.summarize_fn(record))
            if self.args.best_metric:
                record["is_best"] = self._is_better(record)
                if record["is_best"]:
                    self.best = record
                    if self.on_best is not None:
                        model = self.final_model()
                        if self.context.is_main:
                            self.on_best(model, record)
                        self.context.barrier()
            self._write_log(record)
            if self.context.is_main:
                logger.info("step %d: %s", self.step, ", ".join(f"{k}={v:.4g}" for k, v in results.items()))
        return results

    def _epochs_done(self) -> float:
        """Passes over the current phase's data so far, as a fraction: 1.0 at the end of the first epoch."""
        plan = self.plans[min(self.position.phase, len(self.plans) - 1)]
        return round(self.position.epoch + self.position.step_in_epoch / plan.steps_per_epoch, 4)

    def state_dict(self) -> dict[str, Any]:
        """The full training state (gathered to every process; only the main one writes it)."""
        if self._is_fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            # Gathered whole; on GPUs straight to CPU memory (offloading from CPU crashes in torch 2.13).
            model_state, optimizer_state = get_state_dict(self.model, self.optimizer, options=StateDictOptions(
                full_state_dict=True, cpu_offload=self.device.type != "cpu"))
        else:
            model_state, optimizer_state = self.module.state_dict(), self.optimizer.state_dict()
        config = getattr(self.module, "config", None)
        return {
            "format": "bertforge-training-state", "version": 1,
            "step": self.step, "total_steps": self.total_steps,
            "data_position": dataclasses.asdict(self.position), "seed": self.args.seed,
            "model": {k: v.detach().cpu() for k, v in model_state.items()},
            "optimizer": optimizer_state,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "rng": self.context.all_gather_object(ckpt.rng_state()),
            "world_size": self.context.world_size,
            "log_window": self.window.state(),
            "best": self.best,
            "train_seconds": self.train_seconds + self.run_seconds,
            "config": config.to_dict() if hasattr(config, "to_dict") else None,
            "settings": self._resume_settings(),
            "loss_health": {"reference_loss": self.reference_loss, "diverging": self._diverging,
                            "good_checkpoints": [p.name for _, p in self.good_checkpoints if p.exists()]},
            "args": {k: (str(v) if isinstance(v, os.PathLike) else v) for k, v in dataclasses.asdict(self.args).items()},
            **self.checkpoint_extra,
        }

    def final_model(self) -> nn.Module | None:
        """The trained model as a plain module, e.g. for `save_pretrained` (every process must call it).

        Under FSDP each process holds only a shard: the parameters are gathered into a new, unsharded
        model of the same class on the main process (None on the others).
        """
        if not self._is_fsdp:
            return self.module
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.model, options=StateDictOptions(
            full_state_dict=True, cpu_offload=self.device.type != "cpu"))
        if not self.context.is_main:
            return None
        model = type(self.module)(self.module.config)
        model.load_state_dict({k: v.cpu() for k, v in state.items()})
        return model

    def save(self) -> Path:
        self._check_finite()  # never save a diverged model
        state = self.state_dict()  # a collective under FSDP / DDP: every process takes part
        path = self.checkpoint_dir / ckpt.checkpoint_name(self.step)
        # While the loss explodes, or before this window's loss is logged, the last checkpoint known to be good
        # is never pruned: it is the one to go back to.
        confirmed = [p for s, p in self.good_checkpoints if s <= self._window_start_step and s != self.step]
        keep = confirmed[-1] if confirmed and (self._diverging or self.step != self._window_start_step) else None
        if self.context.is_main:
            path = ckpt.save_checkpoint(self.checkpoint_dir, state, self.step, self.args.keep_last, keep=keep)
        self.context.barrier()
        self.last_checkpoint = path
        if not self._diverging:
            self.good_checkpoints = [(s, p) for s, p in self.good_checkpoints if s != self.step and p.exists()]
            self.good_checkpoints.append((self.step, path))
        return path

    def _resume_settings(self) -> dict[str, Any]:
        """What a resumed run must share with its checkpoint, by flag: see RESUME_SETTINGS and `settings`."""
        values = {f"--{name.replace('_', '-')}": getattr(self.args, name) for name in RESUME_SETTINGS}
        values["the examples per phase"] = [len(phase.dataset) for phase in self.phases]
        values["the batch size per phase"] = [plan.batch_size for plan in self.plans]
        return {**values, **self.settings}

    def _check_resume_settings(self, state: dict[str, Any], path: str | os.PathLike | None) -> None:
        """Refuse, in one line naming each setting, a resumed run whose result-changing settings differ."""
        saved = state.get("settings")
        if saved is None:  # a checkpoint from before settings were recorded: its TrainingArguments
            saved_args = state.get("args") or {}
            saved = {f"--{n.replace('_', '-')}": saved_args[n] for n in RESUME_SETTINGS if n in saved_args}
        current = self._resume_settings()
        differ = [name for name in current if name in saved and _plain(saved[name]) != _plain(current[name])]
        if differ:
            raise ValueError(
                f"--resume: this run's settings differ from those of the checkpoint {path or ''}: " + "; ".join(
                    f"{name} {_show(current[name])} here, {_show(saved[name])} there" for name in differ)
                + ". Resume with the checkpoint's settings, or start a new run in another --output-dir")

    def _apply_new_lr(self, saved_lr: float | None) -> None:
        """A resumed run with another --lr: the schedule continues its shape from the resumed step, scaled to
        the new peak rate (e.g. after a divergence, the same warm-up and decay at a lower rate)."""
        if saved_lr is None or saved_lr == self.args.lr:
            return
        self.scheduler.base_lrs = [self.args.lr for _ in self.optimizer.param_groups]
        for group, factor in zip(self.optimizer.param_groups, self.scheduler.lr_lambdas):
            group["initial_lr"] = self.args.lr
            group["lr"] = self.args.lr * factor(self.scheduler.last_epoch)
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]
        self.last_lr = self.scheduler.get_last_lr()[0]
        if self.context.is_main:
            logger.warning("--resume with --lr %g (the checkpoint's run had %g): the new rate applies from step %d "
                           "on, with the same warm-up and decay; the rate is now %.4g", self.args.lr, saved_lr,
                           int(self.scheduler.last_epoch), self.last_lr)

    def load_state(self, state: dict[str, Any], path: str | os.PathLike | None = None) -> None:
        self._check_resume_settings(state, path)
        if state.get("total_steps") not in (None, self.total_steps):
            raise ValueError(f"--resume: the checkpoint was made for a run of {state['total_steps']} steps, this one "
                             f"has {self.total_steps} (--max-steps, --epochs or --phase2-steps differ): the "
                             "learning-rate schedule would not continue")
        over = {True: "the time budget", False: "the steps"}
        saved_budget = bool((state.get("args") or {}).get("budget_schedule", False))
        if saved_budget != self.args.budget_schedule:
            raise ValueError(f"the checkpoint's learning rate was scheduled over {over[saved_budget]}, this run's "
                             f"over {over[self.args.budget_schedule]}: give --budget-schedule as the run that made it")
        config = getattr(self.module, "config", None)
        saved = state.get("config")
        if saved is not None and hasattr(config, "to_dict"):
            current = config.to_dict()
            differ = sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
            if differ:
                raise ValueError("the checkpoint's model config differs from this run's in " + ", ".join(
                    f"{k} ({saved.get(k)!r} there, {current.get(k)!r} here)" for k in differ))
        if self._is_fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"], options=StateDictOptions(full_state_dict=True))
        else:
            self.module.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._apply_new_lr((state.get("args") or {}).get("lr"))
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step = int(state["step"])
        self.position = DataPosition(**state["data_position"])
        self.best = state.get("best")
        health = state.get("loss_health") or {}
        self.reference_loss = health.get("reference_loss")
        self._diverging = bool(health.get("diverging", False))
        self._window_start_step = self.step
        names = set(health.get("good_checkpoints", []))
        if path is not None and not self._diverging:  # it was good when saved
            names.add(Path(path).name)
        self.good_checkpoints = [(int(ckpt.checkpoint_step(p)), p) for p in ckpt.list_checkpoints(self.checkpoint_dir)
                                 if p.name in names and ckpt.checkpoint_step(p) <= self.step]
        self.train_seconds, self.run_seconds = float(state.get("train_seconds", 0.0)), 0.0
        self.window = _Window()
        if self.context.world_size == state.get("world_size", 1):
            self.window.load(state.get("log_window", {}))
        rngs = state["rng"]
        if len(rngs) == self.context.world_size:
            ckpt.set_rng_state(rngs[self.context.rank])
        else:
            logger.warning("checkpoint has RNG states of %d processes, this run has %d: reseeding",
                           len(rngs), self.context.world_size)
            ckpt.seed_everything(self.args.seed + 1_000_003 * self.step + self.context.rank)

    def _truncate_log(self, step: int) -> None:
        """Drop log lines past the resumed step (written after the checkpoint by the interrupted run)."""
        if not self.context.is_main or not self.log_path.is_file():
            return
        kept = []
        for line in self.log_path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except json.JSONDecodeError:  # a line cut short by the interruption
                continue
        ckpt.atomic_write(self.log_path, lambda file: file.write("".join(f"{l}\n" for l in kept).encode()))

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

        from tqdm.auto import tqdm

        bar = tqdm(total=self.total_steps, initial=self.step, unit="step", dynamic_ncols=True,
                   disable=not (args.progress and context.is_main))
        self.module.train()
        self._run_started = started = time.perf_counter()
        self._paused_seconds = 0.0
        window_start, paused, tokens = started, 0.0, 0.0  # eval and saving do not count in the throughput
        eval_results, budget_spent = None, False
        try:
            steps = self._steps()
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
            bar.close()
        return TrainResult(self.step, self.last_log, self.last_checkpoint, eval_results, self.best, budget_spent)
