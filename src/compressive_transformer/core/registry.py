"""The extension tables: compression functions, compression losses, attention kernels, model kinds and corpus formats
by name, with what the rest of the code needs to know about each.

The tables are data. Each lists its built-in rows here, where it lives: a name, the flags the rest of the code reads,
and where its builder is (``"package.module:attr"``, a :class:`Ref` that imports it when first used). So validating a
config never depends on what was imported before, and importing a module registers nothing. ``register_*`` adds a
user's own row the same way (a callable or a ``"module:attr"`` string) after checking it: a name that is a word, flags
that are booleans, builders that can be called. A built-in row is never replaced (every model in the process would
change without a word); a user's own name registered again replaces that row.

This module sits at the bottom floor (no torch, no package imports), so that :mod:`compressive_transformer.core.config`
can validate ``model.compression``, ``model.kind``, ``model.attn_impl`` and ``data.format`` against it. No other
module compares these names: each reads the flags of the row.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator


class Ref:
    """A callable (or value) named by where it lives, ``"package.module:attr"``, imported when first used.

    Calling a ``Ref`` calls its target, so a row's builder reads the same whether it was given as a function or as
    a place; :meth:`resolve` returns the target itself (a class, a function, a table). Nothing is cached on the
    ``Ref``: the module, once imported, is Python's own cache, and ``torch.compile`` sees the same lookups on every
    call (a cached target would be a guard that fails once the first call has filled it)."""

    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        module, sep, attr = path.partition(":")
        if not sep or not module or not attr:
            raise ValueError(f"{path!r}: name a builder as 'package.module:attr'")
        self.path = path

    def resolve(self) -> Any:
        module, _, attr = self.path.partition(":")
        target = sys.modules.get(module)
        if target is None:
            target = importlib.import_module(module)
        for part in attr.split("."):
            target = getattr(target, part)
        return target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Ref({self.path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ref) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)


class RefMapping(Ref, MutableMapping):
    """A :class:`Ref` to a mapping (a corpus's download sources), read (and written) as that mapping."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        return self.resolve()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.resolve()[key] = value

    def __delitem__(self, key: str) -> None:
        del self.resolve()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.resolve())

    def __len__(self) -> int:
        return len(self.resolve())

    __eq__ = Ref.__eq__
    __hash__ = Ref.__hash__


def ref(target: Any) -> Any:
    """``target`` as a row holds it: a ``"module:attr"`` string becomes a :class:`Ref`; anything else stays."""
    return Ref(target) if isinstance(target, str) else target


def _refs(row: Any, *names: str) -> None:
    """Turn the ``"module:attr"`` strings of a frozen row's fields ``names`` into :class:`Ref`\\ s."""
    for name in names:
        object.__setattr__(row, name, ref(getattr(row, name)))


_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.+-]*")
_BUILT_IN: dict[int, frozenset[str]] = {}  # id(table) -> the names its built-in rows hold


def _built_in(table: dict[str, Any], *also: str) -> dict[str, Any]:
    """Record the rows ``table`` holds now (and the reserved names ``also``) as built-in: never replaced."""
    _BUILT_IN[id(table)] = frozenset(table) | frozenset(also)
    return table


