"""Stopping an agent run whose numbers stopped being finite, in one line that says what to change, as text training
does: the loss or the gradient norm of an update, the weights after it, or the policy's logits while acting."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from compressive_transformer.runs.checkpoint import weights_finite
from compressive_transformer.training.trainer import TrainingError


class AgentDiverged(TrainingError):
    """A value of the agent became NaN or infinite; its message first says which, then (from the learner) what to do."""


def require_finite_logits(logits: torch.Tensor) -> None:
    """Before sampling actions: NaN or infinite logits cannot be sampled from (torch would raise deep inside)."""
    if not bool(torch.isfinite(logits).all()):
        raise AgentDiverged("the policy's logits became non-finite while acting")


def require_finite(what: str, value: torch.Tensor | float) -> None:
    """A loss or a gradient norm of an update, checked before it changes the weights."""
    number = float(value)
    if not math.isfinite(number):
        raise AgentDiverged(f"{what} became {number}")


def require_finite_weights(model: torch.nn.Module) -> None:
    if not weights_finite(model):
        raise AgentDiverged("a weight became non-finite")


def diverged(error: AgentDiverged, update: int, checkpoint: Path | None) -> AgentDiverged:
    """The learner's one line: what diverged and when, where the run can continue from, and what to change."""
    if checkpoint is not None:
        where = f"continue from {checkpoint} with --resume and"
    else:
        where = "no checkpoint was written; start the run again with"
    return AgentDiverged(
        f"{error} at update {update}; training stopped ({where} a lower train.lr, e.g. --set train.lr=1e-4, or a "
        "tighter train.grad_clip)"
    )


__all__ = ["AgentDiverged", "diverged", "require_finite", "require_finite_logits", "require_finite_weights"]
