"""Frozen configuration dataclasses of a run's sections (TOML loading and dotted overrides: :mod:`.config_base`).

Every section is a frozen dataclass that validates itself in ``__post_init__``; a user mistake raises
:class:`ConfigError` with one line that names the offending key and says what to change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from compressive_transformer.core.config_base import (
    ConfigError,
    Log,
    apply_overrides,
    check_types,
    from_dict,
    load_toml,
    parse_override,
    require,
    to_dict,
    tomllib,
)
from compressive_transformer.core.registry import COMPRESSION_LOSSES, COMPRESSORS, FORMATS, find_model_kind

# attention backends (core/attention_backends.py); "math" and "sdpa" are the earlier names of "explicit" and "sdpa-bias"
ATTENTION_IMPLS = ("auto", "explicit", "sdpa-bias", "flex", "math", "sdpa")
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
    """Transformer-QL (its presence selects the kind): Transformer-XL layers per temporal scale, finest first, the
    layers after the accumulation layer, and the probability of dropping the finer scales from the accumulation."""

    scales: tuple[int, ...] = ()  # required: e.g. (2, 2)
    output_layers: int = 0
    droppath: float = 0.0

    def __post_init__(self) -> None:
        check_types(self, "model.ql")


@dataclass(frozen=True)
class WaveNetConfig:
    """WaveNet (its presence selects the kind): one dilation per layer, ``d_model`` residual and ``d_ff`` skip
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


def model_override_path(parts: list[str], value: Any) -> list[str]:
    """A dotted override's path with a flat [model] key of the earlier layout moved into its section
    (``model.compression_rate=2`` sets ``model.compression.rate``)."""
    if len(parts) == 2 and parts[0] == "model" and (place := _moved(parts[1], value)) is not None:
        return ["model", *place]
    return parts


