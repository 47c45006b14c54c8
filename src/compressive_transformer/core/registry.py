"""The extension tables: compression functions, compression losses, model kinds and corpus formats by name, with what the rest of the code needs to
know about each.

They sit at the bottom floor (no torch, no package imports) so that :mod:`compressive_transformer.core.config` can
validate ``model.compression`` and ``data.format`` against them. :mod:`compressive_transformer.core.compression`
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
class CompressionLossSpec:
    """One way of training the compressor (``model.compression_loss``).

    ``local``: a loss of its own, computed per layer from every eviction under stop-gradients (the attention
    reconstruction, the auto-encoding): the compressor trains in every segment that evicts, and the loss is what the
    analyses report as the layer's compressibility. ``bptt``: the compressor trains through the task loss, its
    gradient carried back through the compressed memories (the model keeps the windows they were made from).
    ``decoder``: the model keeps a transposed-convolution decoder per layer (auto-encoding). A loss that is none of
    these trains nothing (``'none'``: for compressors without parameters).
    """

    name: str
    local: bool = False
    bptt: bool = False
    decoder: bool = False

    @property
    def trains(self) -> bool:
        return self.local or self.bptt


COMPRESSION_LOSSES: dict[str, CompressionLossSpec] = {}


def register_compression_loss(
    name: str, *, local: bool = False, bptt: bool = False, decoder: bool = False
) -> CompressionLossSpec:
    """Make ``name`` usable as ``model.compression_loss``; registering a name again replaces its entry."""
    spec = CompressionLossSpec(name, local, bptt, decoder)
    COMPRESSION_LOSSES[name] = spec
    return spec


def compression_loss_spec(name: str) -> CompressionLossSpec:
    """The entry of ``name``; a ``KeyError`` that lists the known names otherwise."""
    try:
        return COMPRESSION_LOSSES[name]
    except KeyError:
        raise KeyError(f"unknown compression_loss {name!r}; use one of {', '.join(COMPRESSION_LOSSES)}") from None


@dataclass(frozen=True)
class ModelKind:
    """One kind of model: ``build`` makes the model of every config that ``applies`` to it, and the kind answers
    for its configs what would otherwise be asked of a config's shape ("is this Transformer-QL?").

    ``check(cfg)``: the kind's own config rules, run by ``ModelConfig`` after the common ones (raises ``ConfigError``).
    ``label(cfg)``: the model's name in tables. ``context_length(cfg)``: its context lengths (Transformer-QL paper,
    Appendix B). ``temporal_range(cfg)``: its temporal range and attention cost, where the kind has that formula.
    ``fixed_memory``: why its memory lengths cannot change at evaluation ("" when they can). ``decoder(model, memory,
    compile=...)``: its token-by-token decoder for generation (None: generation steps ``model.forward``).
    """

    name: str
    build: Callable[[Any], Any]
    applies: Callable[[Any], bool]
    check: Callable[[Any], None] | None = None
    label: Callable[[Any], str] = lambda cfg: "model"
    context_length: Callable[[Any], Any] | None = None
    temporal_range: Callable[[Any], Any] | None = None
    fixed_memory: str = ""
    decoder: Callable[..., Any] | None = None


MODEL_KINDS: dict[str, ModelKind] = {}


def find_model_kind(cfg: Any) -> ModelKind | None:
    """The kind that builds ``cfg``: the newest registered one that applies (None while none does)."""
    for kind in reversed(MODEL_KINDS.values()):
        if kind.applies(cfg):
            return kind
    return None


def model_kind(cfg: Any) -> ModelKind:
    """:func:`find_model_kind`, or a ``ValueError`` naming the registered kinds."""
    kind = find_model_kind(cfg)
    if kind is None:
        raise ValueError(f"no model kind applies to this configuration; registered: {', '.join(MODEL_KINDS)}")
    return kind


@dataclass(frozen=True)
class CorpusFormat:
    """One corpus format (``data.format``).

    ``files(cfg, split)`` lists the files a split is read from without reading them (the token cache fingerprints
    them); ``read(cfg, split)`` returns its :class:`~compressive_transformer.data.readers.RawSplit`. ``sources``:
    download name -> :class:`~compressive_transformer.data.download.Source` (what ``data download NAME`` fetches).
    ``needs_path``: ``data.path`` must be set. ``tokenizers``: the tokenizers that can read it (empty: any), with
    ``tokenizer_reason`` saying why. ``train_file``: it accepts ``data.train_file`` (another file as train split).
    """

    name: str
    files: Callable[[Any, str], list[Any]]
    read: Callable[[Any, str], Any]
    sources: dict[str, Any] = field(default_factory=dict)
    needs_path: bool = True
    tokenizers: tuple[str, ...] = ()
    tokenizer_reason: str = ""
    train_file: bool = False


FORMATS: dict[str, CorpusFormat] = {}


def corpus_format(name: str) -> CorpusFormat:
    """The entry of ``name``; a ``KeyError`` that lists the known formats otherwise."""
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown format {name!r}; use one of {', '.join(FORMATS)}") from None


__all__ = [
    "COMPRESSION_LOSSES",
    "COMPRESSORS",
    "MODEL_KINDS",
    "ModelKind",
    "find_model_kind",
    "model_kind",
    "CompressionLossSpec",
    "compression_loss_spec",
    "register_compression_loss",
    "FORMATS",
    "CompressorSpec",
    "CorpusFormat",
    "compressor_spec",
    "corpus_format",
    "register_compressor",
]
