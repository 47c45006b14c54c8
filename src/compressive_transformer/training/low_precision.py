"""The low-precision copies of the weights a bf16 (or fp16) run keeps from one update to the next.

Under autocast every matmul casts its fp32 weight to the autocast dtype at every step (and, with the cast cache off,
as the captured update runs, at every use). A run under autocast keeps those casts instead: a copy of each weight
that only matmuls read, refreshed in place once per update (one foreach copy after the optimizer step, in
:func:`~compressive_transformer.training.update.apply_update`, so the eager and the captured step share it), and read
by the forward in the weight's place (:func:`torch.func.functional_call`). The fp32 weights stay the masters: the
optimizer steps them, gradients reach them (a copy's gradient is cast to fp32, as autocast's cast does), checkpoints
hold them. The forward computes what autocast computes, the same rounding, made once per update instead of per use.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

MATMUL_MODULES = (nn.Linear, nn.Conv1d, nn.ConvTranspose1d)  # modules whose forward is a matmul autocast casts for


def matmul_weights(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters autocast casts wherever ``model`` reads them: those held by matmul modules only (a tied
    embedding is read by its lookup too), less the model's first parameter (its dtype stands for the model's) and what
    the model declares it reads in full precision (``model.full_precision_reads()``, where it has one)."""
    owners: dict[int, list[nn.Module]] = {}
    names: dict[int, tuple[str, nn.Parameter]] = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for name, p in module.named_parameters(prefix=module_name, recurse=False, remove_duplicate=False):
            owners.setdefault(id(p), []).append(module)
            names.setdefault(id(p), (name, p))
    excluded = {id(next(model.parameters()))}
    reads = getattr(model, "full_precision_reads", None)
    excluded |= {id(p) for p in (reads() if reads is not None else [])}
    return {
        name: p
        for key, (name, p) in names.items()
        if key not in excluded and p.is_floating_point() and all(isinstance(m, MATMUL_MODULES) for m in owners[key])
    }


class _Kept(torch.autograd.Function):
    """The kept copy in the forward; in the backward its gradient, cast to the master's dtype, for the master."""

    @staticmethod
    def forward(ctx: Any, master: Tensor, copy: Tensor) -> Tensor:
        ctx.dtype = master.dtype
        return copy.view_as(copy)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad.to(ctx.dtype), None


class LowPrecisionWeights:
    """Copies in ``dtype`` of ``model``'s :func:`matmul_weights`, made now and refreshed by :meth:`refresh`."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        weights = matmul_weights(model)
        self.names, self.masters = list(weights), list(weights.values())
        with torch.no_grad():
            self.copies = [p.detach().to(dtype) for p in self.masters]

    @torch.no_grad()
    def refresh(self) -> None:
        """The copies made again from the masters: after every write of the weights (an update, a loaded checkpoint)."""
        if self.copies:
            torch._foreach_copy_(self.copies, self.masters)

    def substitutes(self) -> dict[str, Tensor]:
        """Parameter name -> the copy the forward reads in its place (its gradient reaches the master)."""
        return {name: _Kept.apply(m, c) for name, m, c in zip(self.names, self.masters, self.copies)}


class WithLowPrecisionWeights(nn.Module):
    """``model`` whose forward reads ``weights``' copies in place of its matmul weights; its parameters (the masters)
    are ``model``'s, so an optimizer, DDP or ``torch.compile`` wraps it as they would the model."""

    def __init__(self, model: nn.Module, weights: LowPrecisionWeights) -> None:
        super().__init__()
        self.model = model
        self.weights = weights

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return functional_call(self.model, self.weights.substitutes(), args, kwargs, strict=False)


__all__ = ["LowPrecisionWeights", "WithLowPrecisionWeights", "matmul_weights"]