def _check_row(table: dict[str, Any], what: str, name: Any, flags: Mapping[str, Any], calls: Mapping[str, Any]) -> None:
    """What a ``register_*`` call is given, checked before it changes anything: ``name`` is a word (what a config
    file can name) and not a built-in row's, each of ``flags`` a bool, each of ``calls`` a callable, a
    ``"module:attr"`` string or None where the row allows none (the caller passes only those it must have or got)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"register {what}: the name {name!r} is not a word a config can name; give letters, digits, '_', '-' or "
            "'.' starting with a letter"
        )
    if name in _BUILT_IN.get(id(table), ()):
        raise ValueError(
            f"register {what}: {name!r} is built in and is never replaced (every model in the process would change); "
            "register yours under a name of its own"
        )
    for flag, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"register {what} {name!r}: {flag} must be True or False, not {value!r}")
    for field_name, value in calls.items():
        if isinstance(value, str):
            Ref(value)  # a 'package.module:attr' string, else a ValueError saying so
        elif not callable(value):
            raise TypeError(
                f"register {what} {name!r}: {field_name} must be a callable or 'package.module:attr', "
                f"not {type(value).__name__}"
            )


def _entry(table: dict[str, Any], name: str, what: str) -> Any:
    """The row ``name`` of ``table``; a ``KeyError`` that lists the known names otherwise."""
    try:
        return table[name]
    except KeyError:
        raise KeyError(f"unknown {what} {name!r}; use one of {', '.join(table)}") from None


# ---------------------------------------------------------------------------------------------------------------
# compression functions (model.compression.function)


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
    build: Callable[[Any], Any] | str
    trainable: bool
    needs_usage: bool = False
    extra_width: bool = True
    scale_pool: Callable[[Any], Any] | str | None = None

    def __post_init__(self) -> None:
        _refs(self, "build", "scale_pool")


_COMPRESSION = "compressive_transformer.core.compression"
COMPRESSORS: dict[str, CompressorSpec] = {
    spec.name: spec
    for spec in (
        CompressorSpec("max_pool", f"{_COMPRESSION}:build_max_pool", trainable=False, scale_pool=f"{_COMPRESSION}:max_over_group"),
        CompressorSpec("mean_pool", f"{_COMPRESSION}:build_mean_pool", trainable=False, scale_pool=f"{_COMPRESSION}:mean_over_group"),
        CompressorSpec("conv", f"{_COMPRESSION}:build_conv", trainable=True),
        CompressorSpec("dilated_conv", f"{_COMPRESSION}:build_dilated_conv", trainable=True),
        CompressorSpec("most_used", f"{_COMPRESSION}:build_most_used", trainable=False, needs_usage=True, extra_width=False),
    )
}  # fmt: skip
_built_in(COMPRESSORS)


def register_compressor(
    name: str,
    build: Callable[[Any], Any] | str,
    *,
    trainable: bool,
    needs_usage: bool = False,
    extra_width: bool = True,
    scale_pool: Callable[[Any], Any] | str | None = None,
) -> CompressorSpec:
    """Make ``name`` usable as ``model.compression.function``; registering your name again replaces its row, a
    built-in name is refused."""
    flags = {"trainable": trainable, "needs_usage": needs_usage, "extra_width": extra_width}
    calls = {"build": build} | ({"scale_pool": scale_pool} if scale_pool is not None else {})
    _check_row(COMPRESSORS, "compressor", name, flags, calls)
    spec = CompressorSpec(name, build, trainable, needs_usage, extra_width, scale_pool)
    COMPRESSORS[name] = spec
    return spec


def compressor_spec(name: str) -> CompressorSpec:
    """The row of ``name``; a ``KeyError`` that lists the known names otherwise."""
    return _entry(COMPRESSORS, name, "compression")


# ---------------------------------------------------------------------------------------------------------------
# compression losses (model.compression.loss)


@dataclass(frozen=True)
class CompressionLossSpec:
    """One way of training the compressor (``model.compression.loss``).

    ``local``: a loss of its own, ``compute(eviction)`` of one layer's
    :class:`~compressive_transformer.core.compression.EvictionLoss` under stop-gradients (the attention
    reconstruction, the auto-encoding): the compressor trains in every segment that evicts, and the loss is what the
    analyses report as the layer's compressibility. ``bptt``: the compressor trains through the task loss, its
    gradient carried back through the compressed memories (the model keeps the windows they were made from).
    ``decoder``: the model keeps a transposed-convolution decoder per layer (auto-encoding), which ``compute``
    receives. A loss that is none of these trains nothing (``'none'``: for compressors without parameters).
    """

    name: str
    local: bool = False
    bptt: bool = False
    decoder: bool = False
    compute: Callable[[Any], Any] | str | None = None

    def __post_init__(self) -> None:
        _refs(self, "compute")
        if self.local and self.compute is None:
            raise ValueError(f"compression loss {self.name!r}: a local loss needs compute(eviction) -> loss")

    @property
    def trains(self) -> bool:
        return self.local or self.bptt


COMPRESSION_LOSSES: dict[str, CompressionLossSpec] = {
    spec.name: spec
    for spec in (
        CompressionLossSpec("attention", local=True, compute=f"{_COMPRESSION}:reconstruct_attention"),
        CompressionLossSpec("autoencoder", local=True, decoder=True, compute=f"{_COMPRESSION}:reconstruct_states"),
        CompressionLossSpec("bptt", bptt=True),  # the task loss, backpropagated through the compressed memories
        CompressionLossSpec("none"),  # parameter-free compressors
    )
}
_built_in(COMPRESSION_LOSSES)


def register_compression_loss(
    name: str,
    *,
    local: bool = False,
    bptt: bool = False,
    decoder: bool = False,
    compute: Callable[[Any], Any] | str | None = None,
) -> CompressionLossSpec:
    """Make ``name`` usable as ``model.compression.loss``; registering your name again replaces its row, a built-in
    name is refused."""
    flags = {"local": local, "bptt": bptt, "decoder": decoder}
    _check_row(COMPRESSION_LOSSES, "compression loss", name, flags, {"compute": compute} if compute is not None else {})
    spec = CompressionLossSpec(name, local, bptt, decoder, compute)
    COMPRESSION_LOSSES[name] = spec
    return spec


def compression_loss_spec(name: str) -> CompressionLossSpec:
    """The row of ``name``; a ``KeyError`` that lists the known names otherwise."""
    return _entry(COMPRESSION_LOSSES, name, "compression loss")


# ---------------------------------------------------------------------------------------------------------------
# attention kernels (model.attn_impl)


@dataclass(frozen=True)
class KernelSpec:
    """One kernel that computes the relative attention (``model.attn_impl``): ``run(AttentionInputs)`` returns the
    output (B, H, T, dh) and, where it has them, the weights.

    ``dense_mask``: it reads the key mask as one dense additive (T, K) bias, built once per forward.
    ``mask_form``: else a function ``(KeyMask, T, dtype) -> KeyMask`` adding the kernel's own form of the mask
    (FlexAttention's BlockMask), also built once per forward.
    ``weights``: it returns the attention weights. ``dropout``: it applies attention dropout. ``traceable``:
    ``torch.compile`` traces it without a graph break.
    """

    name: str
    run: Callable[..., Any] | str
    dense_mask: bool = False
    weights: bool = False
    dropout: bool = False
    traceable: bool = True
    mask_form: Callable[..., Any] | str | None = None

    def __post_init__(self) -> None:
        _refs(self, "run", "mask_form")

    def prepare(self, mask: Any, T: int, dtype: Any) -> Any:
        """What this kernel reads of the key mask (a ``KeyMask``), made once per forward: with the dense (T, K)
        additive bias for a ``dense_mask`` kernel, with its own form for a ``mask_form`` one, else as it is."""
        if self.dense_mask:
            return mask.with_dense(T, dtype)
        return self.mask_form(mask, T, dtype) if self.mask_form is not None else mask


_KERNELS = "compressive_transformer.core.kernels"
KERNELS: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in (
        KernelSpec("reference", "compressive_transformer.core.attention:relative_attention", weights=True, dropout=True),
        KernelSpec("explicit", f"{_KERNELS}.explicit:explicit_attention", dense_mask=True, weights=True, dropout=True, traceable=False),
        KernelSpec("sdpa-bias", f"{_KERNELS}.torch_kernels:sdpa_bias_attention", dense_mask=True, dropout=True),
        KernelSpec("fused", f"{_KERNELS}:fused_attention"),
        KernelSpec("flex", f"{_KERNELS}.flex:flex_attention", mask_form=f"{_KERNELS}.flex:prepare"),
    )
}  # fmt: skip
AUTO_KERNEL = "auto"  # model.attn_impl's default: core.kernels.auto_choice picks per device, dtype and compile
KERNEL_ALIASES = {"math": "explicit", "sdpa": "sdpa-bias"}  # names configs and checkpoints used before
_built_in(KERNELS, AUTO_KERNEL, *KERNEL_ALIASES)  # "auto" and an alias never reach a registered row


def register_kernel(
    name: str,
    run: Callable[..., Any] | str,
    *,
    dense_mask: bool = False,
    weights: bool = False,
    dropout: bool = False,
    traceable: bool = True,
    mask_form: Callable[..., Any] | str | None = None,
) -> KernelSpec:
    """Make ``name`` usable as ``model.attn_impl``; registering your name again replaces its row, a built-in name
    (or ``auto``, or an earlier name of one) is refused."""
    flags = {"dense_mask": dense_mask, "weights": weights, "dropout": dropout, "traceable": traceable}
    _check_row(KERNELS, "kernel", name, flags, {"run": run})
    spec = KernelSpec(name, run, dense_mask, weights, dropout, traceable, mask_form)
    KERNELS[name] = spec
    return spec


def kernel_names() -> tuple[str, ...]:
    """Every name ``model.attn_impl`` accepts: ``auto``, the kernels, and their earlier names."""
    return (AUTO_KERNEL, *KERNELS, *KERNEL_ALIASES)


def canonical_kernel(impl: str) -> str:
    """The kernel a configured ``attn_impl`` names (``auto`` stays ``auto``; an earlier name maps to its kernel)."""
    return KERNEL_ALIASES.get(impl, impl)


# ---------------------------------------------------------------------------------------------------------------
# model kinds (model.kind)


@dataclass(frozen=True)
class ModelKind:
    """One kind of model (``model.kind``): ``build(cfg)`` makes it, and the kind answers for its configs what would
    otherwise be asked of a config's shape ("is this Transformer-QL?").

    ``section``: the [model.<section>] table of its own (``ql``, ``wavenet``; None: none), given only with this kind.
    ``check(cfg)``: its own config rules, run by ``ModelConfig`` after the common ones (raises ``ConfigError``).
    ``label(cfg)``: the model's name in tables. ``context_length(cfg)``: its context lengths (Transformer-QL paper,
    Appendix B). ``temporal_range(cfg)``: its temporal range and attention cost, where the kind has that formula.
    ``fixed_memory``: why its memory lengths cannot change at evaluation ("" when they can). ``decoder(model,
    memory, compile=...)``: its token-by-token decoder for generation (None: generation steps ``model.forward``).
    """

    name: str
    build: Callable[[Any], Any] | str
    section: str | None = None
    check: Callable[[Any], None] | str | None = None
    label: Callable[[Any], str] | str | None = None
    context_length: Callable[[Any], Any] | str | None = None
    temporal_range: Callable[[Any], Any] | str | None = None
    fixed_memory: str = ""
    decoder: Callable[..., Any] | str | None = None

    def __post_init__(self) -> None:
        _refs(self, "build", "check", "label", "context_length", "temporal_range", "decoder")
        if self.label is None:
            object.__setattr__(self, "label", lambda cfg, name=self.name: name)


_MODELS = "compressive_transformer.core.models"
_CONTEXT = "compressive_transformer.core.context"
DEFAULT_KIND = "compressive"
MODEL_KINDS: dict[str, ModelKind] = {
    kind.name: kind
    for kind in (
        ModelKind(
            "compressive",  # the Compressive Transformer; Transformer-XL with memory.cmem_len = 0
            f"{_MODELS}.lm:CompressiveTransformerLM",
            label=f"{_MODELS}.lm:label",
            context_length=f"{_CONTEXT}:context_length_from_config",
            temporal_range=f"{_CONTEXT}:temporal_range",
            decoder=f"{_MODELS}.decode:Decoder",
        ),
        ModelKind(
            "transformer-ql",
            f"{_MODELS}.ql:TransformerQL",
            section="ql",
            check=f"{_MODELS}.ql:check_config",
            label=f"{_MODELS}.ql:label",
            context_length=f"{_CONTEXT}:context_length_from_config",
            fixed_memory="Transformer-QL's memories are fixed by its scales",
        ),
        ModelKind(
            "wavenet",
            f"{_MODELS}.wavenet:WaveNet",
            section="wavenet",
            check=f"{_MODELS}.wavenet:check_config",
            label=f"{_MODELS}.wavenet:label",
            fixed_memory="WaveNet's memory is its receptive field (1 + the sum of its dilations)",
        ),
    )
}
_built_in(MODEL_KINDS)


def register_model_kind(kind: ModelKind) -> ModelKind:
    """Make ``kind.name`` usable as ``model.kind``; registering your name again replaces its row, a built-in name
    is refused."""
    if not isinstance(kind, ModelKind):
        raise TypeError(f"register_model_kind: give a ModelKind, not {type(kind).__name__}")
    calls = {"build": kind.build} | {
        f: getattr(kind, f)
        for f in ("check", "label", "context_length", "temporal_range", "decoder")
        if getattr(kind, f) is not None
    }
    _check_row(MODEL_KINDS, "model kind", kind.name, {}, calls)
    if not isinstance(kind.fixed_memory, str):
        raise TypeError(
            f"register model kind {kind.name!r}: fixed_memory must be a str (why, or ''), not {kind.fixed_memory!r}"
        )
    MODEL_KINDS[kind.name] = kind
    return kind


def model_kind(cfg: Any) -> ModelKind:
    """The kind ``cfg.kind`` names; a ``ValueError`` naming the registered kinds otherwise."""
    try:
        return MODEL_KINDS[cfg.kind]
    except KeyError:
        raise ValueError(f"model.kind: unknown {cfg.kind!r}; registered: {', '.join(MODEL_KINDS)}") from None


def find_model_kind(cfg: Any) -> ModelKind | None:
    """The row ``cfg.kind`` names, or None where no kind of that name is registered."""
    return MODEL_KINDS.get(getattr(cfg, "kind", DEFAULT_KIND))


def kind_of_section(section: str) -> str | None:
    """The kind whose own section is [model.<section>], or None."""
    return next((kind.name for kind in MODEL_KINDS.values() if kind.section == section), None)


# ---------------------------------------------------------------------------------------------------------------
# corpus formats (data.format)


@dataclass(frozen=True)
class CorpusFormat:
    """One corpus format (``data.format``).

    ``files(cfg, split)`` lists the files a split is read from without reading them (the token cache fingerprints
    them); ``read(cfg, split)`` returns its :class:`~compressive_transformer.data.readers.RawSplit`; ``stream(cfg,
    split)``, where given, its :class:`~compressive_transformer.data.documents.SplitStream` (documents read piece by
    piece, in bounded memory: what the token cache builds from; without it the cache encodes what ``read``
    returns). ``sources``:
    download name -> :class:`~compressive_transformer.data.download.Source` (what ``data download NAME`` fetches),
    or where that mapping lives. ``needs_path``: ``data.path`` must be set. ``tokenizers``: the tokenizers that can
    read it (empty: any), with ``tokenizer_reason`` saying why. ``train_file``: it accepts ``data.train_file``
    (another file as train split). ``settings``: further ``data`` keys its reading depends on (part of the token
    cache's key), e.g. the sample rate. ``token_unit``: what one token is when it is not text (``"sample"`` for
    audio: metrics per sample).
    """

    name: str
    files: Callable[[Any, str], list[Any]] | str
    read: Callable[[Any, str], Any] | str
    sources: Mapping[str, Any] | str = field(default_factory=dict)
    needs_path: bool = True
    tokenizers: tuple[str, ...] = ()
    tokenizer_reason: str = ""
    train_file: bool = False
    settings: tuple[str, ...] = ()
    token_unit: str = ""
    stream: Callable[[Any, str], Any] | str | None = None

    def __post_init__(self) -> None:
        _refs(self, "files", "read")
        if self.stream is not None:
            _refs(self, "stream")
        if isinstance(self.sources, str):
            object.__setattr__(self, "sources", RefMapping(self.sources))


def _corpus(module: str, *, sources: bool = False) -> dict[str, Any]:
    """The places of a built-in corpus module's ``files``, ``read``, ``stream`` (and ``SOURCES``)."""
    where = f"compressive_transformer.data.corpora.{module}"
    places = {"files": f"{where}:files", "read": f"{where}:read", "stream": f"{where}:stream"}
    return places | ({"sources": f"{where}:SOURCES"} if sources else {})


