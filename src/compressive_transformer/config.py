"""Frozen configuration dataclasses, TOML loading and dotted overrides.

Every section is a frozen dataclass that validates itself in ``__post_init__``; a user mistake raises
:class:`ConfigError` with one line that names the offending key and says what to change.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, TypeVar

from compressive_transformer.registry import COMPRESSORS, FORMATS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib


class ConfigError(ValueError):
    """A configuration a user wrote cannot work; the message names the key and the fix."""


T = TypeVar("T")

COMPRESSION_LOSSES = ("attention", "autoencoder", "bptt", "none")
ATTENTION_IMPLS = ("auto", "math", "sdpa")
NORMS = ("pre", "post")
CMEM_POSITIONS = ("separate", "shared")
SHARE_POSITIONS = ("none", "biases", "all")  # what the layers' attention shares: nothing, u/v, u/v and W_r


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_ok(value: Any, annotation: Any) -> bool:
    """Whether ``value`` has the annotated type (an int passes for a float; bools never pass for numbers)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin is tuple:
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis] or [Any]
        return isinstance(value, (tuple, list)) and all(_type_ok(v, args[0]) for v in value)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if annotation is str:
        return isinstance(value, str)
    return True


def _check_types(obj: Any, section: str) -> None:
    """Every field of a config dataclass has its annotated type: ``ModelConfig(d_model="32")`` fails here, in one
    line naming the key, rather than somewhere inside torch."""
    for name, annotation in _hints(type(obj)).items():
        value = getattr(obj, name)
        if not _type_ok(value, annotation):
            kind = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
            raise ConfigError(
                f"{section}.{name}: expected {kind}{' (finite)' if annotation is float else ''}, got {value!r}"
            )


