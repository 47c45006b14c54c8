"""The one loop that carries memory through a stream of segments: eval mode, init memory, reset rows, forward, carry.

Evaluation, the analyses and the long-range tasks all read a stream this way; writing it once keeps them agreeing on
what a reset row, a carried memory and the model's mode mean. It is a generator so that a caller can act between
segments (accumulate statistics, back-propagate one segment's loss) before the next forward pass runs.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import Tensor

from compressive_transformer.core.memory import MemoryState
from compressive_transformer.core.models.checks import check_token_ids


@dataclass(frozen=True)
class Segment:
    """One segment of a batch of streams; ``reset`` marks rows whose document starts here (their memory is cleared)."""

    tokens: Tensor  # (B, T)
    targets: Tensor | None = None  # (B, T)
    input_mask: Tensor | None = None  # (B, T) bool
    reset: Tensor | None = None  # (B,) bool


@dataclass(frozen=True)
class Streamed:
    """A segment's batch as given, the memory it read (before this segment's update) and the model's output;
    ``out.memory`` is what the next segment reads."""

    index: int
    batch: Any
    memory: MemoryState
    out: Any  # LMOutput


def segments(tokens: Tensor, seg_len: int, targets: Tensor | None = None) -> Iterator[Segment]:
    """(B, L) examples cut into consecutive segments of ``seg_len`` (the last may be shorter); no resets."""
    for s in range(0, tokens.shape[1], seg_len):
        yield Segment(tokens[:, s : s + seg_len], None if targets is None else targets[:, s : s + seg_len])


def stream(
    model: Any,
    batches: Iterable[Any],
    *,
    batch_size: int,
    mem_len: int | None = None,
    cmem_len: int | None = None,
    device: torch.device | str | None = None,
    amp_dtype: torch.dtype | None = None,
    eval_mode: bool = True,
    with_targets: bool = False,
    grad: bool | Callable[[Any], bool] | None = None,
    **forward_kwargs: Any,
) -> Iterator[Streamed]:
    """Run ``model`` over ``batches`` (objects with ``tokens`` and optionally ``targets``, ``input_mask``, ``reset``)
    from an empty memory of ``batch_size`` rows, carrying memory from segment to segment.

    ``eval_mode`` puts the model in eval mode for the stream and restores its mode afterwards (also when the caller
    stops early). ``with_targets`` passes each batch's targets to the model (its loss); ``grad`` (a flag, or a
    function of the batch) sets whether the forward pass records a graph, else the caller's grad mode holds.
    ``amp_dtype`` runs the forward pass under autocast. Other keywords go to every forward call.
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    was_training = model.training
    if eval_mode:
        model.eval()
    lengths = {k: v for k, v in (("mem_len", mem_len), ("cmem_len", cmem_len)) if v is not None}
    memory = model.init_memory(batch_size, device=device, **lengths)
    try:
        for i, batch in enumerate(batches):
            reset = getattr(batch, "reset", None)
            if reset is not None and bool(reset.any()):
                memory = memory.reset(reset.to(device))
            kwargs = dict(forward_kwargs)
            mask = getattr(batch, "input_mask", None)
            if mask is not None:
                kwargs["input_mask"] = mask.to(device)
            if with_targets:
                kwargs["targets"] = batch.targets.to(device)
            if device.type != "cpu" and not batch.tokens.is_floating_point():  # the forward checks CPU ids itself
                check_token_ids(model.cfg, batch.tokens, batch.targets if with_targets else None)
            want = grad(batch) if callable(grad) else grad
            grad_mode = torch.set_grad_enabled(want) if want is not None else contextlib.nullcontext()
            with grad_mode, torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                out = model(batch.tokens.to(device), memory=memory, **kwargs)
            yield Streamed(i, batch, memory, out)
            memory = out.memory
    finally:
        if eval_mode:
            model.train(was_training)


__all__ = ["Segment", "Streamed", "segments", "stream"]