@dataclass(frozen=True)
class ModelConfig:
    """Shape and behaviour of one model of the family.

    ``memory.cmem_len=0`` is Transformer-XL; ``mem_len=cmem_len=0`` is a plain causal transformer. No parameter
    depends on ``seg_len`` or the memory lengths, so memories may be longer at evaluation than in training.
    """

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
    attn_impl: str = "auto"  # explicit (returns weights), sdpa-bias, flex; auto: attention_backends.AUTO
    ql: QLConfig | None = None  # Transformer-QL ([model.ql]); None: not this kind
    wavenet: WaveNetConfig | None = None  # WaveNet ([model.wavenet]); None: not this kind
    init_std: float = 0.02
    layer_norm_eps: float = 1e-5
    adaptive: AdaptiveConfig | None = None  # adaptive input and softmax ([model.adaptive]); None: full softmax
    # Transformer-XL reference behaviour an importer sets (docs/fidelity.md; also memory.init, positions.same_length_self):
    final_norm: bool = True  # norm = "pre": layer-norm the last block's output (Transformer-XL's code does not)

    @classmethod
    def from_raw(cls, table: Mapping[str, Any], section: str = "model") -> "ModelConfig":
        """Build from a [model] table, the earlier flat keys included (:func:`upgrade_model_table`)."""
        return from_dict(cls, upgrade_model_table(table, section), section)

    def __post_init__(self) -> None:
        check_types(self, "model")
        p = "model."
        self._check_sizes(p)
        self._check_layers(p)
        self._check_adaptive_and_reference(p)
        kind = find_model_kind(self)
        if kind is not None and kind.check is not None:
            kind.check(self)  # the model kind's own rules (Transformer-QL's scales, ...)
        if self.uses_compression:
            self._check_compressor(p)

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
            self.attn_impl in ATTENTION_IMPLS,
            p + "attn_impl",
            f"unknown {self.attn_impl!r}; use one of {', '.join(ATTENTION_IMPLS)}",
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
        require(
            not (spec.needs_usage and self.attn_impl not in ("auto", "explicit", "math")),
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
        """A WaveNet configuration ([model.wavenet] given)."""
        return self.wavenet is not None

    @property
    def is_ql(self) -> bool:
        """A Transformer-QL configuration ([model.ql] given)."""
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


# "auto": bf16 where the device runs it natively, else fp32 (precision.resolve_amp); "none": fp32
AMP_CHOICES = ("auto", "none", "bf16", "fp16")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation recipe of the paper: Adam, linear warmup from ``lr_start`` then cosine decay to ``lr_final``,
    gradient-norm clipping at 0.1, and fewer (larger) updates late in training via ``accumulate``.

    ``steps`` counts optimizer updates; each consumes ``accumulate`` batches, where ``accumulate`` lists
    ``[first_update, batches_per_update]`` pairs (e.g. ``[[0, 1], [8000, 4]]``).
    """

    seed: int = 0
    steps: int = 1000
    batch_size: int = 8
    lr: float = 3e-4
    lr_start: float = 1e-6
    lr_final: float = 1e-6
    warmup_steps: int = 100
    decay_steps: int = 0  # 0: decay over steps - warmup_steps
    compressor_lr_scale: float = 1.0  # the compressor's lr is this multiple of the scheduled lr
    betas: tuple[float, ...] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: float = 0.1  # 0: no clipping
    divergence_factor: float = 4.0  # stop when the loss exceeds this times ln(vocab), the uniform guess; 0: never
    accumulate: tuple[tuple[int, ...], ...] = ((0, 1),)
    shuffle: bool = True  # shuffle document order of the training stream
    piece_len: int = 0  # > 0: cut training documents into pieces of at most this many tokens (a multiple of seg_len)
    log_every: int = 10
    val_every: int = 0  # 0: validate only at the end
    val_batches: int = 50  # 0: the whole validation split
    checkpoint_every: int = 100  # 0: only at the end
    keep_checkpoints: int = 3
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    amp: str = "auto"  # auto | none | bf16 | fp16: autocast of the matmuls (weights, memory, losses stay fp32)
    compile: bool = False  # torch.compile the training forward (for GPUs: on CPU it measured slower than eager)
    num_threads: int = 0  # CPU threads for torch; 0: PyTorch's default (1 is fastest on a busy machine)
    progress: bool = True
    init_from: str = ""  # a run or export directory whose weights start this run (`train --init-from`)
    freeze: tuple[str, ...] = ()  # groups kept as initialised: "copied" (from init_from), "model", "compressor"

    def __post_init__(self) -> None:
        check_types(self, "train")
        p = "train."
        require(self.steps > 0, p + "steps", "must be > 0")
        require(self.batch_size > 0, p + "batch_size", "must be > 0")
        require(self.lr > 0, p + "lr", "must be > 0")
        require(0 <= self.lr_start <= self.lr, p + "lr_start", "must be in [0, lr]")
        require(0 <= self.lr_final <= self.lr, p + "lr_final", "must be in [0, lr]")
        require(self.warmup_steps >= 0, p + "warmup_steps", "must be >= 0")
        require(self.decay_steps >= 0, p + "decay_steps", "must be >= 0 (0 means steps - warmup_steps)")
        require(self.compressor_lr_scale >= 0, p + "compressor_lr_scale", "must be >= 0")
        require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), p + "betas", "must be two numbers in [0, 1)"
        )
        require(self.eps > 0, p + "eps", "must be > 0")
        require(self.weight_decay >= 0, p + "weight_decay", "must be >= 0")
        require(self.grad_clip >= 0, p + "grad_clip", "must be >= 0 (0 means no clipping)")
        require(
            self.divergence_factor == 0 or self.divergence_factor >= 1,
            p + "divergence_factor",
            "must be 0 (off) or >= 1",
        )
        acc = self.accumulate
        require(
            len(acc) > 0 and all(len(a) == 2 and a[1] >= 1 for a in acc),
            p + "accumulate",
            "must be a list of [first_update, batches_per_update] pairs with batches_per_update >= 1",
        )
        starts = [a[0] for a in acc]
        require(
            starts[0] == 0 and all(b > a for a, b in zip(starts, starts[1:])),
            p + "accumulate",
            "first updates must start at 0 and increase, e.g. [[0, 1], [8000, 4]]",
        )
        require(self.piece_len >= 0, p + "piece_len", "must be >= 0 (0 keeps whole documents)")
        require(self.log_every > 0, p + "log_every", "must be > 0")
        require(self.val_every >= 0, p + "val_every", "must be >= 0 (0 means only at the end)")
        require(self.val_batches >= 0, p + "val_batches", "must be >= 0 (0 means the whole split)")
        require(self.checkpoint_every >= 0, p + "checkpoint_every", "must be >= 0 (0 means only at the end)")
        require(self.keep_checkpoints >= 1, p + "keep_checkpoints", "must be >= 1")
        require(
            self.device in ("auto", "cpu", "cuda", "mps") or self.device.startswith("cuda:"),
            p + "device",
            f"unknown {self.device!r}; use auto, cpu, cuda, cuda:N or mps",
        )
        require(self.amp in AMP_CHOICES, p + "amp", f"unknown {self.amp!r}; use one of {', '.join(AMP_CHOICES)}")
        require(self.num_threads >= 0, p + "num_threads", "must be >= 0 (0 means PyTorch's default)")
        require(
            all(g in ("copied", "model", "compressor") for g in self.freeze),
            p + "freeze",
            f"unknown group in {list(self.freeze)}; use 'copied' (from --init-from), 'model' (all but the compressor) "
            "or 'compressor'",
        )

    def accumulation_at(self, step: int) -> int:
        """Batches per update for update ``step`` (0-based): the last ``accumulate`` entry starting at or before it."""
        return [n for start, n in self.accumulate if start <= step][-1]


@dataclass(frozen=True)
class EvalConfig:
    """Streaming evaluation; unset lengths fall back to the model's, so memories may be longer than in training."""

    split: str = "validation"
    batch_size: int = 4  # parallel streams; each row carries its own memory through its share of the split
    seg_len: int | None = None
    mem_len: int | None = None
    cmem_len: int | None = None
    max_batches: int = 0  # 0: the whole split
    amp: str = ""  # "": as train.amp; else auto | none | bf16 | fp16 for evaluation and generation

    def __post_init__(self) -> None:
        check_types(self, "eval")
        p = "eval."
        require(
            self.amp in ("",) + AMP_CHOICES,
            p + "amp",
            f'unknown {self.amp!r}; use one of {", ".join(AMP_CHOICES)} (or "" for train.amp)',
        )
        require(self.split in ("train", "validation", "test"), p + "split", "use train, validation or test")
        require(self.batch_size > 0, p + "batch_size", "must be > 0")
        require(self.seg_len is None or self.seg_len > 0, p + "seg_len", "must be > 0 (leave unset for model.seg_len)")
        require(
            self.mem_len is None or self.mem_len >= 0,
            p + "mem_len",
            "must be >= 0 (leave unset for model.memory.mem_len)",
        )
        require(
            self.cmem_len is None or self.cmem_len >= 0,
            p + "cmem_len",
            "must be >= 0 (leave unset for model.memory.cmem_len)",
        )
        require(self.max_batches >= 0, p + "max_batches", "must be >= 0 (0 means the whole split)")

    def lengths(self, model: ModelConfig) -> Lengths:
        """The lengths evaluation runs at (see :func:`eval_lengths`)."""
        return eval_lengths(model, seg_len=self.seg_len, mem_len=self.mem_len, cmem_len=self.cmem_len)


class Lengths(NamedTuple):
    seg_len: int
    mem_len: int
    cmem_len: int


def eval_lengths(
    model: ModelConfig, *, seg_len: int | None = None, mem_len: int | None = None, cmem_len: int | None = None
) -> Lengths:
    """The one rule for the lengths a trained model is evaluated at: each length given, else the training one
    (``None`` is unset; a memory length of 0 is a length, a segment length of 0 is not)."""
    return Lengths(
        seg_len or model.seg_len,
        model.memory.mem_len if mem_len is None else mem_len,
        model.memory.cmem_len if cmem_len is None else cmem_len,
    )


RUN_SECTIONS = ("model", "data", "train", "eval")


def _default_data_config() -> "DataConfig":
    return DataConfig()  # defined further down this module


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs; each component receives only its own section."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=_default_data_config)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        m, e = self.model, self.eval
        require(
            self.train.piece_len % m.seg_len == 0,
            "train.piece_len",
            f"{self.train.piece_len} is not a multiple of model.seg_len = {m.seg_len}; pieces must end on a segment boundary",
        )
        if m.uses_compression and e.mem_len is not None:
            require(
                m.compression.extra_width <= e.mem_len,
                "eval.mem_len",
                f"overlapping compression windows read {m.compression.extra_width} memory slots; needs mem_len >= it",
            )

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> "RunConfig":
        if not isinstance(raw, Mapping):
            raise ConfigError(f"config: expected tables [{'], ['.join(RUN_SECTIONS)}]")
        unknown = sorted(set(raw) - set(RUN_SECTIONS))
        if unknown:
            raise ConfigError(f"{unknown[0]}: unknown section; known sections are {', '.join(RUN_SECTIONS)}")
        classes = {"data": DataConfig, "train": TrainConfig, "eval": EvalConfig}
        parts = {name: from_dict(classes[name], raw.get(name, {}), name) for name in classes}
        return cls(model=ModelConfig.from_raw(raw.get("model", {})), **parts)


def apply_run_overrides(raw: Mapping[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``raw`` (a run's tables) with its [model] table in the sectioned layout and each dotted override set, an
    override of a flat [model] key of the earlier layout set in its section."""
    out = dict(raw)
    if "model" in out:
        out["model"] = upgrade_model_table(out["model"])
    return apply_overrides(out, overrides, rename=model_override_path)


def load_run_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read a run's TOML (or start from the defaults when ``path`` is None), apply ``section.key=value`` overrides."""
    raw = load_toml(path) if path is not None else {}
    return RunConfig.from_raw(apply_run_overrides(raw, overrides))


TOKENIZERS = ("bytes", "words", "bpe", "unigram", "pretrained")
DEFAULT_SUBWORD_VOCAB = 8192


@dataclass(frozen=True)
class DataConfig:
    """Where the corpus is and how it becomes token ids (the trainer owns batch size and segment length).

    ``pydoc`` is the help-topic corpus every Python install ships, so a run works with no download.
    """

    format: str = "pydoc"
    path: str = ""  # file or directory of the corpus; unused for pydoc
    tokenizer: str = "bytes"
    vocab_size: int = 0  # bpe/unigram target size; 0 means 8192; ignored for bytes and words
    min_freq: int = 1  # words: rarer words become <unk>
    cache_dir: str = ""  # "" = a .cache directory inside the run directory
    train_file: str = ""  # wikitext: file that acts as the train split (e.g. "wiki.valid.tokens")
    tokenizer_file: str = ""  # tokenizer = "pretrained": a HuggingFace tokenizers ``tokenizer.json`` to use as is
    sample_rate: int = 16000  # audio: samples per second every file is resampled to

    def __post_init__(self) -> None:
        check_types(self, "data")
        p = "data."
        require(self.format in FORMATS, p + "format", f"unknown {self.format!r}; use one of {', '.join(FORMATS)}")
        require(
            self.tokenizer in TOKENIZERS,
            p + "tokenizer",
            f"unknown {self.tokenizer!r}; use one of {', '.join(TOKENIZERS)}",
        )
        fmt = FORMATS[self.format]
        require(
            not fmt.needs_path or bool(self.path),
            p + "path",
            f"format {self.format!r} needs the file or directory of the corpus; set data.path",
        )
        require(self.vocab_size >= 0, p + "vocab_size", "must be >= 0 (0 means 8192 for bpe/unigram)")
        if self.tokenizer == "bpe":
            require(
                self.vocab_size == 0 or self.vocab_size >= 257,
                p + "vocab_size",
                "byte-level BPE starts from 256 byte symbols; set vocab_size >= 257 (or 0 for 8192)",
            )
        if self.tokenizer == "unigram":
            require(
                self.vocab_size == 0 or self.vocab_size >= 257,
                p + "vocab_size",
                "byte-level unigram keeps all 256 byte symbols; set vocab_size >= 257 (or 0 for 8192)",
            )
        require(self.min_freq >= 1, p + "min_freq", "must be >= 1")
        require(self.sample_rate > 0, p + "sample_rate", "must be > 0 (samples per second, e.g. 16000)")
        require(
            (self.tokenizer == "pretrained") == bool(self.tokenizer_file),
            p + "tokenizer_file",
            "set it (a tokenizer.json) exactly when tokenizer = 'pretrained'"
            if self.tokenizer == "pretrained"
            else "is used only with tokenizer = 'pretrained'; remove it or set tokenizer = 'pretrained'",
        )
        require(
            not fmt.tokenizers or self.tokenizer in fmt.tokenizers,
            p + "tokenizer",
            f"{fmt.tokenizer_reason}; set tokenizer = {' or '.join(repr(t) for t in fmt.tokenizers)}",
        )
        with_train_file = [name for name, f in FORMATS.items() if f.train_file]
        require(
            not self.train_file or fmt.train_file,
            p + "train_file",
            f"only the {' and '.join(with_train_file)} format has a train_file override; remove it",
        )

    @property
    def subword_vocab_size(self) -> int:
        return self.vocab_size or DEFAULT_SUBWORD_VOCAB


__all__ = [
    "AdaptiveConfig",
    "MemoryConfig",
    "CompressionConfig",
    "PositionsConfig",
    "QLConfig",
    "WaveNetConfig",
    "MOVED_MODEL_KEYS",
    "upgrade_model_table",
    "model_override_path",
    "apply_run_overrides",
    "ConfigError",
    "Log",
    "require",
    "eval_lengths",
    "Lengths",
    "tomllib",
    "ModelConfig",
    "TrainConfig",
    "EvalConfig",
    "RunConfig",
    "load_run_config",
    "from_dict",
    "to_dict",
    "load_toml",
    "parse_override",
    "apply_overrides",
]
