"""Run directories: the config a run records and reads back, fresh and empty directories, the token cache's place,
and a trained run's config, tokenizer and model.

A run directory holds ``config.toml`` (the resolved config), ``tokenizer/``, ``checkpoints/``, ``metrics.jsonl``,
``eval_<split>.json`` and ``.lock``. A new run never writes into a directory that already holds something; a resumed
run must have been written by the same config (keys that only change logging may differ, and the keys of
:data:`RESUME_REMEDY_KEYS`: the remedies for a diverged run, and the length that trains a run further).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from compressive_transformer.core.config import (
    PATH_FORMAT,
    ConfigError,
    Log,
    RunConfig,
    apply_run_overrides,
    load_toml,
    parse_override,
    to_dict,
    tomllib,
)
from compressive_transformer.core.config_base import flatten
from compressive_transformer.core.fileio import check_links, inside, remove
from compressive_transformer.core.models import MemoryModel, build_model
from compressive_transformer.data import load_tokenizer
from compressive_transformer.data.readers import data_root_path
from compressive_transformer.runs.budget import check_model_size
from compressive_transformer.runs.checkpoint import CHECKPOINTS, list_checkpoints, load_newest_weights
from compressive_transformer.runs.machine import resolve_device, set_threads
from compressive_transformer.runs.metrics import METRICS_FILE
from compressive_transformer.runs.presets import TINY_TOML
from compressive_transformer.runs.runlock import LOCK_FILE

CONFIG_FILE = "config.toml"
TOKENIZER_DIR = "tokenizer"
# keys that change what is logged or kept, where the (verified) data lives, or how many CPU threads work on it,
# never the trajectory: a resumed run may change them. A moved corpus is checked by the data iterator, which refuses
# a different one. (Another thread count can change the order of float sums, so bit-for-bit resume holds for equal
# thread counts.)
RESUME_FREE_KEYS = (
    "train.progress",
    "train.log_every",
    "train.val_every",
    "train.val_batches",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.num_threads",
    "train.divergence_factor",
    "data.path",
    "data.cache_dir",
    "data.tokenizer_file",  # the tokenizer itself is saved in the run; where its source file lives does not matter
)
# keys that do change the trajectory but nothing a checkpoint holds (the schedule, clipping, the length), so a resumed
# run may change them: the remedy for a run that diverged, or more steps for a finished one (never fewer than it has
# trained, which the resume refuses). The run's config.toml records the new values.
RESUME_REMEDY_KEYS = (
    "train.steps",
    "train.lr",
    "train.lr_start",
    "train.lr_final",
    "train.warmup_steps",
    "train.decay_steps",
    "train.grad_clip",
    "train.amp",  # a run begun in bf16 may continue where bf16 is slow, or a diverging fp16 run in bf16
)
EVAL_KEYS = ("eval.", "data.path", "data.cache_dir")
AGENT_SECTIONS = frozenset(
    {"env", "core"}
)  # the tables only an agent run's config has  # what `evaluate` may override in a trained run


def log_stderr(message: str) -> None:
    """Notes for the user of a command whose stdout is its result (scores, generated text)."""
    print(message, file=sys.stderr)


# ---------------------------------------------------------------------------------------------------------------
# configs


def config_from_text(text: str, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    return RunConfig.from_raw(apply_run_overrides(tomllib.loads(text), overrides))


def build_config(
    path: str | Path | None, overrides: list[str] | tuple[str, ...] = (), log: Log | None = log_stderr
) -> RunConfig:
    """A config file plus overrides; no file means the built-in tiny config. A ``data.path`` whose format nobody
    named (not the file, not an override; the tiny config's pydoc topics are its default, not a choice) is read
    as ``text``, said through ``log``; the run's config.toml records it."""
    raw = load_toml(path) if path is not None else tomllib.loads(TINY_TOML)
    tables = apply_run_overrides(raw, overrides)
    given = {tuple(parse_override(o)[0]) for o in overrides}
    data = tables.get("data")
    if path is None and ("data", "path") in given and ("data", "format") not in given and isinstance(data, dict):
        data.pop("format", None)
    if isinstance(data, dict) and data.get("path") and "format" not in data and log is not None:
        log(
            f"note: data.format is not set, so data.path {data['path']!r} is read as '{PATH_FORMAT}' (a folder of "
            ".txt files or one text file); set data.format to read it as another format"
        )
    return RunConfig.from_raw(tables)


def flat(cfg: RunConfig) -> dict[str, Any]:
    """Every key of the config by its dotted name (``model.compression.rate``), as overrides write them."""
    return flatten(to_dict(cfg))


def config_difference(old: RunConfig, new: RunConfig, *, ignore: tuple[str, ...] = ()) -> str | None:
    """The first dotted key whose value differs, with both values (None when they agree). ``ignore`` holds keys
    or prefixes such as ``"eval."``."""
    a, b = flat(old), flat(new)
    for key in a:
        if not key.startswith(ignore) and a[key] != b[key]:
            return f"{key}: {a[key]!r} in the run, {b[key]!r} now"
    return None


def resolve(cfg: RunConfig, vocab_size: int) -> RunConfig:
    """What a run records: the model's vocabulary is the tokenizer's, and data paths are absolute so the run
    can be evaluated or resumed from any working directory."""
    absolute = lambda p: str(Path(p).expanduser().resolve()) if p else p  # noqa: E731
    data = dataclasses.replace(
        cfg.data,
        path=absolute(data_root_path(cfg.data.path)),
        cache_dir=absolute(cfg.data.cache_dir),
        tokenizer_file=absolute(cfg.data.tokenizer_file),
    )
    train = dataclasses.replace(cfg.train, init_from=absolute(cfg.train.init_from))
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab_size), data=data, train=train)


