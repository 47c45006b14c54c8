"""Training a run directory, as a plain function (no argparse): start a run or resume one.

The path from the command goes down once: the processes join (under ``torchrun``), the run's lock is taken, the
run directory is planned (:mod:`compressive_transformer.runs.setup`: the config read or checked once), the corpora
are loaded, and the :class:`~compressive_transformer.training.trainer.Trainer` builds the model once and trains it.
A second ``train``/``--resume`` of the same run stops in one line at the lock.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from compressive_transformer.core.config import ConfigError, RunConfig
from compressive_transformer.data import load_corpus
from compressive_transformer.data.cache import cached_tokenizer
from compressive_transformer.data.readers import empty_split
from compressive_transformer.runs.failures import TRAINING_REMEDY, sizes_to_lower, training_sizes
from compressive_transformer.runs.machine import resolve_device
from compressive_transformer.runs.rundir import Log, cache_dir, claim_run_dir
from compressive_transformer.runs.runlock import RunLock
from compressive_transformer.runs.setup import (
    TrainingPlan,
    check_length,
    plan_follower,
    plan_new_run,
    plan_resume,
    record_resume_changes,
    undo_new_run,
    write_new_run,
)
from compressive_transformer.training.distributed import (
    DistInfo,
    PeerStopped,
    barrier,
    init_distributed,
    local_device,
    shutdown,
)
from compressive_transformer.training.schedule import learning_rate, schedule_too_short
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
    ``overrides``); a ``cfg`` given as well must agree with it, so a checkpoint never meets another model. Under
    ``torchrun`` every process calls this; they leave the process group together when training ends.
    """
    run_dir = Path(run_dir)
    resumed = plan_resume(run_dir, cfg, overrides) if resume else None  # read-only: before the processes join
    _prepare_data_before_joining(resumed.cfg if resumed is not None else cfg, run_dir, resumed)
    info = _join_processes(resumed.cfg if resumed is not None else cfg)
    _check_rows(resumed.cfg if resumed is not None else cfg, info)
    lock = RunLock(run_dir)
    created = not run_dir.exists()
    try:
        plan = resumed or _plan_new(cfg, run_dir, info, log)
        if info.is_main:  # hold the run before writing into it; a racing second `train` stops here
            if not plan.resume:
                run_dir.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        trainer, tokens = _start(plan, info, log, created=created)
        if plan.resume:
            step = trainer.resume()
            check_length(plan, step)
            if info.is_main:
                record_resume_changes(plan, log)
                _say_resumed(plan, step, log)
        if info.is_main:
            procs = f", {info.world_size} processes" if info.active else ""
            n_params = sum(p.numel() for p in trainer.model.parameters())
            log(f"run {run_dir}: {n_params:,} parameters, {tokens:,} training tokens, device {trainer.device}{procs}")
        with sizes_to_lower("training", training_sizes(plan.cfg), TRAINING_REMEDY):
            summary = trainer.train(max_steps=max_steps)
    finally:
        lock.release()
    shutdown(info)
    return summary


def _check_rows(cfg: RunConfig | None, info: DistInfo) -> None:
    """The batch splits over the processes: every process reads the same config and finds the same fault, which the
    main one says (once, as before the processes joined)."""
    if cfg is None:
        return
    try:
        info.rows(cfg.train.batch_size)
    except ConfigError as e:
        if info.is_main:
            raise
        raise PeerStopped(str(e)) from None


def _plan_new(cfg: RunConfig | None, run_dir: Path, info: DistInfo, log: Log) -> TrainingPlan:
    """A new run's plan: checked by the main process; the others wait until it has written the run, then read it."""
    if info.is_main:
        return plan_new_run(cfg, run_dir, world_size=info.world_size, log=log)
    barrier(info)
    try:
        return plan_follower(run_dir, cfg)
    except ConfigError as e:  # the main process stopped after the barrier and undid the run: it says why
        raise PeerStopped(f"rank {info.rank}: the main process stopped ({e})") from None


