"""The optimizer update: one function for the eager step and the captured one, so the two cannot drift.

An update sets the learning rate the schedule gives, clips the gradients to ``train.grad_clip`` and takes the Adam
step, which is skipped (weights and moments unchanged) when the gradient norm is not finite. The skip happens on the
device where the optimizer can take it there (fused Adam reads a ``found_inf`` flag, as under a gradient scaler), so
the captured step needs no host synchronisation; fp16's scaler skips such steps itself. A run under autocast then
refreshes the low-precision copies of its weights (:mod:`.low_precision`), one foreach copy.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import Tensor

from compressive_transformer.training.low_precision import LowPrecisionWeights


def set_lr(group: dict[str, Any], value: float) -> None:
    """Set a param group's learning rate, in place where it is a (captured) tensor."""
    if isinstance(group["lr"], Tensor):
        group["lr"].fill_(value)
    else:
        group["lr"] = value


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's learning rate for this update, scaled per group (``lr_scale``: the compressor's own scale)."""
    for group in optimizer.param_groups:
        set_lr(group, lr * group.get("lr_scale", 1.0))


def _fused(optimizer: torch.optim.Optimizer) -> bool:
    return all(group.get("fused") for group in optimizer.param_groups)


def apply_update(
    optimizer: torch.optim.Optimizer,
    params: Iterable[Tensor],
    *,
    max_norm: float,
    scaler: torch.amp.GradScaler | None = None,
    weights: LowPrecisionWeights | None = None,
) -> Tensor:
    """Clip the accumulated gradients of ``params`` to ``max_norm`` (inf: no clipping) and step ``optimizer``,
    skipping the step when their norm is not finite; then refresh ``weights``, the low-precision copies the forward
    reads. Returns the norm before clipping (a device tensor)."""
    scaling = scaler is not None and scaler.is_enabled()
    if scaling:
        scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(list(params), max_norm)
    if scaling:  # the scaler skips a step whose gradients are not finite, and adjusts its scale
        scaler.step(optimizer)
        scaler.update()
    elif _fused(optimizer):  # the skip as a flag the fused kernel reads: no host synchronisation
        optimizer.grad_scale, optimizer.found_inf = None, (~torch.isfinite(norm)).float()
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale, optimizer.found_inf
    elif torch.isfinite(norm):  # an optimizer without the flag: decided on the host (the eager step only)
        optimizer.step()
    if weights is not None:
        weights.refresh()
    return norm


__all__ = ["apply_update", "set_learning_rate", "set_lr"]
