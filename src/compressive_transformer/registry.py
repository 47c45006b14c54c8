"""The extension tables: compression functions and corpus formats by name, with what the rest of the code needs to
know about each.

They sit at the bottom floor (no torch, no package imports) so that :mod:`compressive_transformer.config` can
validate ``model.compression`` and ``data.format`` against them. :mod:`compressive_transformer.compression`
registers the built-in compressors and :mod:`compressive_transformer.data.readers` the built-in corpora; a user's
module registers more with :func:`register_compressor` or :func:`compressive_transformer.data.formats.register_format`.
No other module compares compressor or format names: each reads the flags of the entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class CorpusFormat:
    """One corpus format (``data.format``).

    ``files(cfg, split)`` lists the files a split is read from without reading them (the token cache fingerprints
    them); ``read(cfg, split)`` returns its :class:`~compressive_transformer.data.readers.RawSplit`. ``sources``:
    download name -> :class:`~compressive_transformer.data.download.Source` (what ``data download NAME`` fetches).
    ``needs_path``: ``data.path`` must be set. ``tokenizers``: the tokenizers that can read it (empty: any), with
    ``tokenizer_reason`` saying why. ``train_file``: it accepts ``data.train_file`` (another file as train split).
    ``settings``: further ``data`` keys its reading depends on (part of the token cache's key), e.g. the sample
    rate. ``token_unit``: what one token is when it is not text (``"sample"`` for audio: metrics per sample).
    """

    name: str
    files: Callable[[Any, str], list[Any]]
    read: Callable[[Any, str], Any]
    sources: dict[str, Any] = field(default_factory=dict)
    needs_path: bool = True
    tokenizers: tuple[str, ...] = ()
    tokenizer_reason: str = ""
    train_file: bool = False
    settings: tuple[str, ...] = ()
    token_unit: str = ""


FORMATS: dict[str, CorpusFormat] = {}


def corpus_format(name: str) -> CorpusFormat:
    """The entry of ``name``; a ``KeyError`` that lists the known formats otherwise."""
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown format {name!r}; use one of {', '.join(FORMATS)}") from None


__all__ = [
    "COMPRESSORS",
    "FORMATS",
    "CompressorSpec",
    "CorpusFormat",
    "compressor_spec",
    "corpus_format",
    "register_compressor",
]
