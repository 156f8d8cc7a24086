"""The Trainer's evaluation: batch metrics over an eval dataset or a whole-set evaluator, and the best model
(mixed into `Trainer`, loop.py).

`Evaluation` holds no state of its own: its methods read the attributes `Trainer.__init__` sets (args,
module, model, context, eval_dataset, eval_fn, evaluator, on_best, summarize_fn, ...).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping

import torch

from ..modeling.modes import evaluating
from .window import MetricWindow

logger = logging.getLogger("bertforge")


class Evaluation:
    """Evaluation and best-model tracking of a `Trainer` (see the module docstring)."""

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
        window = MetricWindow()
        with evaluating(self.module), torch.no_grad():
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
                    window.add_metric(name, value)
        return {f"eval_{name}": value for name, value in window.reduce(context).items()}

    def _evaluate_whole(self) -> dict[str, float]:
        """The evaluator's metrics, named eval_*. Every process runs it on the whole set (metrics such as F1 or
        a correlation do not split into per-batch sums); the results are the main process's."""
        if self._is_fsdp:
            raise ValueError("an evaluator needs the whole model in each process: not available under FSDP")
        with evaluating(self.module), torch.no_grad(), self._autocast():
            results = dict(self.evaluator(self.module))
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
