"""The table of compression functions by name: what config validation, the memory and the models know about each.

It sits at the bottom floor (no torch, no package imports) so that :mod:`compressive_transformer.config` can validate
``model.compression`` against it; :mod:`compressive_transformer.compression` registers the built-in compressors,
and a user's module can register more with :func:`register_compressor`. No other module compares compressor names:
each reads the flags of the entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class CompressorSpec:
    """One compression function f_c.

    ``build`` makes the module from a ``ModelConfig`` (windows (B, G, h + c + e, d) -> slots (B, G, d)).
    ``trainable``: it has parameters, trained by a compression loss ('attention', 'autoencoder' or 'bptt'); a
    parameter-free one needs ``compression_loss = 'none'``. ``needs_usage``: it reads the attention each memory slot
    received (the memory tracks it, attention must return weights, and the cached decoder cannot run it).
    ``extra_width``: it accepts overlapping windows (``compression_extra_width > 0``). ``scale_pool``: a reduction
    of (B, G, c, d) groups to (B, G, d) that Transformer-QL may use between scales (pooling compressors only).
    """

    name: str
    build: Callable[[Any], Any]
    trainable: bool
    needs_usage: bool = False
    extra_width: bool = True
    scale_pool: Callable[[Any], Any] | None = None


COMPRESSORS: dict[str, CompressorSpec] = {}


def register_compressor(
    name: str,
    build: Callable[[Any], Any],
    *,
    trainable: bool,
    needs_usage: bool = False,
    extra_width: bool = True,
    scale_pool: Callable[[Any], Any] | None = None,
) -> CompressorSpec:
    """Make ``name`` usable as ``model.compression``; registering a name again replaces its entry."""
    spec = CompressorSpec(name, build, trainable, needs_usage, extra_width, scale_pool)
    COMPRESSORS[name] = spec
    return spec


def compressor_spec(name: str) -> CompressorSpec:
    """The entry of ``name``; a ``KeyError`` that lists the known names otherwise."""
    try:
        return COMPRESSORS[name]
    except KeyError:
        raise KeyError(f"unknown compression {name!r}; use one of {', '.join(COMPRESSORS)}") from None


__all__ = ["COMPRESSORS", "CompressorSpec", "compressor_spec", "register_compressor"]
