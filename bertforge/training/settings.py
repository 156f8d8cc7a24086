"""The training settings, each declared once: what the engine reads, and what a run adds.

* `TrainingSettings`: the settings every training run is configured by (batch, steps, learning rate and
  warm-up, precision, cadence of logs, evaluations and checkpoints, budget, devices), with the checks
  that need no data;
* `TrainingArguments(TrainingSettings)`: what the `Trainer` reads: those settings and the few a caller
  decides rather than a user (whether to drop an epoch's last step, which metric picks the best model, ...);
* `RunSettings(TrainingSettings)`: what a `pretrain` or `finetune` run adds: resume and the unpadded
  encoder. `PretrainingArguments` (pretraining/trainer.py) and `FinetuneArguments` (training/finetune.py)
  extend it with their own settings and override a default where the two recipes differ (`override`),
  keeping the declaration here.

Each field carries its command-line help in `metadata` (and, where the flag differs from the field's
name and type, its spelling: `flag`, `metavar`, `nargs`, `const`, `action`, `choices`), so that the CLI
generates its flags from the fields (`bertforge.cli.flags`). `help` is argparse text (`%%` for a percent
sign) and describes the flag as spelled: a field whose default is True is the flag `--no-NAME`, one marked
`negatable` the pair `--NAME/--no-NAME`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import torch

PRECISION_NAMES = ("fp32", "bf16", "fp16")  # autocast dtypes (training/loop.py's PRECISIONS maps them)


def setting(default: Any = dataclasses.MISSING, help: str | None = None, *, kw_only: bool = False,
            **flag: Any) -> Any:
    """A dataclass field with its help and flag spelling in `metadata` (see the module docstring);
    `kw_only` for a required setting of a subclass (its fields follow the base's, which have defaults)."""
    return field(default=default, kw_only=kw_only, metadata={"help": help, **flag})


def override(cls: type, name: str, default: Any = dataclasses.MISSING, **metadata: Any) -> Any:
    """`cls.name` with another default (and help or flag details): a subclass's recipe for the same setting."""
    base = {f.name: f for f in dataclasses.fields(cls)}[name]
    if default is dataclasses.MISSING:
        default = base.default
    return field(default=default, metadata={**base.metadata, **metadata})


@dataclass
class TrainingSettings:
    """What every training run is configured by; see the module docstring."""

    output_dir: str | os.PathLike = setting(help="where the run writes log.jsonl, checkpoints/ and the model")
    batch_size: int = setting(32, "examples per micro-batch, all processes together")
    grad_accum: int = setting(1, "micro-batches per optimizer step")
    max_steps: int | None = setting(None, "optimizer steps in all; wins over --epochs (and its default): the data "
                                    "is passed over as many times as N steps take")
    epochs: float | None = setting(None, "passes over the training data (ignored when --max-steps is given)")
    lr: float = setting(1e-4, "peak learning rate")
    weight_decay: float = setting(0.01, "AdamW weight decay (none on LayerNorm weights and biases)")
    # The paper's 1e-6 (Google's optimization.py). A task whose gradients are of that size or smaller sets
    # its own in its recipe (multi-label: 1e-8, see tasks/multi_label.py).
    adam_epsilon: float = setting(1e-6, "AdamW's epsilon, added to the root of its second moment (a task's "
                                  "recipe may set its own: multi-label 1e-8)")
    warmup_steps: int | None = setting(None, "linear warm-up steps (instead of --warmup-ratio)")
    warmup_ratio: float | None = setting(None, "share of the steps for linear warm-up")
    precision: str = setting("fp32", "autocast precision (fp16 with a gradient scaler)", choices=PRECISION_NAMES)
    max_grad_norm: float | None = setting(1.0, "global-norm clipping; 0: none")
    seed: int = setting(0, "seed of the data order, the new weights and dropout")
    log_every: int = setting(10, "log the training metrics every N steps")
    save_every: int | None = setting(None, "training checkpoints every N steps, for --resume")
    keep_last: int | None = setting(3, "checkpoints kept")
    eval_every: int | None = setting(None, "evaluate every N steps (default: at the end)")
    eval_batch_size: int | None = setting(None, "per process (default: --batch-size / processes)")
    num_workers: int = setting(0, "data-loading worker processes")
    num_threads: int | None = setting(None, "torch threads per process")
    device: str | None = setting(None, "cpu, cuda, cuda:1 ... (default: the GPU if there is one)")
    fsdp: bool = setting(False, "FullyShardedDataParallel under torchrun (GPU-oriented)")
    compile: bool = setting(False, "CUDA: torch.compile the per-token parts of each layer (dense + GELU, dense + "
                                   "dropout + residual + LayerNorm) into fused kernels; the first steps compile")
    progress: bool = setting(True, "no progress bar")  # the flag is --no-progress
    max_minutes: float | None = setting(
        None, "wall-clock budget: when spent, stop as if at the last step (final evaluation, checkpoint and "
        "model); the schedule still assumes --max-steps unless --budget-schedule")
    budget_schedule: bool = setting(
        False, "with --max-minutes: warm up and decay the learning rate over the budget's time instead of "
        "--max-steps, reaching 0 as it is spent (warm-up: --warmup-steps, default 1%% of the budget)")

    def __post_init__(self) -> None:
        if self.precision not in PRECISION_NAMES:
            raise ValueError(f"precision must be one of {sorted(PRECISION_NAMES)}, got {self.precision!r}")
        for name in ("batch_size", "grad_accum", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.epochs is not None and self.epochs <= 0:
            raise ValueError(f"epochs must be > 0, got {self.epochs}")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be > 0, got {self.max_minutes}")
        if self.budget_schedule and self.max_minutes is None:
            raise ValueError("budget_schedule (--budget-schedule) needs max_minutes (--max-minutes), "
                             "the budget it runs over")
        if self.compile:
            device = str(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))
            if not device.startswith("cuda"):
                raise ValueError(f"compile (--compile) needs a CUDA device, not {device}: on CPU, Inductor's fused "
                                 "linear kernels fail on the packed layers' changing shapes and the CPU dropout "
                                 "breaks the graph (the eager CPU plans are the fast path there)")

    def training_arguments(self, **overrides: Any) -> TrainingArguments:
        """The engine's arguments: these settings (TrainingSettings' fields only) with `overrides`, e.g. the
        caller's `best_metric` or a learning rate it resolved."""
        shared = {f.name: getattr(self, f.name) for f in dataclasses.fields(TrainingSettings)}
        return TrainingArguments(**{**shared, **overrides})


@dataclass
class TrainingArguments(TrainingSettings):
    """The `Trainer`'s arguments: the settings and what its caller decides (never a command-line flag)."""

    drop_last: bool = True  # an epoch's last, incomplete step is skipped (else taken, smaller)
    find_unused_parameters: bool = False  # DDP: a task whose step leaves some parameters without gradient
    save_final: bool = True  # a checkpoint at the last step
    eval_each_epoch: bool = False  # also evaluate at the end of every epoch
    best_metric: str | None = None  # an evaluation result (without "eval_") that picks the best model
    greater_is_better: bool = True
    keep_freed_memory: bool = True  # CPU: keep freed tensors' pages in the process (memory.keep_freed_memory)


@dataclass
class RunSettings(TrainingSettings):
    """What a `pretrain` or `finetune` run adds to the engine's settings (the base of their arguments)."""

    resume: str | os.PathLike | bool | None = setting(
        None, "continue OUT's latest checkpoint (or the file/directory given)", nargs="?", const=True,
        metavar="CHECKPOINT")
    # The flag is --unpad/--no-unpad; when neither is given the field's default, True, applies.
    unpad: bool = setting(True, "the encoder computes only the real tokens of each batch (default: on; "
                          "--no-unpad: the padded path, the same losses to rounding)", negatable=True)
