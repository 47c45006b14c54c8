"""Run directories: what the CLI subcommands do, as plain functions (no argparse).

A run directory holds ``config.toml`` (the resolved config), ``tokenizer/``, ``checkpoints/``, ``metrics.jsonl`` and
``eval_<split>.json``. A new run never writes into a directory that already holds something; a resumed run must
have been written by the same config (keys that only change logging may differ).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from compressive_transformer.checkpoint import CheckpointError, latest_checkpoint, load_weights
from compressive_transformer.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    load_toml,
    to_dict,
    tomllib,
)
from compressive_transformer.data import build_tokenizer, load_corpus, load_tokenizer, read_documents
from compressive_transformer.distributed import DistInfo, barrier, init_distributed, local_device
from compressive_transformer.evaluate import EvalResult, evaluate
from compressive_transformer.generate import generate
from compressive_transformer.models import CompressiveTransformerLM, TransformerQL, build_model
from compressive_transformer.precision import amp_dtype, inference_amp
from compressive_transformer.presets import DEMO_TOML, TINY_TOML
from compressive_transformer.toml_writer import config_text
from compressive_transformer.train import Trainer, TrainSummary, resolve_device, set_threads

CONFIG_FILE = "config.toml"
TOKENIZER_DIR = "tokenizer"
# keys that change what is logged or kept, where the (verified) data lives, or how many CPU threads work on it,
# never the trajectory: a resumed run may change them. A moved corpus is checked by the data iterator, which refuses
# a different one. (Another thread count can change the order of float sums, so bit-for-bit resume holds for equal
# thread counts.)
RESUME_FREE_KEYS = (
    "train.progress", "train.log_every", "train.val_every", "train.val_batches", "train.checkpoint_every",
    "train.keep_checkpoints", "train.num_threads", "data.path", "data.cache_dir",
)  # fmt: skip
EVAL_KEYS = ("eval.", "data.path", "data.cache_dir")  # what `evaluate` may override in a trained run

Log = Callable[[str], None]


# ---------------------------------------------------------------------------------------------------------------
# configs


def config_from_text(text: str, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    return RunConfig.from_raw(apply_overrides(tomllib.loads(text), overrides))


def build_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """A config file plus overrides; no file means the built-in tiny config."""
    raw = load_toml(path) if path is not None else tomllib.loads(TINY_TOML)
    return RunConfig.from_raw(apply_overrides(raw, overrides))


def flat(cfg: RunConfig) -> dict[str, Any]:
    return {f"{section}.{key}": value for section, table in to_dict(cfg).items() for key, value in table.items()}


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
    data = dataclasses.replace(cfg.data, path=absolute(cfg.data.path), cache_dir=absolute(cfg.data.cache_dir))
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab_size), data=data)


def read_run_config(run_dir: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{run_dir}: not a run directory (no {CONFIG_FILE}); train one with `compressive-transformer train`")
    return RunConfig.from_raw(apply_overrides(load_toml(path), overrides))


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


def _require_empty(run_dir: Path) -> None:
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ConfigError(
            f"{run_dir}: already holds a run or other files; pass --resume to continue it, or choose another --run-dir"
        )


def cache_dir(cfg: RunConfig, run_dir: Path) -> Path:
    return Path(cfg.data.cache_dir) if cfg.data.cache_dir else run_dir / ".cache"


def open_run(run_dir: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> tuple[RunConfig, Any]:
    """Config and tokenizer of a trained run."""
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir, overrides)
    if not (run_dir / TOKENIZER_DIR).exists():
        raise ConfigError(f"{run_dir}: has no {TOKENIZER_DIR}/; it is not a complete run directory")
    return cfg, load_tokenizer(run_dir / TOKENIZER_DIR)


def load_model(run_dir: str | Path, cfg: RunConfig, checkpoint: str | Path | None = None) -> CompressiveTransformerLM | TransformerQL:
    """The run's model with the weights of ``checkpoint`` (default: its newest checkpoint)."""
    path = Path(checkpoint) if checkpoint is not None else latest_checkpoint(run_dir)
    if path is None:
        raise CheckpointError(f"{run_dir}: has no checkpoint yet; train it first (or resume it with --resume)")
    set_threads(cfg.train.num_threads)
    device = resolve_device(cfg.train.device)
    model = build_model(cfg.model).to(device)
    load_weights(path, model)
    model.eval()
    return model


