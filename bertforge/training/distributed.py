"""Process-group set-up for `torchrun` and the few collectives the training loop needs.

Under `torchrun` (WORLD_SIZE > 1 in the environment) the process group is created from the
environment variables: NCCL on GPUs, Gloo on CPUs. Without it every helper is a no-op, so the same
loop runs in one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.nn.parallel import DistributedDataParallel


@dataclass
class DistributedContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")
    created_group: bool = False  # whether `setup` created the process group (and `teardown` ends it)

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.is_distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_reduce_max(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.is_distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor

    def all_gather_object(self, value):
        if not self.is_distributed:
            return [value]
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier()

    def teardown(self) -> None:
        if self.created_group and dist.is_initialized():
            dist.destroy_process_group()
            self.created_group = False


def setup(device: str | None = None) -> DistributedContext:
    """Join the process group that `torchrun` describes (if any) and pick this process's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    use_cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    created = False
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        created = True
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
    else:
        rank, world_size = 0, 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    if use_cuda:
        torch_device = torch.device("cuda", local_rank) if device in (None, "cuda") else torch.device(device)
        torch.cuda.set_device(torch_device)
    else:
        torch_device = torch.device(device or "cpu")
    return DistributedContext(rank, world_size, local_rank, local_world_size, torch_device, created)


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def configure_threads(context: DistributedContext, num_threads: int | None) -> None:
    """Intra-op threads: as asked; else, for several CPU processes on one machine, the cores split evenly.

    (torchrun sets OMP_NUM_THREADS=1 for each process, which leaves most cores idle on a large machine.)
    """
    if num_threads:
        torch.set_num_threads(num_threads)
    elif context.device.type == "cpu" and context.local_world_size > 1:
        torch.set_num_threads(max(1, available_cores() // context.local_world_size))


def wrap_model(model: nn.Module, context: DistributedContext, fsdp: bool = False,
               find_unused_parameters: bool = False) -> nn.Module:
    """What the training step calls: `model` itself in one process, else its DDP wrapper, or with `fsdp` its
    FullyShardedDataParallel wrapper (parameters, gradients and optimizer state sharded over the processes).

    FSDP makes one unit of each module whose class sets `fsdp_unit` (BERT: each Transformer layer,
    gathered just for its forward and backward) and puts the rest (embeddings tied to the MLM decoder,
    heads) in the root unit: the engine names no model class. use_orig_params: parameters keep their
    names (weight-decay groups) and the state_dict its layout.
    """
    if not context.is_distributed:
        return model
    device = context.device
    if fsdp:
        units = {type(m) for m in model.modules() if getattr(type(m), "fsdp_unit", False)}
        return FullyShardedDataParallel(model, use_orig_params=True, device_id=device,
                                        auto_wrap_policy=ModuleWrapPolicy(units) if units else None)
    return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                   find_unused_parameters=find_unused_parameters)


def grad_scaler(precision: str, device: torch.device, sharded: bool = False):
    """fp16's loss scaler (sharded under FSDP), or None for fp32 and bf16, which need none."""
    if precision != "fp16":
        return None
    if sharded:
        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type)
