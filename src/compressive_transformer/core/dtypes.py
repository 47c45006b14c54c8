"""The dtypes the model computes in: autocast's where it is on (``compute_dtype``), autocast entered for a resolved
precision name (``autocast``) or turned off (``full_precision``). Resolving "auto" for a device is the run's business
(:mod:`compressive_transformer.runs.precision`); the model only reads what is in force."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

AMP_DTYPES: dict[str, torch.dtype | None] = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def amp_dtype(amp: str | torch.dtype | None) -> torch.dtype | None:
    """The autocast dtype of a resolved ``amp`` name (None for "none"); a dtype or None passes through."""
    if amp is None or isinstance(amp, torch.dtype):
        return amp
    if amp == "auto":
        raise ValueError("resolve 'auto' with resolve_amp(amp, device) first")
    return AMP_DTYPES[amp]


def compute_dtype(device: torch.device | str, dtype: torch.dtype) -> torch.dtype:
    """The dtype the matmuls produce on ``device``: autocast's where it is on, else ``dtype`` (the weights'). Tensors
    that are added to those products (attention masks and biases) are made in it, so no large buffer is promoted."""
    kind = torch.device(device).type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else dtype


@contextlib.contextmanager
def autocast(device: torch.device | str, amp: str | torch.dtype | None) -> Iterator[None]:
    """``torch.autocast`` to ``amp`` (a resolved name, a dtype, or None/"none" for fp32) on ``device``'s type."""
    dtype = amp_dtype(amp)
    with torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype is not None):
        yield


@contextlib.contextmanager
def full_precision(device: torch.device | str) -> Iterator[None]:
    """Autocast off: for the few computations whose result is the small difference of two large numbers (the
    compression losses), which bf16's 8-bit mantissa would turn into noise."""
    with torch.autocast(torch.device(device).type, enabled=False):
        yield


__all__ = ["AMP_DTYPES", "amp_dtype", "autocast", "compute_dtype", "full_precision"]
