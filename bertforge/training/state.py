"""The Trainer's training state: checkpoints, exact resume and loss health (mixed into `Trainer`, loop.py).

**Resume.** A checkpoint records the settings that change the result (RESUME_SETTINGS, the examples
per phase and the caller's `settings`, e.g. a data fingerprint); a resumed run with other values is
refused, naming each flag. A new learning rate is applied from the resumed step on (logged).

**Divergence.** A non-finite loss stops training (NonFiniteLossError) with `latest` rewound to the
last checkpoint saved before the loss became non-finite or exploded (EXPLODING_FACTOR times the
first logged loss); while the loss explodes, that checkpoint is never pruned.

`TrainingState` holds no state of its own: its methods read and write the attributes `Trainer.__init__`
sets (args, module, model, optimizer, scheduler, scaler, context, step, position, window, ...). It is a
separate class so that the loop (loop.py) reads as the loop and this file as what survives a restart.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_state_dict)

from ..modeling.config import BertConfig, restore_learned, run_defining
from . import checkpoint as ckpt
from .order import DataPosition
from .window import MetricWindow

logger = logging.getLogger("bertforge")

# A logged training loss above this many times the job's first logged loss marks the run as diverging:
# checkpoints saved in such a window are not offered as the checkpoint to go back to.
EXPLODING_FACTOR = 10.0

# TrainingArguments fields that change a run's result, each named by the flag that sets it: a resumed run
# must have the checkpoint's (`lr` is applied from the resumed step on instead, see `Trainer.load_state`).
RESUME_SETTINGS = ("batch_size", "grad_accum", "seed", "warmup_steps", "warmup_ratio", "weight_decay",
                   "adam_epsilon",
                   "max_grad_norm", "precision", "drop_last")


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the message names the step and the last checkpoint saved before the
    run diverged (training then resumes from it: `latest` points there), then the likely causes: by default
    the optimisation's (`ADVICE`); a task that knows better ones (a distillation: its temperature, the
    teacher's cached outputs) gives its own through `with_advice`."""

    ADVICE = ("Lower the learning rate (--lr: a resumed run applies the new rate from its step on), use a longer "
              "warm-up or clip gradients (--max-grad-norm).")

    def __init__(self, step: int, where: str, advice: str | None = None) -> None:
        self.step, self.where, self.advice = step, where, advice if advice is not None else self.ADVICE
        super().__init__(f"the loss is not finite (NaN or inf) at step {step}; training stopped; {where}. "
                         f"{self.advice}")

    def __reduce__(self):  # pickled (between processes) by its fields, not its message
        return type(self), (self.step, self.where, self.advice)

    def with_advice(self, advice: str) -> "NonFiniteLossError":
        """The same failure with `advice` in place of the default likely causes."""
        return type(self)(self.step, self.where, advice)


def _plain(value: Any) -> Any:
    """A setting as compared on resume: tuples as lists (a checkpoint stores lists)."""
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _show(value: Any) -> str:
    return "none" if value is None else (",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value))


class TrainingState:
    """Checkpoints, resume and loss health of a `Trainer` (see the module docstring)."""

    # -- the state a checkpoint holds ------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The full training state (gathered to every process; only the main one writes it)."""
        if self._is_fsdp:
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
            # What defines the run (architecture, vocabulary, task, labels), not what its evaluations learned
            # (thresholds: `LEARNED_BY_EVALUATION`), which the checkpoint's model carries on with.
            theirs, current = run_defining(saved), run_defining(config.to_dict())
            differ = sorted(k for k in set(theirs) | set(current) if theirs.get(k) != current.get(k))
            if differ:
                raise ValueError("the checkpoint's model config differs from this run's in " + ", ".join(
                    f"{k} ({theirs.get(k)!r} there, {current.get(k)!r} here)" for k in differ))
            if isinstance(config, BertConfig):
                restore_learned(config, saved)
        if self._is_fsdp:
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
        self.window = MetricWindow()
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

    # -- loss health -------------------------------------------------------------------------------

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
        raise NonFiniteLossError(first_bad, where)

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
