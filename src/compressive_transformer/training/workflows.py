"""Training a run directory, as a plain function (no argparse): start a run or resume one.

Training holds the run's lock throughout, so a second ``train``/``--resume`` of the same run stops in one line.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from compressive_transformer.core.config import ConfigError, RunConfig, parse_override
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.core.modality import require_modality, run_modality
from compressive_transformer.data import build_tokenizer, load_corpus, load_tokenizer, read_documents
from compressive_transformer.runs.budget import check_fits
from compressive_transformer.runs.checkpoint import RESUME_FILES, CheckpointError, newest_good_checkpoint
from compressive_transformer.runs.failures import (
    TRAINING_REMEDY,
    sizes_to_lower,
    training_sizes,
)
from compressive_transformer.runs.init_from import load_source
from compressive_transformer.runs.machine import resolve_device
from compressive_transformer.runs.rundir import (
    CONFIG_FILE,
    RESUME_FREE_KEYS,
    RESUME_REMEDY_KEYS,
    TOKENIZER_DIR,
    Log,
    cache_dir,
    check_vocabulary,
    claim_run_dir,
    config_difference,
    flat,
    open_run,
    read_run_config,
    require_empty,
    resolve,
)
from compressive_transformer.runs.runlock import RunLock
from compressive_transformer.runs.toml_writer import config_text
from compressive_transformer.training.distributed import DistInfo, barrier, init_distributed, local_device
from compressive_transformer.training.schedule import learning_rate
from compressive_transformer.training.trainer import Trainer, TrainSummary


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
    lock = RunLock(run_dir)
    try:
        return _train_locked(cfg, run_dir, info, lock, resume=resume, overrides=overrides, max_steps=max_steps, log=log)
    finally:
        lock.release()


def _train_locked(
    cfg: RunConfig | None,
    run_dir: Path,
    info: DistInfo,
    lock: RunLock,
    *,
    resume: bool,
    overrides: list[str] | tuple[str, ...],
    max_steps: int | None,
    log: Log,
) -> TrainSummary:
    source = None  # the --init-from run or export (not on resume)
    if resume:
        saved = read_run_config(run_dir)  # one line when run_dir is not a run
        if info.is_main:
            lock.acquire()
        cfg, tokenizer = _resume_config(cfg, run_dir, overrides)
    elif not info.is_main:  # the main process prepared the run (tokenizer, config, caches); read what it wrote
        barrier(info)
        cfg, tokenizer = open_run(run_dir)
    else:
        cfg, tokenizer, source = _check_new_run(cfg, run_dir, info, log)
    created = not run_dir.exists()
    if not resume and info.is_main:  # hold the run before writing into it; a racing second `train` stops here
        run_dir.mkdir(parents=True, exist_ok=True)
        lock.acquire()
        claim_run_dir(run_dir, log)
    try:
        caches = cache_dir(cfg, run_dir)
        train_corpus = load_corpus(cfg.data, "train", tokenizer, caches)
        if train_corpus.num_tokens < 2:
            raise ConfigError(
                f"data.path: the train split of {cfg.data.path or cfg.data.format} has no text to learn from; point data.path at a non-empty corpus"
            )
        val_corpus = _optional_corpus(cfg, "validation", tokenizer, caches, log)
        if not resume and info.is_main:
            tokenizer.save(run_dir / TOKENIZER_DIR)
            write_text_atomic(
                run_dir / CONFIG_FILE, config_text(cfg)
            )  # last: its presence marks a run that --resume accepts
            barrier(info)  # the other processes may read the run now
        if not resume and cfg.train.init_from and not info.is_main:
            source = load_source(cfg.train.init_from)
        with sizes_to_lower("training", training_sizes(cfg), TRAINING_REMEDY):
            trainer = Trainer(
                cfg,
                train_corpus=train_corpus,
                val_corpus=val_corpus,
                run_dir=run_dir,
                log=log,
                init_source=source.model if not resume and cfg.train.init_from else None,
            )
    except BaseException:
        if not resume and info.is_main:  # leave no half-made run behind; the directory was empty or missing before
            _undo_new_run(run_dir, created)
        raise
    if resume:
        step = trainer.resume()
        _check_length(cfg, saved, step)
        if info.is_main:
            _record_resume_changes(run_dir, saved, cfg, log)
            log(f"resuming {run_dir} at step {step} of {cfg.train.steps}")
            if cfg.train.steps != saved.train.steps and not cfg.train.decay_steps:
                log(
                    f"the learning rate follows the {cfg.train.steps}-step schedule: {learning_rate(cfg.train, step):.2e} now"
                )
    n_params = sum(p.numel() for p in trainer.model.parameters())
    if info.is_main:
        procs = f", {info.world_size} processes" if info.active else ""
        log(
            f"run {run_dir}: {n_params:,} parameters, {train_corpus.num_tokens:,} training tokens, device {trainer.device}{procs}"
        )
    with sizes_to_lower("training", training_sizes(cfg), TRAINING_REMEDY):
        return trainer.train(max_steps=max_steps)


def _check_new_run(cfg: RunConfig | None, run_dir: Path, info: DistInfo, log: Log) -> tuple[RunConfig, Any, Any]:
    """Everything a new run can fail on before anything is written: the config, an empty run directory, the model
    fitting the device, a readable corpus, the --init-from source. Returns the config resolved against the
    tokenizer, the tokenizer, and the source (None without --init-from)."""
    if cfg is None:
        raise ConfigError("train: no config given")
    require_empty(run_dir)
    check_fits(
        cfg.model,
        batch_size=max(cfg.train.batch_size // info.world_size, 1),
        seg_len=cfg.model.seg_len,
        mem_len=cfg.model.memory.mem_len,
        cmem_len=cfg.model.memory.cmem_len,
        device=resolve_device(cfg.train.device),
    )
    train_docs = read_documents(cfg.data, "train")  # a missing or empty corpus stops here, before any write
    source = load_source(cfg.train.init_from) if cfg.train.init_from else None
    if source is not None:
        require_modality(
            run_modality(cfg), source.modality, "--init-from", "start from a run of the modality this config trains on"
        )
    tokenizer = source_tokenizer(cfg, source) if source is not None else build_tokenizer(cfg.data, train_docs)
    check_vocabulary(cfg, tokenizer, log)
    return resolve(cfg, tokenizer.vocab_size), tokenizer, source


def _undo_new_run(run_dir: Path, created: bool) -> None:
    """Remove what a failed start wrote: the directory if this start created it, else its contents (it was empty)."""
    if created:
        shutil.rmtree(run_dir, ignore_errors=True)
    elif run_dir.is_dir():
        for child in run_dir.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()


def source_tokenizer(cfg: RunConfig, source: Any) -> Any:
    """The tokenizer of an ``--init-from`` source: its ids are what the copied weights mean."""
    if source.tokenizer.kind != cfg.data.tokenizer:
        raise ConfigError(
            f"data.tokenizer: the --init-from source uses a {source.tokenizer.kind!r} tokenizer, whose ids its weights "
            f"read; set data.tokenizer = {source.tokenizer.kind!r}"
        )
    return source.tokenizer


def _join_processes(cfg: RunConfig | None, run_dir: Path) -> DistInfo:
    """Under ``torchrun``, join the process group before anything touches the run directory."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return DistInfo()
    device_name = (cfg if cfg is not None else read_run_config(run_dir)).train.device
    return init_distributed(local_device(resolve_device(device_name)))