# ---------------------------------------------------------------------------------------------------------------
# subcommands


def train_run(
    cfg: RunConfig | None,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overrides: list[str] | tuple[str, ...] = (),
    max_steps: int | None = None,
    log: Log = print,
) -> TrainSummary:
    """Start (or with ``resume`` continue) the run in ``run_dir``.

    Starting needs ``cfg`` and an empty or missing directory. Resuming reads the run's own config (plus
    ``overrides``); a ``cfg`` given as well must agree with it, so a checkpoint never meets another model.
    """
    run_dir = Path(run_dir)
    info = _join_processes(cfg, run_dir)
    if resume:
        cfg, tokenizer = _resume_config(cfg, run_dir, overrides)
    elif not info.is_main:  # the main process prepared the run (tokenizer, config, caches); read what it wrote
        barrier(info)
        cfg, tokenizer = open_run(run_dir)
    else:
        if cfg is None:
            raise ConfigError("train: no config given")
        _require_empty(run_dir)
        train_docs = read_documents(cfg.data, "train")  # a missing or empty corpus stops here, before any write
        tokenizer = build_tokenizer(cfg.data, train_docs)
        cfg = resolve(cfg, tokenizer.vocab_size)
    created = not run_dir.exists()
    try:
        caches = cache_dir(cfg, run_dir)
        train_corpus = load_corpus(cfg.data, "train", tokenizer, caches)
        if train_corpus.num_tokens < 2:
            raise ConfigError(f"data.path: the train split of {cfg.data.path or cfg.data.format} has no text to learn from; point data.path at a non-empty corpus")
        val_corpus = _optional_corpus(cfg, "validation", tokenizer, caches, log)
        if not resume and info.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            tokenizer.save(run_dir / TOKENIZER_DIR)
            (run_dir / CONFIG_FILE).write_text(config_text(cfg), encoding="utf-8")
            barrier(info)  # the other processes may read the run now
        trainer = Trainer(cfg, train_corpus=train_corpus, val_corpus=val_corpus, run_dir=run_dir, log=log)
    except BaseException:
        if not resume and info.is_main:  # leave no half-made run behind; the directory was empty or missing before
            if created:
                shutil.rmtree(run_dir, ignore_errors=True)
            elif run_dir.is_dir():
                for child in run_dir.iterdir():
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise
    if resume:
        step = trainer.resume()
        if info.is_main:
            log(f"resuming {run_dir} at step {step} of {cfg.train.steps}")
    n_params = sum(p.numel() for p in trainer.model.parameters())
    if info.is_main:
        procs = f", {info.world_size} processes" if info.active else ""
        log(f"run {run_dir}: {n_params:,} parameters, {train_corpus.num_tokens:,} training tokens, device {trainer.device}{procs}")
    return trainer.train(max_steps=max_steps)


def _join_processes(cfg: RunConfig | None, run_dir: Path) -> DistInfo:
    """Under ``torchrun``, join the process group before anything touches the run directory."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return DistInfo()
    device_name = (cfg if cfg is not None else read_run_config(run_dir)).train.device
    return init_distributed(local_device(resolve_device(device_name)))


def _resume_config(cfg: RunConfig | None, run_dir: Path, overrides: list[str] | tuple[str, ...]) -> tuple[RunConfig, Any]:
    """The config to resume with: the run's own, which a given config must match key for key, as must the
    newest checkpoint's."""
    saved = read_run_config(run_dir)
    tokenizer = load_tokenizer(run_dir / TOKENIZER_DIR)
    wanted = resolve(cfg if cfg is not None else read_run_config(run_dir, overrides), tokenizer.vocab_size)
    ignore = RESUME_FREE_KEYS + ("eval.",)
    diff = config_difference(saved, wanted, ignore=ignore)
    if diff:
        raise ConfigError(f"--resume: the config differs from the run's ({diff}); resume with the run's own config")
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise CheckpointError(f"{run_dir}: no checkpoint to resume from; start the run again without --resume")
    diff = config_difference(read_run_config(ckpt), saved, ignore=ignore)
    if diff:
        raise CheckpointError(f"checkpoint {ckpt} was written by another config ({diff}); it cannot be resumed here")
    return wanted, tokenizer


