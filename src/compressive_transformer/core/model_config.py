"""The model's configuration: :class:`ModelConfig` and its sections, one per component ([model.memory],
[model.compression], [model.positions], a kind's own [model.ql] / [model.wavenet], [model.adaptive]), and the reading
of the flat [model] keys of the earlier layout into them (:func:`upgrade_model_table`, :func:`model_override_path`).
Every section validates itself; a user mistake raises :class:`ConfigError` in one line naming the key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from compressive_transformer.core.config_base import ConfigError, check_types, from_dict, require
from compressive_transformer.core.registry import (
    COMPRESSION_LOSSES,
    COMPRESSORS,
    DEFAULT_KIND,
    KERNELS,
    MODEL_KINDS,
    canonical_kernel,
    kernel_names,
    kind_of_section,
)

NORMS = ("pre", "post")
CMEM_POSITIONS = ("separate", "shared")
SHARE_POSITIONS = ("none", "biases", "all")  # what the layers' attention shares: nothing, u/v, u/v and W_r
MEMORY_INITS = ("empty", "zeros")  # the first segment's memory: no slots, or mem_len zero-input slots


@dataclass(frozen=True)
class AdaptiveConfig:
    """Adaptive input embedding and adaptive softmax (Baevski & Auli 2019; Transformer-XL's word-level models).

    The vocabulary is cut at ``cutoffs`` into a head (the most frequent ids, below the first cutoff) and tail
    clusters; cluster i embeds in ``d_embed // div_val ** i`` dimensions, projected to ``d_model``. ``tie_projs``
    lists per cluster (head first) whether the softmax reuses the embedding's projection (Transformer-XL's
    ``tie_projs``); ``model.tie_embeddings`` ties the clusters' word vectors. Ids must be sorted by frequency.
    """

    cutoffs: tuple[int, ...] = ()
    div_val: int = 1
    d_embed: int = 0  # 0: d_model
    tie_projs: tuple[bool, ...] = ()  # () ties none

    def __post_init__(self) -> None:
        check_types(self, "model.adaptive")
        p = "model.adaptive."
        c = self.cutoffs
        require(
            all(a < b for a, b in zip((0,) + c, c)),
            p + "cutoffs",
            f"must be positive and strictly increasing, got {list(c)}",
        )
        require(self.div_val >= 1, p + "div_val", "must be >= 1")
        require(self.d_embed >= 0, p + "d_embed", "must be >= 0 (0 means d_model)")
        require(
            not self.tie_projs or len(self.tie_projs) == len(c) + 1,
            p + "tie_projs",
            f"give one flag per cluster, head first ({len(c) + 1} for {len(c)} cutoffs), or [] for none",
        )

    def cluster_dims(self, d_model: int) -> tuple[int, ...]:
        """Embedding width of each cluster, head first."""
        d = self.d_embed or d_model
        return tuple(d // self.div_val**i for i in range(len(self.cutoffs) + 1))

    def has_proj(self, d_model: int) -> bool:
        """Whether the clusters' vectors are projected to d_model (always with div_val > 1)."""
        return self.div_val > 1 or (self.d_embed or d_model) != d_model


@dataclass(frozen=True)
class MemoryConfig:
    """What each layer remembers between segments (Algorithm 1): n_m memory slots and n_cm compressed slots. No
    parameter depends on them, so an evaluation may set other lengths (``eval.mem_len``, ``eval.cmem_len``)."""

    mem_len: int = 128  # n_m; 0 with cmem_len = 0: a plain causal transformer
    cmem_len: int = 128  # n_cm; 0: Transformer-XL
    init: str = (
        "empty"  # the first segment's memory: no slots, or "zeros": mem_len valid zero-input slots (an importer's)
    )

    def __post_init__(self) -> None:
        check_types(self, "model.memory")
        p = "model.memory."
        require(self.mem_len >= 0, p + "mem_len", "must be >= 0")
        require(self.cmem_len >= 0, p + "cmem_len", "must be >= 0")
        require(self.init in MEMORY_INITS, p + "init", f"use one of {', '.join(MEMORY_INITS)}")


