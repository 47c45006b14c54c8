"""What the inference caches are keyed on, so that none of them can outlive the weights it was derived from.

Two mechanisms, each where it is both exact and cheap:

- :class:`ContentStamp` for caches inside the model (the positional projections W_r R, the memory's keys and values):
  a number that changes exactly when a weight's *values* change, found by comparing the weight with a private copy
  of the values last seen (one read of the weight, ~1/L of re-projecting L positions). It holds whoever wrote the
  weight and however: a fused optimizer step (which on CPU writes parameters without bumping ``Tensor._version``),
  ``.data``, ``load_state_dict``, a user's in-place op.
- :class:`WriteWatch` for objects that hold state derived from *all* weights and are used one token at a time (the
  decoder): reading every weight again per token would double the cost of a step, so it is told of writes instead.
  A write is seen when any ``torch.optim`` optimizer steps over one of the watched parameters (a global optimizer
  hook, fused kernels included), when ``load_state_dict`` or any in-place op under autograd's version counter writes
  one, and when the user calls :func:`weights_changed` (the one thing a hand-written ``p.data`` assignment needs).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable

import torch
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

_IDS = itertools.count(1)  # stamps are unique in the process, so a copied model's caches never match another's


class ContentStamp:
    """A process-unique number for the values one weight holds now; see the module docstring."""

    def __init__(self) -> None:
        self._seen: Tensor | None = None
        self._id = 0

    def current(self, weight: Tensor) -> int:
        """The stamp of ``weight``'s values: the previous one while they are equal (exactly, NaN never), else new."""
        w = weight.detach()
        seen = self._seen
        same = (
            seen is not None
            and seen.shape == w.shape
            and seen.dtype == w.dtype
            and seen.device == w.device
            and torch.equal(seen, w)
        )
        if not same:
            self._seen = w.clone()
            self._id = next(_IDS)
        return self._id

    def __deepcopy__(self, memo: dict) -> ContentStamp:
        # A copy starts with the same values, so its caches (copied with it) stay valid under the same number.
        new = ContentStamp()
        new._seen, new._id = (None if self._seen is None else self._seen.clone()), self._id
        return new


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
    watch over any of its parameters reports a write. Caches keyed on :class:`ContentStamp` need no notice."""
    params = list(model.parameters())
    for watch in list(_WATCHES):
        watch.mark(params)


class DeclaresWrites:
    """Mixin for the model kinds: ``model.weights_changed()``, the public form of :func:`weights_changed`."""

    def weights_changed(self) -> None:
        """Call after writing weights by hand through ``.data`` (optimizers, ``load_state_dict`` and in-place ops
        are seen without it): a :class:`~.models.decode.Decoder` made before then refuses to continue."""
        weights_changed(self)  # type: ignore[arg-type]


__all__ = ["ContentStamp", "DeclaresWrites", "WriteWatch", "weights_changed"]