def _optional_corpus(cfg: RunConfig, split: str, tokenizer: Any, caches: Path, log: Log) -> Any:
    try:
        return load_corpus(cfg.data, split, tokenizer, caches)
    except ConfigError as e:
        log(f"note: no {split} data ({e}); training without validation")
        return None


def evaluate_run(
    run_dir: str | Path,
    *,
    split: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    checkpoint: str | Path | None = None,
    progress: bool = True,
) -> EvalResult:
    """Stream a whole split through the run's newest model; write ``eval_<split>.json`` into the run."""
    bad = [o for o in overrides if not o.strip().startswith(EVAL_KEYS)]
    if bad:
        raise ConfigError(f"override {bad[0]!r}: only eval.*, data.path and data.cache_dir can change when evaluating a trained run")
    run_dir = Path(run_dir)
    cfg, tokenizer = open_run(run_dir, overrides)
    split = split or cfg.eval.split
    model = load_model(run_dir, cfg, checkpoint)
    corpus = load_corpus(cfg.data, split, tokenizer, cache_dir(cfg, run_dir))
    e = cfg.eval
    result = evaluate(
        model,
        corpus,
        split=split,
        batch_size=e.batch_size,
        seg_len=e.seg_len or cfg.model.seg_len,
        mem_len=e.mem_len,
        cmem_len=e.cmem_len,
        max_batches=e.max_batches,
        progress=progress,
        amp_dtype=amp_dtype(inference_amp(cfg, next(model.parameters()).device)),
    )
    record = result.to_dict() | {"checkpoint": str(checkpoint or latest_checkpoint(run_dir))}
    record = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in record.items()}
    (run_dir / f"eval_{split}.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return result


def generate_run(
    run_dir: str | Path,
    prompt: str,
    *,
    max_tokens: int = 200,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    compile: bool = False,
) -> str:
    """The continuation of ``prompt`` (text, without the prompt) sampled from the run's newest model."""
    cfg, tokenizer = open_run(run_dir)
    model = load_model(run_dir, cfg)
    ids = tokenizer.encode(prompt)
    if not ids:
        raise ConfigError("--prompt: is empty after tokenization; give some text to continue")
    amp = inference_amp(cfg, next(model.parameters()).device)
    out = generate(model, ids, max_new_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, compile=compile, amp=amp)
    return tokenizer.decode(out.tokens)


@dataclass
class DemoResult:
    run_dir: Path
    steps: int
    seconds: float
    validation: EvalResult
    sample: str


def demo(*, steps: int | None = None, run_dir: str | Path | None = None, log: Log = print, prompt: str = "The ") -> DemoResult:
    """Train the demo config on the pydoc topics, evaluate on validation, sample; never reuses a run directory."""
    overrides = [f"train.steps={steps}"] if steps is not None else []
    cfg = config_from_text(DEMO_TOML, overrides)
    if steps is not None and steps < cfg.train.warmup_steps * 2:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, warmup_steps=max(steps // 10, 0)))
    run_dir = Path(run_dir) if run_dir is not None else fresh_run_dir("demo")
    start = time.perf_counter()
    log(f"demo: training a {cfg.model.n_layers}-layer Compressive Transformer on the pydoc topics for {cfg.train.steps} steps")
    train_run(cfg, run_dir, log=log)
    log("demo: evaluating on the whole validation split (memory carried through)")
    result = evaluate_run(run_dir, split="validation")
    log(f"demo: {result.summary()}")
    sample = generate_run(run_dir, prompt, max_tokens=200, temperature=0.8, top_k=40, seed=0)
    return DemoResult(run_dir=run_dir, steps=cfg.train.steps, seconds=time.perf_counter() - start, validation=result, sample=prompt + sample)
