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
from compressive_transformer.core.model_config import (
    MOVED_MODEL_KEYS,
    AdaptiveConfig,
    CompressionConfig,
    MemoryConfig,
    ModelConfig,
    PositionsConfig,
    QLConfig,
    WaveNetConfig,
    model_override_path,
    upgrade_model_table,
)
from compressive_transformer.core.registry import FORMATS

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
    compile: bool = False  # torch.compile the training forward (meant for GPUs; benchmarks/ compares it on CPU)
    cuda_graphs: bool = False  # replay the steady-state update as one CUDA graph (CUDA, one process, fp32 or bf16)
    num_threads: int = 0  # CPU threads for torch; 0: PyTorch's default (fewer can be faster where cores are shared)
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
        tables = {**raw, "data": format_follows_path(raw.get("data", {}))}
        parts = {name: from_dict(classes[name], tables.get(name, {}), name) for name in classes}
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


def format_follows_path(data: Any) -> Any:
    """A [data] table that names a ``path`` but no ``format`` reads the path as ``text`` (a user's own files), never
    as the default's built-in pydoc topics (which read no path)."""
    if isinstance(data, Mapping) and data.get("path") and "format" not in data:
        return {**data, "format": PATH_FORMAT}
    return data


PATH_FORMAT = "text"  # the format of a data.path given without data.format
TOKENIZERS = ("bytes", "words", "bpe", "unigram", "pretrained")
DEFAULT_SUBWORD_VOCAB = 8192
DEFAULT_TOKENIZER_SAMPLE = 200_000_000  # bytes: a 32K BPE learns from this much of PG-19 in minutes on 2 cores


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
    tokenizer_sample: int = DEFAULT_TOKENIZER_SAMPLE  # bytes of train text a trained tokenizer learns from; 0 = all
    tokenizer_sample_seed: int = 0  # which documents that sample draws (data/sample.py)

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
        require(
            fmt.needs_path or not self.path,
            p + "path",
            f"the {self.format!r} format is built in and reads no path, so {self.path!r} would be ignored; set "
            f"data.format = '{PATH_FORMAT}' (or another format of files: {', '.join(n for n, f in FORMATS.items() if f.needs_path)}) "
            "to read it, or drop data.path",
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
            self.tokenizer_sample >= 0,
            p + "tokenizer_sample",
            f"must be >= 0 (bytes of train text the tokenizer learns from, e.g. {DEFAULT_TOKENIZER_SAMPLE:_}; 0 = all)",
        )
        self._check_unused(p, fmt)
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

    def _check_unused(self, p: str, fmt: Any) -> None:
        """Settings this tokenizer or format would not read: refused rather than silently ignored."""
        require(
            self.vocab_size == 0 or self.tokenizer in ("bpe", "unigram"),
            p + "vocab_size",
            f"is the size a bpe or unigram tokenizer learns; the {self.tokenizer!r} tokenizer would ignore it "
            "(bytes: 256 ids; words: every training word, rarer than data.min_freq as <unk>; pretrained: its file's); "
            "remove it",
        )
        require(
            self.min_freq == 1 or self.tokenizer == "words",
            p + "min_freq",
            f"applies to the words tokenizer only; the {self.tokenizer!r} tokenizer would ignore it, remove it",
        )
        trained = self.tokenizer in ("words", "bpe", "unigram")
        for key in ("tokenizer_sample", "tokenizer_sample_seed"):
            require(
                trained or getattr(self, key) == DataConfig.__dataclass_fields__[key].default,
                p + key,
                f"chooses the text a words, bpe or unigram tokenizer learns from; the {self.tokenizer!r} tokenizer is "
                "not trained, so it would be ignored: remove it",
            )
        default_rate = DataConfig.__dataclass_fields__["sample_rate"].default
        require(
            self.sample_rate == default_rate or "sample_rate" in fmt.settings,
            p + "sample_rate",
            f"the {self.format!r} format reads no sound, so it would be ignored; remove it",
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
    "format_follows_path",
    "PATH_FORMAT",
    "from_dict",
    "to_dict",
    "load_toml",
    "parse_override",
    "apply_overrides",
]