@dataclass(frozen=True)
class ModelConfig:
    """Shape and behaviour of one model of the family.

    ``cmem_len=0`` is Transformer-XL; ``mem_len=cmem_len=0`` is a plain causal transformer. No parameter depends on
    ``seg_len``, ``mem_len`` or ``cmem_len``, so memories may be longer at evaluation than in training.
    """

    vocab_size: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    d_head: int = 0  # 0: d_model // n_heads
    d_ff: int = 1024
    seg_len: int = 128
    mem_len: int = 128
    cmem_len: int = 128
    compression_rate: int = 4
    compression: str = "conv"
    compression_loss: str = "attention"
    compression_extra_width: int = 0  # extra kernel width for overlapping windows (reads newer neighbours)
    dilations: tuple[int, ...] = (1, 2, 4)  # dilated_conv: kernel-2 dilated convolutions before the strided one
    bptt_horizon: int = 2  # bptt: segments during which a compressed slot still trains the compressor
    cmem_positions: str = "separate"  # compressed memory's own positional stream, or one shared stream
    share_positions: str = "none"  # one u/v ("biases", Transformer-XL's default) or also one W_r ("all") for all layers
    clamp_len: int = 0  # 0: no clamping of relative distances
    same_length: bool = False  # every query sees the same number of (uncompressed) positions
    norm: str = "post"  # Algorithm 1 is post-LN; "pre" stores the layer-normed inputs, as the authors' code
    gating: bool = False  # GTrXL gated residuals (requires norm="pre")
    gate_bias: float = 2.0
    tie_embeddings: bool = False
    dropout: float = 0.1
    attn_dropout: float = 0.0
    input_dim: int = 0  # > 0: continuous inputs through a linear projection instead of a token embedding
    attn_impl: str = "auto"  # math returns attention weights; sdpa is fused; auto: math on CPU (faster), sdpa elsewhere
    scales: tuple[int, ...] = ()  # Transformer-QL: Transformer-XL layers per temporal scale, finest first
    output_layers: int = 0  # Transformer-QL: Transformer-XL layers after the accumulation layer
    droppath: float = 0.0  # Transformer-QL: probability of dropping the finer scales from the accumulation
    wavenet_dilations: tuple[int, ...] = ()  # WaveNet: one dilation per layer (d_model residual, d_ff skip channels)
    init_std: float = 0.02
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        _check_types(self, "model")
        p = "model."
        _require(self.vocab_size >= 0, p + "vocab_size", "must be >= 0")
        _require(self.input_dim >= 0, p + "input_dim", "must be >= 0 (0 means token inputs)")
        _require(
            self.vocab_size > 0 or self.input_dim > 0,
            p + "vocab_size",
            "set vocab_size > 0 for token inputs, or input_dim > 0 for continuous inputs",
        )
        _require(self.d_model > 0, p + "d_model", "must be > 0")
        _require(self.n_layers > 0, p + "n_layers", "must be > 0")
        _require(self.n_heads > 0, p + "n_heads", "must be > 0")
        _require(self.d_head >= 0, p + "d_head", "must be >= 0 (0 means d_model // n_heads)")
        _require(
            self.d_head > 0 or self.d_model % self.n_heads == 0,
            p + "n_heads",
            f"n_heads={self.n_heads} does not divide d_model={self.d_model}; change one or set d_head",
        )
        _require(self.d_ff > 0, p + "d_ff", "must be > 0")
        _require(self.seg_len > 0, p + "seg_len", "must be > 0")
        _require(self.mem_len >= 0, p + "mem_len", "must be >= 0")
        _require(self.cmem_len >= 0, p + "cmem_len", "must be >= 0")
        _require(self.compression_rate >= 1, p + "compression_rate", "must be >= 1")
        _require(
            self.compression in COMPRESSORS,
            p + "compression",
            f"unknown {self.compression!r}; use one of {', '.join(COMPRESSORS)}",
        )
        _require(
            self.compression_loss in COMPRESSION_LOSSES,
            p + "compression_loss",
            f"unknown {self.compression_loss!r}; use one of {', '.join(COMPRESSION_LOSSES)}",
        )
        _require(self.compression_extra_width >= 0, p + "compression_extra_width", "must be >= 0")
        _require(
            all(isinstance(d, int) and d >= 1 for d in self.dilations) and len(self.dilations) > 0,
            p + "dilations",
            "must be a non-empty list of integers >= 1",
        )
        _require(self.bptt_horizon >= 1, p + "bptt_horizon", "must be >= 1")
        _require(self.cmem_positions in CMEM_POSITIONS, p + "cmem_positions", f"use one of {', '.join(CMEM_POSITIONS)}")
        _require(
            self.share_positions in SHARE_POSITIONS, p + "share_positions", f"use one of {', '.join(SHARE_POSITIONS)}"
        )
        _require(self.clamp_len >= 0, p + "clamp_len", "must be >= 0 (0 means no clamping)")
        _require(self.norm in NORMS, p + "norm", f"unknown {self.norm!r}; use 'pre' or 'post'")
        _require(not self.gating or self.norm == "pre", p + "gating", "GTrXL gating needs norm = 'pre'")
        _require(0.0 <= self.dropout < 1.0, p + "dropout", "must be in [0, 1)")
        _require(0.0 <= self.attn_dropout < 1.0, p + "attn_dropout", "must be in [0, 1)")
        _require(
            self.attn_impl in ATTENTION_IMPLS,
            p + "attn_impl",
            f"unknown {self.attn_impl!r}; use one of {', '.join(ATTENTION_IMPLS)}",
        )
        _require(
            not (self.tie_embeddings and (self.input_dim > 0 or self.vocab_size == 0)),
            p + "tie_embeddings",
            "needs token inputs (input_dim = 0) and vocab_size > 0",
        )
        if self.is_ql:
            self._check_ql()
        if self.is_wavenet:
            self._check_wavenet()
        _require(
            self.is_ql or self.droppath == 0.0, p + "droppath", "droppath is a Transformer-QL option; set scales or 0"
        )
        if self.uses_compression:
            spec = COMPRESSORS[self.compression]
            _require(
                not (spec.needs_usage and self.attn_impl == "sdpa"),
                p + "attn_impl",
                f"compression {self.compression!r} needs attention weights, which the fused 'sdpa' kernel does not give; use 'math' or 'auto'",
            )
            if not spec.trainable:
                _require(
                    self.compression_loss == "none",
                    p + "compression_loss",
                    f"compression {self.compression!r} has no parameters to train; set compression_loss = 'none'",
                )
            else:
                _require(
                    self.compression_loss != "none",
                    p + "compression_loss",
                    f"compression {self.compression!r} has parameters; train them with 'attention', 'autoencoder' or 'bptt'",
                )
            _require(
                spec.extra_width or self.compression_extra_width == 0,
                p + "compression_extra_width",
                f"{self.compression} keeps whole slots; set compression_extra_width = 0",
            )
            _require(
                self.compression_extra_width <= self.mem_len,
                p + "compression_extra_width",
                f"overlapping windows read {self.compression_extra_width} newer memory slots; needs mem_len >= it",
            )

    def _check_ql(self) -> None:
        p, c = "model.", self.compression_rate
        _require(all(isinstance(n, int) and n >= 1 for n in self.scales), p + "scales", "every scale needs >= 1 layer")
        _require(self.output_layers >= 0, p + "output_layers", "must be >= 0")
        total = sum(self.scales) + self.output_layers
        _require(
            self.n_layers == total,
            p + "n_layers",
            f"Transformer-QL has sum(scales) + output_layers = {total} layers; set n_layers = {total}",
        )
        _require(
            self.cmem_len == 0,
            p + "cmem_len",
            "Transformer-QL compresses between scales, not into a compressed memory; set cmem_len = 0",
        )
        pools = [name for name, spec in COMPRESSORS.items() if spec.scale_pool is not None]
        _require(
            COMPRESSORS[self.compression].scale_pool is not None,
            p + "compression",
            f"Transformer-QL pools between scales; use {' or '.join(repr(n) for n in pools)} (with compression_loss = 'none')",
        )
        _require(
            self.compression_loss == "none",
            p + "compression_loss",
            "Transformer-QL's pooling has nothing to train; set 'none'",
        )
        _require(
            self.compression_extra_width == 0,
            p + "compression_extra_width",
            "Transformer-QL pools with window c; set 0",
        )
        levels = len(self.scales) - 1
        _require(
            self.seg_len % (c**levels) == 0,
            p + "seg_len",
            f"must be divisible by compression_rate ** (len(scales) - 1) = {c**levels} so every scale shifts whole states",
        )
        _require(
            (self.seg_len + self.mem_len) % c == 0,
            p + "mem_len",
            f"seg_len + mem_len = {self.seg_len + self.mem_len} must be divisible by compression_rate = {c}",
        )
        _require(0.0 <= self.droppath < 1.0, p + "droppath", "must be in [0, 1)")

    def _check_wavenet(self) -> None:
        p, n = "model.", len(self.wavenet_dilations)
        _require(
            all(isinstance(d, int) and d >= 1 for d in self.wavenet_dilations),
            p + "wavenet_dilations",
            "every dilation must be >= 1",
        )
        _require(self.n_layers == n, p + "n_layers", f"WaveNet has one layer per dilation; set n_layers = {n}")
        _require(not self.is_ql, p + "scales", "WaveNet has no scales; remove them or wavenet_dilations")
        _require(
            self.mem_len == 0 and self.cmem_len == 0,
            p + "mem_len",
            "WaveNet's memory is its receptive field (1 + sum of dilations); set mem_len = 0 and cmem_len = 0",
        )
        _require(
            self.input_dim == 0 and self.vocab_size > 0, p + "input_dim", "WaveNet reads tokens; set input_dim = 0"
        )

    @property
    def is_wavenet(self) -> bool:
        """A WaveNet configuration (``wavenet_dilations`` given)."""
        return len(self.wavenet_dilations) > 0

    @property
    def is_ql(self) -> bool:
        """A Transformer-QL configuration (``scales`` given)."""
        return len(self.scales) > 0

    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_heads

    @property
    def uses_compression(self) -> bool:
        return self.cmem_len > 0

    @property
    def needs_attention_weights(self) -> bool:
        return self.uses_compression and COMPRESSORS[self.compression].needs_usage


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

    def __post_init__(self) -> None:
        _check_types(self, "train")
        p = "train."
        _require(self.steps > 0, p + "steps", "must be > 0")
        _require(self.batch_size > 0, p + "batch_size", "must be > 0")
        _require(self.lr > 0, p + "lr", "must be > 0")
        _require(0 <= self.lr_start <= self.lr, p + "lr_start", "must be in [0, lr]")
        _require(0 <= self.lr_final <= self.lr, p + "lr_final", "must be in [0, lr]")
        _require(self.warmup_steps >= 0, p + "warmup_steps", "must be >= 0")
        _require(self.decay_steps >= 0, p + "decay_steps", "must be >= 0 (0 means steps - warmup_steps)")
        _require(self.compressor_lr_scale >= 0, p + "compressor_lr_scale", "must be >= 0")
        _require(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), p + "betas", "must be two numbers in [0, 1)"
        )
        _require(self.eps > 0, p + "eps", "must be > 0")
        _require(self.weight_decay >= 0, p + "weight_decay", "must be >= 0")
        _require(self.grad_clip >= 0, p + "grad_clip", "must be >= 0 (0 means no clipping)")
        _require(
            self.divergence_factor == 0 or self.divergence_factor >= 1,
            p + "divergence_factor",
            "must be 0 (off) or >= 1",
        )
        acc = self.accumulate
        _require(
            len(acc) > 0 and all(len(a) == 2 and a[1] >= 1 for a in acc),
            p + "accumulate",
            "must be a list of [first_update, batches_per_update] pairs with batches_per_update >= 1",
        )
        starts = [a[0] for a in acc]
        _require(
            starts[0] == 0 and all(b > a for a, b in zip(starts, starts[1:])),
            p + "accumulate",
            "first updates must start at 0 and increase, e.g. [[0, 1], [8000, 4]]",
        )
        _require(self.piece_len >= 0, p + "piece_len", "must be >= 0 (0 keeps whole documents)")
        _require(self.log_every > 0, p + "log_every", "must be > 0")
        _require(self.val_every >= 0, p + "val_every", "must be >= 0 (0 means only at the end)")
        _require(self.val_batches >= 0, p + "val_batches", "must be >= 0 (0 means the whole split)")
        _require(self.checkpoint_every >= 0, p + "checkpoint_every", "must be >= 0 (0 means only at the end)")
        _require(self.keep_checkpoints >= 1, p + "keep_checkpoints", "must be >= 1")
        _require(
            self.device in ("auto", "cpu", "cuda", "mps") or self.device.startswith("cuda:"),
            p + "device",
            f"unknown {self.device!r}; use auto, cpu, cuda, cuda:N or mps",
        )
        _require(self.amp in AMP_CHOICES, p + "amp", f"unknown {self.amp!r}; use one of {', '.join(AMP_CHOICES)}")
        _require(self.num_threads >= 0, p + "num_threads", "must be >= 0 (0 means PyTorch's default)")

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
        _check_types(self, "eval")
        p = "eval."
        _require(
            self.amp in ("",) + AMP_CHOICES,
            p + "amp",
            f'unknown {self.amp!r}; use one of {", ".join(AMP_CHOICES)} (or "" for train.amp)',
        )
        _require(self.split in ("train", "validation", "test"), p + "split", "use train, validation or test")
        _require(self.batch_size > 0, p + "batch_size", "must be > 0")
        _require(self.seg_len is None or self.seg_len > 0, p + "seg_len", "must be > 0 (leave unset for model.seg_len)")
        _require(
            self.mem_len is None or self.mem_len >= 0, p + "mem_len", "must be >= 0 (leave unset for model.mem_len)"
        )
        _require(
            self.cmem_len is None or self.cmem_len >= 0, p + "cmem_len", "must be >= 0 (leave unset for model.cmem_len)"
        )
        _require(self.max_batches >= 0, p + "max_batches", "must be >= 0 (0 means the whole split)")


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
        _require(
            self.train.piece_len % m.seg_len == 0,
            "train.piece_len",
            f"{self.train.piece_len} is not a multiple of model.seg_len = {m.seg_len}; pieces must end on a segment boundary",
        )
        if m.uses_compression and e.mem_len is not None:
            _require(
                m.compression_extra_width <= e.mem_len,
                "eval.mem_len",
                f"overlapping compression windows read {m.compression_extra_width} memory slots; needs mem_len >= it",
            )

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> "RunConfig":
        if not isinstance(raw, Mapping):
            raise ConfigError(f"config: expected tables [{'], ['.join(RUN_SECTIONS)}]")
        unknown = sorted(set(raw) - set(RUN_SECTIONS))
        if unknown:
            raise ConfigError(f"{unknown[0]}: unknown section; known sections are {', '.join(RUN_SECTIONS)}")
        classes = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "eval": EvalConfig}
        return cls(**{name: from_dict(classes[name], raw.get(name, {}), name) for name in RUN_SECTIONS})


