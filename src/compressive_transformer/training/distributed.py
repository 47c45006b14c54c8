"""Multi-process data parallelism (``torchrun``): which rank this is, which stream rows it owns, and the few
collectives the trainer needs. With one process every function is a cheap no-op, so the trainer has one code path.

Each rank owns a contiguous block of the global batch's rows: its own streams and their memories. Every rank builds
the same global stream iterator (same seed) and keeps its rows, so the data order, and a checkpoint's data position,
do not depend on the number of ranks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch
import torch.distributed as dist

from compressive_transformer.core.config import ConfigError

T = TypeVar("T")


class PeerStopped(ConfigError):
    """A process other than the main one cannot go on because the main one stopped (and undid the run it was
    starting): the main process says why, so this one says nothing (docs/distributed.md: said once)."""


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def rows(self, global_batch: int) -> slice:
        """The global batch rows this rank owns."""
        if global_batch % self.world_size:
            raise ConfigError(
                f"train.batch_size: {global_batch} streams cannot be split over {self.world_size} processes; "
                f"use a multiple of {self.world_size}"
            )
        per_rank = global_batch // self.world_size
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)


def init_distributed(device: torch.device) -> DistInfo:
    """Join the process group ``torchrun`` describes (WORLD_SIZE > 1): gloo on CPU, nccl on CUDA."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size())


def from_main(make: Callable[[], T], device: torch.device) -> T:
    """``make()`` called on the main process only and its result (picklable) given to every process of the group
    ``torchrun`` describes (joined here): a fresh run directory's name, which each process would stamp differently."""
    info = init_distributed(local_device(device))
    if not info.active:
        return make()
    box = [make() if info.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def local_device(device: torch.device) -> torch.device:
    """On a multi-GPU node each process drives the GPU of its LOCAL_RANK."""
    if device.type == "cuda" and device.index is None and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def barrier(info: DistInfo) -> None:
    if info.active:
        dist.barrier()


def all_reduce_sum(values: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.active:
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def gather_rows(tensors: dict[str, torch.Tensor], info: DistInfo) -> dict[str, torch.Tensor]:
    """Concatenate every rank's batch rows (dim 0) of each tensor; 0-dim tensors (counters) are the same on all
    ranks and kept as they are. Every rank gets the result."""
    if not info.active:
        return tensors
    out = {}
    for name, t in tensors.items():
        if t.dim() == 0:
            out[name] = t
            continue
        parts = [torch.empty_like(t) for _ in range(info.world_size)]
        dist.all_gather(parts, t.contiguous())
        out[name] = torch.cat(parts, dim=0)
    return out


def shutdown(info: DistInfo) -> None:
    """Leave the process group together, once every rank's work (the main rank's last checkpoint included) is done.
    A rank that left alone while its peer still held the connections was seen, once in many CI runs, to abort in
    gloo's C++ teardown (SIGABRT, "terminate called without an active exception")."""
    if info.active and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def with_every_parameter(objective: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    """``objective`` plus zero times every parameter, so each one is in every step's graph and gets a gradient (zero
    for those the step did not use: a compressor before its first compression, a stream with no slots yet). DDP can
    then be built without ``find_unused_parameters``, which costs a traversal of the autograd graph per step; the
    gradients are unchanged."""
    return objective + sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0