def check_vocabulary(cfg: RunConfig, tokenizer: Any, log: Log) -> None:
    """The model's vocabulary is its tokenizer's (:func:`resolve` records it). The byte tokenizer's is always 256,
    so another ``model.vocab_size`` is a mistake; a learned tokenizer's size is known only once it is built, so a
    configured size it does not reach is said, not refused."""
    want, have = cfg.model.vocab_size, tokenizer.vocab_size
    if want == have or cfg.model.input_dim > 0:
        return
    if tokenizer.kind == "bytes":
        raise ConfigError(
            f"model.vocab_size: {want}, but the byte tokenizer has exactly {have} tokens; set {have} or drop the "
            "override (data.tokenizer = 'bpe' with data.vocab_size = N learns a vocabulary of another size)"
        )
    log(
        f"note: model.vocab_size = {want} is replaced by {have}, the size of the {tokenizer.kind} tokenizer built "
        "from the training data (a model's vocabulary is its tokenizer's)"
    )


def read_run_tables(run_dir: str | Path) -> dict[str, Any]:
    """The tables of a text or audio run's ``config.toml``, as written (one line when ``run_dir`` is no such run)."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(
            f"{run_dir}: not a run directory (no {CONFIG_FILE}); train one with `compressive-transformer train`"
        )
    raw = load_toml(inside(run_dir, path))
    if AGENT_SECTIONS & set(raw):
        raise ConfigError(
            f"{run_dir}: is an agent run (written by `rl train`; its model reads continuous observations), not a "
            f"text or audio run; evaluate it with `rl evaluate {run_dir}`, continue it with "
            f"`rl train --resume --run-dir {run_dir}`"
        )
    return raw


def read_run_config(run_dir: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """A run's config with ``overrides`` laid over it."""
    return RunConfig.from_raw(apply_run_overrides(read_run_tables(run_dir), overrides))


# ---------------------------------------------------------------------------------------------------------------
# run directories