def _resume_config(
    cfg: RunConfig | None, run_dir: Path, overrides: list[str] | tuple[str, ...]
) -> tuple[RunConfig, Any]:
    """The config to resume with: the run's own, which a given config must match key for key, as must the
    newest checkpoint's."""
    saved = read_run_config(run_dir)
    tokenizer = load_tokenizer(run_dir / TOKENIZER_DIR)
    for text in overrides:  # resolve() puts the tokenizer's size in its place: an override of it would be lost
        parts, value = parse_override(text)
        if parts == ["model", "vocab_size"] and value != tokenizer.vocab_size:
            raise ConfigError(
                f"--resume: model.vocab_size = {value}, but this run's tokenizer has {tokenizer.vocab_size} ids and a "
                "run's vocabulary cannot change; drop the override (or start a new run)"
            )
    wanted = resolve(cfg if cfg is not None else read_run_config(run_dir, overrides), tokenizer.vocab_size)
    ignore = RESUME_FREE_KEYS + RESUME_REMEDY_KEYS + ("eval.",)
    diff = config_difference(saved, wanted, ignore=ignore)
    if diff:
        raise ConfigError(
            f"--resume: the config differs from the run's ({diff}); resume with the run's own config "
            f"(only {', '.join(RESUME_REMEDY_KEYS)} and keys that change logging may change)"
        )
    ckpt = newest_good_checkpoint(run_dir, RESUME_FILES)  # the trainer reports the damaged ones it passes over
    if ckpt is None:  # killed before its first checkpoint: the trainer starts again at step 0
        return wanted, tokenizer
    diff = config_difference(read_run_config(ckpt), saved, ignore=ignore)
    if diff:
        raise CheckpointError(f"checkpoint {ckpt} was written by another config ({diff}); it cannot be resumed here")
    return wanted, tokenizer


def _check_length(cfg: RunConfig, saved: RunConfig, step: int) -> None:
    """A resumed run may be given more steps (to train further), never fewer than it has trained."""
    if cfg.train.steps != saved.train.steps and cfg.train.steps < step:
        raise ConfigError(
            f"--set train.steps={cfg.train.steps}: this run has already trained {step} steps; give more than {step} "
            "to train it further"
        )


def _record_resume_changes(run_dir: Path, saved: RunConfig, new: RunConfig, log: Log) -> None:
    """Write the resumed config into the run (atomically), so the next plain ``--resume`` keeps the new values;
    report the keys that change the trajectory."""
    old_flat, new_flat = flat(resolve(saved, new.model.vocab_size)), flat(new)
    changed = [k for k in new_flat if not k.startswith("eval.") and old_flat.get(k) != new_flat[k]]
    if not changed:
        return
    for key in changed:
        if key in RESUME_REMEDY_KEYS:
            log(f"resuming with {key} = {new_flat[key]!r} (was {old_flat.get(key)!r})")
    write_text_atomic(run_dir / CONFIG_FILE, config_text(new))


def _optional_corpus(cfg: RunConfig, split: str, tokenizer: Any, caches: Path, log: Log) -> Any:
    try:
        return load_corpus(cfg.data, split, tokenizer, caches)
    except ConfigError as e:
        log(f"note: no {split} data ({e}); training without validation")
        return None