@dataclass(frozen=True)
class CompressionConfig:
    """The compressed memory's compression: f_c of Algorithm 1 (``function``, at ``rate`` c) and how it is trained
    (``loss``); the compressors receive only this section and ``d_model``."""

    rate: int = 4  # c: memories per compressed slot
    function: str = "conv"  # a name in core.registry.COMPRESSORS
    loss: str = "attention"  # a name in core.registry.COMPRESSION_LOSSES
    extra_width: int = 0  # extra kernel width for overlapping windows (reads newer neighbours)
    dilations: tuple[int, ...] = (1, 2, 4)  # dilated_conv: kernel-2 dilated convolutions before the strided one
    bptt_horizon: int = 2  # loss "bptt": segments during which a compressed slot still trains the compressor

    def __post_init__(self) -> None:
        check_types(self, "model.compression")
        p = "model.compression."
        require(self.rate >= 1, p + "rate", "must be >= 1")
        require(
            self.function in COMPRESSORS,
            p + "function",
            f"unknown {self.function!r}; use one of {', '.join(COMPRESSORS)}",
        )
        require(
            self.loss in COMPRESSION_LOSSES,
            p + "loss",
            f"unknown {self.loss!r}; use one of {', '.join(COMPRESSION_LOSSES)}",
        )
        require(self.extra_width >= 0, p + "extra_width", "must be >= 0")
        require(
            all(isinstance(d, int) and d >= 1 for d in self.dilations) and len(self.dilations) > 0,
            p + "dilations",
            "must be a non-empty list of integers >= 1",
        )
        require(self.bptt_horizon >= 1, p + "bptt_horizon", "must be >= 1")


@dataclass(frozen=True)
class PositionsConfig:
    """Relative positions (Transformer-XL's R, u, v): what the layers share, where the compressed memory sits on the
    distance axis, and which distances a query sees."""

    cmem: str = "separate"  # compressed memory's own positional stream, or one "shared" stream behind the memory
    share: str = "none"  # one u/v ("biases", Transformer-XL's default) or also one W_r ("all") for all layers
    clamp_len: int = 0  # 0: no clamping of relative distances
    same_length: bool = False  # every query sees the same number of (uncompressed) positions
    same_length_self: bool = False  # same_length: the window of mem_len keys counts the query itself (an importer's)

    def __post_init__(self) -> None:
        check_types(self, "model.positions")
        p = "model.positions."
        require(self.cmem in CMEM_POSITIONS, p + "cmem", f"use one of {', '.join(CMEM_POSITIONS)}")
        require(self.share in SHARE_POSITIONS, p + "share", f"use one of {', '.join(SHARE_POSITIONS)}")
        require(self.clamp_len >= 0, p + "clamp_len", "must be >= 0 (0 means no clamping)")


@dataclass(frozen=True)
class QLConfig:
    """Transformer-QL's own section (``model.kind = "transformer-ql"``): Transformer-XL layers per temporal scale, finest first, the
    layers after the accumulation layer, and the probability of dropping the finer scales from the accumulation."""

    scales: tuple[int, ...] = ()  # required: e.g. (2, 2)
    output_layers: int = 0
    droppath: float = 0.0

    def __post_init__(self) -> None:
        check_types(self, "model.ql")


@dataclass(frozen=True)
class WaveNetConfig:
    """WaveNet's own section (``model.kind = "wavenet"``): one dilation per layer, ``d_model`` residual and ``d_ff`` skip
    channels."""

    dilations: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

    def __post_init__(self) -> None:
        check_types(self, "model.wavenet")


# Keys of the flat [model] table before it had sections: each still reads, into its place in a section.
MOVED_MODEL_KEYS: dict[str, tuple[str, str]] = {
    "mem_len": ("memory", "mem_len"),
    "cmem_len": ("memory", "cmem_len"),
    "memory_init": ("memory", "init"),
    "compression_rate": ("compression", "rate"),
    "compression_loss": ("compression", "loss"),
    "compression_extra_width": ("compression", "extra_width"),
    "dilations": ("compression", "dilations"),
    "bptt_horizon": ("compression", "bptt_horizon"),
    "cmem_positions": ("positions", "cmem"),
    "share_positions": ("positions", "share"),
    "clamp_len": ("positions", "clamp_len"),
    "same_length": ("positions", "same_length"),
    "same_length_self": ("positions", "same_length_self"),
    "scales": ("ql", "scales"),
    "output_layers": ("ql", "output_layers"),
    "droppath": ("ql", "droppath"),
    "wavenet_dilations": ("wavenet", "dilations"),
}