def load_run_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read a run's TOML (or start from the defaults when ``path`` is None), apply ``section.key=value`` overrides."""
    raw = load_toml(path) if path is not None else {}
    return RunConfig.from_raw(apply_overrides(raw, overrides))


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
        _check_types(self, "data")
        p = "data."
        _require(self.format in FORMATS, p + "format", f"unknown {self.format!r}; use one of {', '.join(FORMATS)}")
        _require(
            self.tokenizer in TOKENIZERS,
            p + "tokenizer",
            f"unknown {self.tokenizer!r}; use one of {', '.join(TOKENIZERS)}",
        )
        fmt = FORMATS[self.format]
        _require(
            not fmt.needs_path or bool(self.path),
            p + "path",
            f"format {self.format!r} needs the file or directory of the corpus; set data.path",
        )
        _require(self.vocab_size >= 0, p + "vocab_size", "must be >= 0 (0 means 8192 for bpe/unigram)")
        if self.tokenizer == "bpe":
            _require(
                self.vocab_size == 0 or self.vocab_size >= 257,
                p + "vocab_size",
                "byte-level BPE starts from 256 byte symbols; set vocab_size >= 257 (or 0 for 8192)",
            )
        if self.tokenizer == "unigram":
            _require(
                self.vocab_size == 0 or self.vocab_size >= 257,
                p + "vocab_size",
                "byte-level unigram keeps all 256 byte symbols; set vocab_size >= 257 (or 0 for 8192)",
            )
        _require(self.min_freq >= 1, p + "min_freq", "must be >= 1")
        _require(self.sample_rate > 0, p + "sample_rate", "must be > 0 (samples per second, e.g. 16000)")
        _require(
            (self.tokenizer == "pretrained") == bool(self.tokenizer_file),
            p + "tokenizer_file",
            "set it (a tokenizer.json) exactly when tokenizer = 'pretrained'"
            if self.tokenizer == "pretrained"
            else "is used only with tokenizer = 'pretrained'; remove it or set tokenizer = 'pretrained'",
        )
        _require(
            not fmt.tokenizers or self.tokenizer in fmt.tokenizers,
            p + "tokenizer",
            f"{fmt.tokenizer_reason}; set tokenizer = {' or '.join(repr(t) for t in fmt.tokenizers)}",
        )
        with_train_file = [name for name, f in FORMATS.items() if f.train_file]
        _require(
            not self.train_file or fmt.train_file,
            p + "train_file",
            f"only the {' and '.join(with_train_file)} format has a train_file override; remove it",
        )

    @property
    def subword_vocab_size(self) -> int:
        return self.vocab_size or DEFAULT_SUBWORD_VOCAB