def fresh_run_dir(prefix: str, root: str | Path = "runs") -> Path:
    """``runs/<prefix>-YYYYmmdd-HHMMSS`` (with a counter if that exists already): never an existing run."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(root) / f"{prefix}-{stamp}"
    n = 2
    while path.exists():
        path = Path(root) / f"{prefix}-{stamp}-{n}"
        n += 1
    return path


def require_empty(run_dir: Path, remedy: str = "pass --resume to continue it, or choose another --run-dir") -> None:
    """A new run needs a missing or empty directory (a lock file left by a run killed while it was being set up, and
    the token cache ``data prepare`` builds, do not count), or one that holds only a run stopped before its first checkpoint (:func:`never_checkpointed`).
    ``remedy``: what the command that refuses it offers instead."""
    if run_dir.exists() and not never_checkpointed(run_dir):
        if not run_dir.is_dir() or any(p.name not in PREPARED_ENTRIES for p in run_dir.iterdir()):
            raise ConfigError(f"{run_dir}: already holds a run or other files; {remedy}")


# what may be in a directory a new run starts in: a lock left by a start that was killed, what `data prepare` made
PREPARED_ENTRIES = frozenset({LOCK_FILE, ".cache"})
# what a run writes into its directory (eval_*.json only once it has a checkpoint)
RUN_ENTRIES = frozenset(
    {CONFIG_FILE, TOKENIZER_DIR, CHECKPOINTS, METRICS_FILE, "tensorboard", LOCK_FILE, ".cache", "init_from.json"}
)


def never_checkpointed(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run that stopped before its first checkpoint (out of memory, Ctrl-C, a kill) and
    nothing else: there is nothing to continue, so a new run may take its place (as the out-of-memory advice says)."""
    if not (run_dir.is_dir() and (run_dir / CONFIG_FILE).is_file()) or list_checkpoints(run_dir):
        return False
    return all(p.name in RUN_ENTRIES for p in run_dir.iterdir())


def claim_run_dir(run_dir: Path, log: Log) -> None:
    """Make ``run_dir`` (held under its lock) ready for a new run: empty, or emptied of a run that never wrote a
    checkpoint (its token cache and lock stay)."""
    if not never_checkpointed(run_dir):
        require_empty(run_dir)
        return
    log(f"note: {run_dir} held a run stopped before its first checkpoint; starting it again with this config")
    for child in run_dir.iterdir():
        if child.name not in (LOCK_FILE, ".cache"):
            remove(child, base=run_dir)  # a link is removed itself, never what it points to


def cache_dir(cfg: RunConfig, run_dir: Path) -> Path:
    return Path(cfg.data.cache_dir) if cfg.data.cache_dir else run_dir / ".cache"


def open_run(run_dir: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> tuple[RunConfig, Any]:
    """Config and tokenizer of a trained run (after checking that nothing in it is a link out of it: what is read
    from a run is the run's own)."""
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir, overrides)
    check_links(run_dir)
    if not (run_dir / TOKENIZER_DIR).exists():
        raise ConfigError(f"{run_dir}: has no {TOKENIZER_DIR}/; it is not a complete run directory")
    return cfg, load_tokenizer(run_dir / TOKENIZER_DIR)


def load_model(
    run_dir: str | Path,
    cfg: RunConfig,
    checkpoint: str | Path | None = None,
    *,
    device: str | None = None,
    threads: int | None = None,
    log: Log | None = log_stderr,
) -> MemoryModel:
    """The run's model with the weights of ``checkpoint`` (default: its newest checkpoint that verifies; newer ones
    that do not are reported through ``log``), on ``device`` (default ``auto``: CUDA where this machine has it, else
    CPU; where the run was trained does not matter) with ``threads`` CPU threads (default: ``train.num_threads``)."""
    return load_model_from(run_dir, cfg, checkpoint, device=device, threads=threads, log=log)[0]


def load_model_from(
    run_dir: str | Path,
    cfg: RunConfig,
    checkpoint: str | Path | None = None,
    *,
    device: str | None = None,
    threads: int | None = None,
    log: Log | None = log_stderr,
) -> tuple[MemoryModel, Path]:
    """:func:`load_model` and the checkpoint it loaded."""
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads: must be >= 1, got {threads}")
    target = resolve_device(device or "auto", key="--device")
    set_threads(threads if threads is not None else cfg.train.num_threads, log if target.type == "cpu" else None)
    check_model_size(cfg.model, device=target, key=f"{Path(run_dir) / CONFIG_FILE}: model")
    model = build_model(cfg.model).to(target)
    path = load_newest_weights(run_dir, model, checkpoint, log)
    model.eval()
    return model, path
