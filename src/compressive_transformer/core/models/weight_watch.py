"""How a :class:`~compressive_transformer.core.models.decode.Decoder` knows the weights it derived its state from
have changed, without reading them again per token (which would double a token's cost).

A write is seen when any ``torch.optim`` optimizer steps over one of the watched parameters (a process-wide hook that
marks the live watches; fused optimizers write parameters without bumping ``Tensor._version`` on the CPU), when
``load_state_dict`` or any in-place op under autograd's version counter writes one, and when the user calls
:func:`weights_changed` (the one thing a hand-written ``p.data`` assignment needs). Models hold no state for it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook


class WriteWatch:
    """Tells whether any of ``params`` was written since the watch was made (see the module docstring)."""

    def __init__(self, params: Iterable[nn.Parameter]) -> None:
        self._params = list(params)
        self._ids = {id(p) for p in self._params}
        self._versions = self._version_sum()
        self._written = False
        _ensure_optimizer_hook()
        _WATCHES.add(self)

    def _version_sum(self) -> int:
        return sum(p._version for p in self._params)

    def mark(self, params: Iterable[Tensor]) -> None:
        """Record a write to ``params`` if any of them is watched."""
        if any(id(p) in self._ids for p in params):
            self._written = True

    @property
    def written(self) -> bool:
        return self._written or self._version_sum() != self._versions


_WATCHES: weakref.WeakSet[WriteWatch] = weakref.WeakSet()
_HOOK: list = []  # the optimizer hook's handle, once registered


def _after_optimizer_step(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    if not _WATCHES:
        return
    stepped = [p for group in optimizer.param_groups for p in group["params"]]
    for watch in list(_WATCHES):
        watch.mark(stepped)


def _ensure_optimizer_hook() -> None:
    """Registered when the first watch is made (a process-wide hook that only marks live watches)."""
    if not _HOOK:
        _HOOK.append(register_optimizer_step_post_hook(_after_optimizer_step))


def weights_changed(model: nn.Module) -> None:
    """Declare that ``model``'s weights were written in a way no hook sees (e.g. ``p.data = ...``): every live
    watch over any of its parameters reports a write."""
    params = list(model.parameters())
    for watch in list(_WATCHES):
        watch.mark(params)


class DeclaresWrites:
    """Mixin for the model kinds: ``model.weights_changed()``, the public form of :func:`weights_changed`."""

    def weights_changed(self) -> None:
        """Call after writing weights by hand through ``.data`` (optimizers, ``load_state_dict`` and in-place ops
        are seen without it): a :class:`~.models.decode.Decoder` made before then refuses to continue."""
        weights_changed(self)  # type: ignore[arg-type]


__all__ = ["DeclaresWrites", "WriteWatch", "weights_changed"]