def _start(plan: TrainingPlan, info: DistInfo, log: Log, *, created: bool) -> tuple[Trainer, int]:
    """Claim and write a new run (undone if anything fails before training starts: the directory if this start
    ``created`` it, else its contents), load its corpora and build the trainer, which builds the model; returns it
    and the number of training tokens."""
    new_main = not plan.resume and info.is_main
    if new_main:
        claim_run_dir(plan.run_dir, log)
    try:
        caches = cache_dir(plan.cfg, plan.run_dir)
        train_corpus = load_corpus(plan.cfg.data, "train", plan.tokenizer, caches)
        if train_corpus.num_tokens < 2:
            data = plan.cfg.data
            raise ConfigError(
                f"data.path: the train split of {data.path or data.format} has no text to learn from; point data.path at a non-empty corpus"
            )
        val_corpus = _optional_corpus(plan.cfg, "validation", plan.tokenizer, caches, log)
        if new_main and (why := empty_split(plan.cfg.data, "test")) is not None:
            log(
                f"note: the test split has no text ({why}); training goes on, but `evaluate --split test` will have nothing to score"
            )
        if new_main and (short := schedule_too_short(plan.cfg.train)) is not None:
            log(short)
        if new_main:
            write_new_run(plan)
            barrier(info)  # the other processes may read the run now
        with sizes_to_lower("training", training_sizes(plan.cfg), TRAINING_REMEDY):
            trainer = Trainer(
                plan.cfg,
                train_corpus=train_corpus,
                val_corpus=val_corpus,
                run_dir=plan.run_dir,
                log=log,
                init_source=plan.source.model if plan.source is not None else None,
            )
        return trainer, train_corpus.num_tokens
    except BaseException:
        if new_main:  # leave no half-made run behind; the directory was empty or missing before
            undo_new_run(plan.run_dir, created)
        raise


def _say_resumed(plan: TrainingPlan, step: int, log: Log) -> None:
    cfg = plan.cfg
    log(f"resuming {plan.run_dir} at step {step} of {cfg.train.steps}")
    if cfg.train.steps != plan.saved.train.steps and not cfg.train.decay_steps:
        log(f"the learning rate follows the {cfg.train.steps}-step schedule: {learning_rate(cfg.train, step):.2e} now")


def _prepare_data_before_joining(cfg: RunConfig | None, run_dir: Path, resumed: TrainingPlan | None) -> None:
    """Under ``torchrun``, every process makes sure of the tokenizer and the token cache before the processes join:
    the first to take a cache directory's lock trains and builds, the others wait on the lock (not in a collective,
    whose timeout a build of hours would pass) and then map what it built; with one cache directory per node, one
    process per node builds. A single process does the same later, in its plan."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or cfg is None or (resumed is None and cfg.train.init_from):
        return  # (a run started --init-from uses its source's tokenizer: prepared in the plan)
    caches = cache_dir(cfg, run_dir)
    tokenizer = resumed.tokenizer if resumed is not None else cached_tokenizer(cfg.data, caches)
    load_corpus(cfg.data, "train", tokenizer, caches)
    try:
        load_corpus(cfg.data, "validation", tokenizer, caches)
    except ConfigError:
        pass  # a run without validation data: said by the main process once it plans


def _join_processes(cfg: RunConfig | None) -> DistInfo:
    """Under ``torchrun``, join the process group before anything is written (without a config there is nothing
    to train: each process stops at the plan)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or cfg is None:
        return DistInfo()
    return init_distributed(local_device(resolve_device(cfg.train.device)))


def _optional_corpus(cfg: RunConfig, split: str, tokenizer: Any, caches: Path, log: Log) -> Any:
    try:
        return load_corpus(cfg.data, split, tokenizer, caches)
    except ConfigError as e:
        log(f"note: no {split} data ({e}); training without validation")
        return None


__all__ = ["train_run"]
