"""The training update as one CUDA graph (``train.cuda_graphs``): forward, task and compression losses, backward,
the update (:func:`~compressive_transformer.training.update.apply_update`: the same clipping and fused Adam step,
skipped on a non-finite gradient, as the eager step's), replayed with one launch over static buffers for the batch and the memory.

The model's forward has no host synchronisation and, once the memories are full, the same shapes at every step, so
the whole update can be captured (:class:`~compressive_transformer.core.graphs.StaticGraphs`). What changes from step
to step stays on the device: the learning rate is a tensor the schedule fills in, the optimizer keeps its step count
there (``capturable``), and the loss, compression loss and gradient norm come back as one small tensor read once per
update. A memory reset at a document boundary is applied to the static memory before the replay. Steps the graph does
not cover (the memory still filling, accumulated batches, fp16's loss scaling, several processes) run eagerly.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from compressive_transformer.core.dtypes import amp_dtype
from compressive_transformer.core.graphs import StaticGraphs
from compressive_transformer.core.memory import MemoryState
from compressive_transformer.training.low_precision import LowPrecisionWeights
from compressive_transformer.training.update import apply_update


def capture_reason(device: torch.device, amp: str, distributed: bool) -> str | None:
    """Why ``train.cuda_graphs`` cannot capture this run's updates, or None."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device (this run trains on {device.type})"
    if amp == "fp16":
        return "fp16's loss scaler skips steps from the host; use train.amp = 'bf16'"
    if distributed:
        return "several processes synchronise their gradients between kernels; one process only"
    return None


def make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """The learning rates as device tensors (the schedule fills them in place) and the step count on the device."""
    for group in optimizer.param_groups:
        device = group["params"][0].device
        group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
        group["capturable"] = True


class CapturedUpdate:
    """One optimizer update per call over a batch (tokens, targets, input mask: (B, T) on the device) and the memory;
    returns the device tensors [loss, compression loss, gradient norm] and the per-layer compression losses, and the
    next memory (static buffers: the next call overwrites both)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        amp: str,
        grad_clip: float,
        weights: LowPrecisionWeights | None = None,
    ):
        """weights: the low-precision copies ``model`` reads (a :class:`~.low_precision.WithLowPrecisionWeights`),
        refreshed by the update inside the graph."""
        self.model, self.optimizer, self.weights = model, optimizer, weights
        self.dtype = amp_dtype(amp)
        self.device_type = next(model.parameters()).device.type
        self.max_norm = grad_clip if grad_clip > 0 else float("inf")
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.graphs = StaticGraphs(self._update)

    def _update(self, inputs: tuple[Tensor, ...], memory: MemoryState) -> tuple[tuple[Tensor, Tensor], MemoryState]:
        tokens, targets, mask = inputs
        # amp "none": whatever autocast the caller is in (none in the trainer) holds; else autocast without its weight
        # cache, so the casts are captured with the step rather than read from a cache made outside the graph
        region = (
            torch.autocast(self.device_type, dtype=self.dtype, cache_enabled=False)
            if self.dtype is not None
            else contextlib.nullcontext()
        )
        with region:
            out = self.model(tokens, memory=memory, targets=targets, input_mask=mask)
        loss, aux = out.loss.float(), out.aux_loss.float()
        (loss + aux).backward()
        norm = apply_update(self.optimizer, self.params, max_norm=self.max_norm, weights=self.weights)
        stats = torch.stack([loss.detach(), aux.detach(), norm.float()])
        return (stats, out.aux_losses.float()), out.memory

    def __call__(
        self, tokens: Tensor, targets: Tensor, mask: Tensor, memory: MemoryState
    ) -> tuple[tuple[Tensor, Tensor], MemoryState]:
        outputs, memory = self.graphs((tokens, targets, mask), memory)
        self.optimizer.zero_grad(set_to_none=True)  # a later eager step must not add to the graph's gradients
        return outputs, memory
