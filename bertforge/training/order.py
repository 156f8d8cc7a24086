"""The order in which training reads its data: an epoch's permutation, the examples of each step and
process, and where in the data a run stands.

Each epoch visits the dataset in a permutation drawn from a generator seeded with (seed, epoch); a step
takes the next `batch_size × grad_accum` indices and each process reads its own slice of every
micro-batch (`StepPlan`). The data position is therefore (phase, epoch, steps done in the epoch)
(`DataPosition`), and a resumed run continues with the exact next batch. `length_grouped_order` is the
alternative epoch order whose batches hold examples of similar lengths.
"""

from __future__ import annotations

import math
import dataclasses
import queue
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader

__all__ = ["DataPosition", "Phase", "StepPlan", "epoch_permutation", "length_grouped_order", "phase_steps",
           "prefetched", "training_steps"]


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


def length_grouped_order(lengths: Sequence[int], batch_size: int, seed: int, epoch: int = 0,
                         chunk_batches: int = 50) -> list[int]:
    """An epoch's example order in which each batch holds examples of similar length.

    The trick of Hugging Face's `group_by_length`: shuffle all examples, cut them into chunks of
    `batch_size * chunk_batches`, sort each chunk by length (longest first) and cut it into
    batches, then shuffle the batches, so that batches pad little yet every batch and the batch
    order are random. The batch holding the longest example goes first (an out-of-memory shows at
    step 1, not hours in) and a final partial batch stays last, so `order[k*batch_size:(k+1)*batch_size]`
    is always batch k. Deterministic for a (seed, epoch); a different epoch gives a different order.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    lengths = np.asarray(lengths)
    rng = np.random.default_rng([seed, epoch])
    permutation = rng.permutation(len(lengths))
    chunk = batch_size * chunk_batches
    batches = []
    for start in range(0, len(permutation), chunk):
        part = permutation[start:start + chunk]
        part = part[np.argsort(-lengths[part], kind="stable")]
        batches.extend(part[i:i + batch_size] for i in range(0, len(part), batch_size))
    if not batches:
        return []
    last = batches.pop() if len(batches[-1]) < batch_size else None
    batches = [batches[i] for i in rng.permutation(len(batches))]
    if batches:
        longest = max(range(len(batches)), key=lambda b: lengths[batches[b]].max())
        batches[0], batches[longest] = batches[longest], batches[0]
    if last is not None:
        batches.append(last)
    return [int(i) for batch in batches for i in batch]


def training_steps(phases: Sequence[Phase], plans: Sequence[StepPlan], phase_steps: Sequence[int],
                   position: DataPosition, done: int, seed: int, collate: Callable[[list], Any], num_workers: int = 0,
                   pin_memory: bool = False) -> Iterator[tuple[DataPosition, list[Any]]]:
    """From `position` (after `done` steps) on: (the position after each step, this process's collated
    micro-batches of that step), phase after phase, epoch after epoch, until each phase has had its
    `phase_steps`. Each epoch's order is the phase's `order_fn(seed, epoch)` or `epoch_permutation`;
    a dataset with `set_epoch` is told the epoch first."""
    position = dataclasses.replace(position)
    while position.phase < len(phases):
        phase, plan = phases[position.phase], plans[position.phase]
        phase_end = sum(phase_steps[: position.phase + 1])
        if done >= phase_end:
            position = DataPosition(position.phase + 1)
            continue
        if position.step_in_epoch >= plan.steps_per_epoch:
            position = DataPosition(position.phase, position.epoch + 1)
            continue
        if hasattr(phase.dataset, "set_epoch"):
            phase.dataset.set_epoch(position.epoch)
        if phase.order_fn is not None:
            order = torch.as_tensor(phase.order_fn(seed, position.epoch), dtype=torch.long)
            if len(order) != plan.size:
                raise ValueError(f"order_fn gave {len(order)} indices for a dataset of {plan.size}")
        else:
            order = epoch_permutation(plan.size, seed, position.epoch, position.phase)
        last = min(plan.steps_per_epoch, position.step_in_epoch + phase_end - done)
        steps = [plan.micro_batches(order, s) for s in range(position.step_in_epoch, last)]
        loader = DataLoader(phase.dataset, batch_sampler=[m for step in steps for m in step],
                            collate_fn=collate, num_workers=num_workers, pin_memory=pin_memory,
                            generator=torch.Generator())  # never draws from the global RNG
        batches = iter(loader)
        for step in steps:
            micro = [next(batches) for _ in step]
            position = DataPosition(position.phase, position.epoch, position.step_in_epoch + 1)
            done += 1
            yield position, micro


def phase_steps(phases: Sequence[Phase], plans: Sequence[StepPlan], max_steps: int | None,
                epochs: float | None) -> list[int]:
    """The optimizer steps of each phase: its own `steps`, else what `max_steps` leaves of the total after
    the other phases, else `epochs` passes over its data. `max_steps` wins over `epochs`, as in Hugging Face's
    Trainer: given both, training runs `max_steps` steps, passing over the data as many times as that takes
    (a recipe's default epochs never cut a step count the user asked for)."""
    if max_steps is None and epochs is None and any(p.steps is None for p in phases):
        raise ValueError("say how long to train: max_steps or epochs")
    steps = []
    for index, (phase, plan) in enumerate(zip(phases, plans)):
        if phase.steps is not None:
            steps.append(phase.steps)
            continue
        remaining = None if max_steps is None else max_steps - sum(
            p.steps or 0 for i, p in enumerate(phases) if i != index)
        by_epochs = None if epochs is None else math.ceil(epochs * plan.steps_per_epoch)
        count = remaining if remaining is not None else by_epochs
        if count < 1:
            raise ValueError(f"phase {index + 1} gets {count} steps: max_steps ({max_steps}) leaves none")
        steps.append(count)
    return steps


_DONE = object()


def prefetched(items: Iterator[Any], depth: int = 2, device: torch.device | None = None) -> Iterator[Any]:
    """`items`, the same ones in the same order, read up to `depth` ahead on a background thread.

    Why: on a GPU a training step does not wait for the device, so the host runs ahead of it; reading
    and collating the next batches (and pinning them, `training_steps(pin_memory=True)`) on a thread of
    its own keeps that work off the thread that launches the kernels, without the worker processes
    of `num_workers` (their start-up, their copies of the dataset). An exception raised while reading
    is raised here, at the item it stopped at; closing this generator stops the thread. `device`: a
    CUDA device to make the thread's current one (pinning memory on another would start a context
    there), as the DataLoader's own pinning thread does."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            if device is not None and device.type == "cuda":
                torch.cuda.set_device(device)
            for item in items:
                if not put((item, None)):
                    return
        except BaseException as error:  # handed to the consumer, raised there
            put((_DONE, error))
            return
        put((_DONE, None))

    thread = threading.Thread(target=read, name="bertforge-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = ready.get()
            if item is _DONE:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()