FORMATS: dict[str, CorpusFormat] = {
    fmt.name: fmt
    for fmt in (  # in the order data.format lists them
        CorpusFormat("pydoc", **_corpus("pydoc"), needs_path=False),
        CorpusFormat("text", **_corpus("text")),
        CorpusFormat(
            "enwik8",
            **_corpus("enwik8", sources=True),
            tokenizers=("bytes",),
            tokenizer_reason="enwik8 is modelled byte by byte (it is not all valid UTF-8)",
        ),
        CorpusFormat("wikitext", **_corpus("wikitext", sources=True), train_file=True),
        CorpusFormat("pg19", **_corpus("pg19", sources=True)),
        CorpusFormat("python-source", **_corpus("python_source"), needs_path=False),
        CorpusFormat(
            "audio",
            **_corpus("audio", sources=True),
            tokenizers=("bytes",),
            tokenizer_reason="audio is modelled one 8-bit μ-law sample per token (byte ids 0..255)",
            settings=("sample_rate",),
            token_unit="sample",
        ),
    )
}
_built_in(FORMATS)


def register_format(fmt: CorpusFormat) -> CorpusFormat:
    """Make ``fmt.name`` usable as ``data.format`` and its sources downloadable; your name registered again is
    replaced, a built-in name is refused."""
    if not isinstance(fmt, CorpusFormat):
        raise TypeError(f"register_format: give a CorpusFormat, not {type(fmt).__name__}")
    flags = {"needs_path": fmt.needs_path, "train_file": fmt.train_file}
    calls = {"files": fmt.files, "read": fmt.read} | ({"stream": fmt.stream} if fmt.stream is not None else {})
    _check_row(FORMATS, "format", fmt.name, flags, calls)
    FORMATS[fmt.name] = fmt
    return fmt


def corpus_format(name: str) -> CorpusFormat:
    """The row of ``name``; a ``KeyError`` that lists the known formats otherwise."""
    return _entry(FORMATS, name, "format")


__all__ = [
    "AUTO_KERNEL",
    "COMPRESSION_LOSSES",
    "COMPRESSORS",
    "DEFAULT_KIND",
    "FORMATS",
    "KERNELS",
    "KERNEL_ALIASES",
    "MODEL_KINDS",
    "CompressionLossSpec",
    "CompressorSpec",
    "CorpusFormat",
    "KernelSpec",
    "ModelKind",
    "Ref",
    "RefMapping",
    "canonical_kernel",
    "compression_loss_spec",
    "compressor_spec",
    "corpus_format",
    "find_model_kind",
    "kernel_names",
    "kind_of_section",
    "model_kind",
    "ref",
    "register_compression_loss",
    "register_compressor",
    "register_format",
    "register_kernel",
    "register_model_kind",
]