# --------------------------------------------------------------------------------------------------------------
# Generic loading: dicts -> frozen dataclasses, TOML files, dotted overrides.


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Turn a TOML value into the annotated type (lists into tuples, ints into floats); reject what cannot fit."""
    if isinstance(annotation, str):
        annotation = eval(annotation, vars(typing) | {"tuple": tuple})  # postponed annotations of this module
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: cannot be {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (inner, *_rest) = typing.get_args(annotation) or (Any,)
        return tuple(_coerce(v, inner, key) for v in value)
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation in (int, float, str, bool):
        if type(value) is not annotation:
            raise ConfigError(f"{key}: expected {annotation.__name__}, got {value!r}")
        return value
    return value


def from_dict(cls: type[T], data: Mapping[str, Any], section: str) -> T:
    """Build the frozen dataclass ``cls`` from a mapping; unknown keys and wrong types are errors naming the key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{section}: expected a table of keys, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{section}.{unknown[0]}: unknown key; known keys are {', '.join(sorted(fields))}")
    hints = typing.get_type_hints(cls)
    kwargs = {k: _coerce(v, hints[k], f"{section}.{k}") for k, v in data.items()}
    return cls(**kwargs)


def to_dict(obj: Any) -> dict[str, Any]:
    """A dataclass as plain TOML/JSON-friendly values (tuples become lists)."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, Path):
            return str(v)
        return v

    return plain(obj)


def load_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass the path of a TOML file (see configs/)")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML ({e}); fix the file") from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.lr=3e-4"`` -> (["train", "lr"], 0.0003). Values are TOML literals; bare words are strings."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: write it as section.key=value")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"override {text!r}: the key must be dotted, e.g. model.mem_len=256")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return parts, value


def apply_overrides(raw: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Return a copy of ``raw`` with each dotted override set (the dataclasses then reject unknown keys)."""
    out: dict[str, Any] = _deepcopy(raw)
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {p} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return out


def _deepcopy(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _deepcopy(v) if isinstance(v, dict) else v for k, v in d.items()}


__all__ = [
    "ConfigError",
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