def _moved(key: str, value: Any) -> tuple[str, str] | None:
    """Where a flat [model] key now lives, or None for a key of [model] itself. ``compression`` is both a section
    and, given a string, the old name of ``compression.function``."""
    if key == "compression" and isinstance(value, str):
        return ("compression", "function")
    return MOVED_MODEL_KEYS.get(key)


def upgrade_model_table(table: Mapping[str, Any], section: str = "model") -> dict[str, Any]:
    """The [model] table with every flat key of the earlier layout moved into its section (a run's saved config, a
    TOML file or a study spec written before the sections read unchanged). A key given both ways is an error."""
    if not isinstance(table, Mapping):
        return table  # from_dict names the mistake
    moves = {key: place for key, value in table.items() if (place := _moved(key, value)) is not None}
    out: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in table.items() if k not in moves}
    for key, (sub, name) in moves.items():
        node = out.setdefault(sub, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{section}.{sub}: expected a table of keys, got {node!r}")
        require(
            name not in node or node[name] == table[key],
            f"{section}.{key}",
            f"is the old name of {section}.{sub}.{name}, which is also set; keep only {section}.{sub}.{name}",
        )
        node[name] = table[key]
    # The flat layout said "not this kind" with an empty list (and the kind's other keys at their defaults).
    for sub, kind, selects in (("ql", QLConfig, "scales"), ("wavenet", WaveNetConfig, "dilations")):
        defaults = {f.name: f.default for f in dataclasses.fields(kind)} | {selects: ()}
        given = out.get(sub)
        if (
            sub not in table
            and given
            and all(tuple(v) == () if k == selects else v == defaults.get(k) for k, v in given.items())
        ):
            del out[sub]
    return out


def with_kind(table: Any) -> Any:
    """A whole [model] table with ``kind`` named. A table written before ``model.kind`` (a saved run, a checkpoint,
    a config file, with any overrides laid over it) is read once into the kind whose own section it holds, else the
    Compressive Transformer; from then on the kind is written with the config and never guessed again."""
    if not isinstance(table, Mapping) or "kind" in table:
        return table
    given = [sub for sub in ("ql", "wavenet") if table.get(sub) is not None]
    return {**table, "kind": kind_of_section(given[0]) if len(given) == 1 else DEFAULT_KIND}


def model_override_path(parts: list[str], value: Any) -> list[str]:
    """A dotted override's path with a flat [model] key of the earlier layout moved into its section
    (``model.compression_rate=2`` sets ``model.compression.rate``)."""
    if len(parts) == 2 and parts[0] == "model" and (place := _moved(parts[1], value)) is not None:
        return ["model", *place]
    return parts


@dataclass(frozen=True)
class ModelConfig:
    """Shape and behaviour of one model of the family.

    ``kind`` names the model (a row of :data:`~compressive_transformer.core.registry.MODEL_KINDS`): the Compressive
    Transformer by default, which is Transformer-XL with ``memory.cmem_len=0`` and a plain causal transformer with
    ``mem_len=cmem_len=0``; ``transformer-ql`` and ``wavenet`` read their own section ([model.ql], [model.wavenet]).
    No parameter depends on ``seg_len`` or the memory lengths, so memories may be longer at evaluation than in
    training.
    """

    kind: str = DEFAULT_KIND
    vocab_size: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    d_head: int = 0  # 0: d_model // n_heads
    d_ff: int = 1024
    seg_len: int = 128
    memory: MemoryConfig = dataclasses.field(default_factory=MemoryConfig)
    compression: CompressionConfig = dataclasses.field(default_factory=CompressionConfig)
    positions: PositionsConfig = dataclasses.field(default_factory=PositionsConfig)
    norm: str = "post"  # Algorithm 1 is post-LN; "pre" stores the layer-normed inputs, as the authors' code
    gating: bool = False  # GTrXL gated residuals (requires norm="pre")
    gate_bias: float = 2.0
    tie_embeddings: bool = False
    dropout: float = 0.1
    attn_dropout: float = 0.0
    input_dim: int = 0  # > 0: continuous inputs through a linear projection instead of a token embedding
    attn_impl: str = "auto"  # reference, explicit (both return weights), sdpa-bias, fused; auto: kernels.auto_choice
    ql: QLConfig | None = None  # Transformer-QL's section ([model.ql]), with kind = "transformer-ql" only
    wavenet: WaveNetConfig | None = None  # WaveNet's section ([model.wavenet]), with kind = "wavenet" only
    init_std: float = 0.02
    layer_norm_eps: float = 1e-5
    adaptive: AdaptiveConfig | None = None  # adaptive input and softmax ([model.adaptive]); None: full softmax
    # Transformer-XL reference behaviour an importer sets (docs/fidelity.md; also memory.init, positions.same_length_self):
    final_norm: bool = True  # norm = "pre": layer-norm the last block's output (Transformer-XL's code does not)

    @classmethod
    def from_raw(cls, table: Mapping[str, Any], section: str = "model") -> "ModelConfig":
        """Build from a whole [model] table, the earlier flat keys included (:func:`upgrade_model_table`), with its
        kind named (:func:`with_kind`)."""
        return from_dict(cls, with_kind(upgrade_model_table(table, section)), section)

    def __post_init__(self) -> None:
        check_types(self, "model")
        p = "model."
        self._check_kind(p)
        self._check_sizes(p)
        self._check_layers(p)
        self._check_adaptive_and_reference(p)
        kind = MODEL_KINDS[self.kind]
        if kind.check is not None:
            kind.check(self)  # the model kind's own rules (Transformer-QL's scales, ...)
        if self.uses_compression:
            self._check_compressor(p)

    def _check_kind(self, p: str) -> None:
        """The kind is registered, and a kind's own section comes with that kind only (filled with its defaults when
        the kind is named without it)."""
        require(self.kind in MODEL_KINDS, p + "kind", f"unknown {self.kind!r}; use one of {', '.join(MODEL_KINDS)}")
        for section, default in (("ql", QLConfig), ("wavenet", WaveNetConfig)):
            owner = kind_of_section(section)
            if getattr(self, section) is not None:
                require(
                    self.kind == owner,
                    p + section,
                    f"is {owner}'s own section, but model.kind = {self.kind!r}; set model.kind = {owner!r} or remove [{p}{section}]",
                )
            elif self.kind == owner:
                object.__setattr__(self, section, default())

    def _check_sizes(self, p: str) -> None:
        """Vocabulary, widths and lengths."""
        require(self.vocab_size >= 0, p + "vocab_size", "must be >= 0")
        require(self.input_dim >= 0, p + "input_dim", "must be >= 0 (0 means token inputs)")
        require(
            self.vocab_size > 0 or self.input_dim > 0,
            p + "vocab_size",
            "set vocab_size > 0 for token inputs, or input_dim > 0 for continuous inputs",
        )
        require(self.d_model > 0, p + "d_model", "must be > 0")
        require(self.n_layers > 0, p + "n_layers", "must be > 0")
        require(self.n_heads > 0, p + "n_heads", "must be > 0")
        require(self.d_head >= 0, p + "d_head", "must be >= 0 (0 means d_model // n_heads)")
        require(
            self.d_head > 0 or self.d_model % self.n_heads == 0,
            p + "n_heads",
            f"n_heads={self.n_heads} does not divide d_model={self.d_model}; change one or set d_head",
        )
        require(self.d_ff > 0, p + "d_ff", "must be > 0")
        require(self.seg_len > 0, p + "seg_len", "must be > 0")

    def _check_layers(self, p: str) -> None:
        """Positions, normalisation, dropout and the attention backend."""
        require(self.norm in NORMS, p + "norm", f"unknown {self.norm!r}; use 'pre' or 'post'")
        require(not self.gating or self.norm == "pre", p + "gating", "GTrXL gating needs norm = 'pre'")
        require(0.0 <= self.dropout < 1.0, p + "dropout", "must be in [0, 1)")
        require(0.0 <= self.attn_dropout < 1.0, p + "attn_dropout", "must be in [0, 1)")
        require(
            self.attn_impl in kernel_names(),
            p + "attn_impl",
            f"unknown {self.attn_impl!r}; use one of {', '.join(kernel_names())}",
        )
        require(
            not (self.tie_embeddings and (self.input_dim > 0 or self.vocab_size == 0)),
            p + "tie_embeddings",
            "needs token inputs (input_dim = 0) and vocab_size > 0",
        )

    def _check_adaptive_and_reference(self, p: str) -> None:
        """The adaptive input/softmax and the Transformer-XL reference options an importer sets."""
        if self.adaptive is not None:
            require(
                self.input_dim == 0 and self.vocab_size > 0,
                p + "adaptive",
                "needs token inputs (input_dim = 0, vocab_size > 0); remove [model.adaptive]",
            )
            dims = self.adaptive.cluster_dims(self.d_model)
            require(
                dims[-1] >= 1,
                p + "adaptive.div_val",
                f"the last cluster would embed in {dims[-1]} dimensions; lower div_val or raise d_embed",
            )
            require(
                not any(self.adaptive.tie_projs) or self.adaptive.has_proj(self.d_model),
                p + "adaptive.tie_projs",
                "there is no projection to tie with div_val = 1 and d_embed = d_model; set []",
            )
        require(
            self.memory.init == "empty" or not (self.is_ql or self.uses_compression),
            p + "memory.init",
            "zero-filled memory is a Transformer-XL import option (cmem_len = 0, no scales); set 'empty'",
        )

    def _check_compressor(self, p: str) -> None:
        """The chosen compressor against its loss, the attention backend and the memory it reads."""
        comp = self.compression
        spec = COMPRESSORS[comp.function]
        kernel = canonical_kernel(self.attn_impl)
        require(
            not spec.needs_usage or kernel == "auto" or KERNELS[kernel].weights,
            p + "attn_impl",
            f"compression {comp.function!r} needs attention weights, which {self.attn_impl!r} does not give; use 'explicit' or 'auto'",
        )
        trains = COMPRESSION_LOSSES[comp.loss].trains
        if not spec.trainable:
            require(
                not trains,
                p + "compression.loss",
                f"compression {comp.function!r} has no parameters to train; set compression.loss = 'none'",
            )
        else:
            require(
                trains,
                p + "compression.loss",
                f"compression {comp.function!r} has parameters; train them with 'attention', 'autoencoder' or 'bptt'",
            )
        require(
            spec.extra_width or comp.extra_width == 0,
            p + "compression.extra_width",
            f"{comp.function} keeps whole slots; set compression.extra_width = 0",
        )
        require(
            comp.extra_width <= self.memory.mem_len,
            p + "compression.extra_width",
            f"overlapping windows read {comp.extra_width} newer memory slots; needs mem_len >= it",
        )

    @property
    def is_wavenet(self) -> bool:
        """A WaveNet configuration (its section is present with its kind only)."""
        return self.wavenet is not None

    @property
    def is_ql(self) -> bool:
        """A Transformer-QL configuration (its section is present with its kind only)."""
        return self.ql is not None

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_heads

    @property
    def uses_compression(self) -> bool:
        return self.memory.cmem_len > 0

    @property
    def needs_attention_weights(self) -> bool:
        return self.uses_compression and COMPRESSORS[self.compression.function].needs_usage


__all__ = [
    "NORMS",
    "CMEM_POSITIONS",
    "SHARE_POSITIONS",
    "MEMORY_INITS",
    "AdaptiveConfig",
    "MemoryConfig",
    "CompressionConfig",
    "PositionsConfig",
    "QLConfig",
    "WaveNetConfig",
    "MOVED_MODEL_KEYS",
    "ModelConfig",
    "model_override_path",
    "upgrade_model_table",
    "with_kind",
]
