"""What a training call does to its run directory, decided before anything is written.

A new run: its config checked against an empty directory, the device, its corpus and its ``--init-from`` source, and
resolved against the tokenizer it will save. A resumed run: its own config, read once, with the overrides a resumed
run may take, checked against the config given and the newest checkpoint's. The trainer receives the
:class:`TrainingPlan`; nothing below it reads the run's config again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compressive_transformer.core.config import ConfigError, Log, RunConfig, apply_run_overrides, parse_override
from compressive_transformer.core.fileio import remove, write_text_atomic
from compressive_transformer.core.modality import TEXT, binary_reason, require_modality, run_modality
from compressive_transformer.core.registry import corpus_format
from compressive_transformer.data import load_tokenizer
from compressive_transformer.data.cache import cache_dir_for, cached_tokenizer
from compressive_transformer.data.readers import empty_split, source_files
from compressive_transformer.runs.budget import TRAINING_BYTES, check_fits, check_model_size
from compressive_transformer.runs.checkpoint import RESUME_FILES, CheckpointError, newest_good_checkpoint
from compressive_transformer.runs.init_from import load_source
from compressive_transformer.runs.machine import resolve_device
from compressive_transformer.runs.rundir import (
    CONFIG_FILE,
    PREPARED_ENTRIES,
    RESUME_FREE_KEYS,
    RESUME_REMEDY_KEYS,
    TOKENIZER_DIR,
    check_vocabulary,
    config_difference,
    flat,
    open_run,
    read_run_config,
    read_run_tables,
    require_empty,
    resolve,
)
from compressive_transformer.runs.toml_writer import config_text

NOTE_FILES, NOTE_BYTES = 8, 1 << 20  # what note_binary reads of the train split: the start of its first files
_RESUME_IGNORED = RESUME_FREE_KEYS + RESUME_REMEDY_KEYS + ("eval.",)


@dataclass(frozen=True)
class TrainingPlan:
    """A run directory about to be trained: ``cfg`` resolved against ``tokenizer``; ``saved``: a resumed run's own
    config as it was (None for a new run); ``source``: the ``--init-from`` run or export (None without one)."""

    run_dir: Path
    cfg: RunConfig
    tokenizer: Any
    saved: RunConfig | None = None
    source: Any = None

    @property
    def resume(self) -> bool:
        return self.saved is not None


def plan_new_run(cfg: RunConfig | None, run_dir: Path, *, world_size: int, log: Log) -> TrainingPlan:
    """Everything a new run can fail on before anything is written: the config, an empty run directory, the model
    fitting the device, a readable corpus, the --init-from source."""
    if cfg is None:
        raise ConfigError("train: no config given")
    require_empty(run_dir)
    check_model_size(cfg.model, device=resolve_device(cfg.train.device), bytes_per_parameter=TRAINING_BYTES)
    check_fits(
        cfg.model,
        batch_size=max(cfg.train.batch_size // world_size, 1),
        seg_len=cfg.model.seg_len,
        mem_len=cfg.model.memory.mem_len,
        cmem_len=cfg.model.memory.cmem_len,
        device=resolve_device(cfg.train.device),
    )
    check_train_split(cfg.data)  # a missing or empty corpus stops here, before any write
    note_binary(cfg, log)
    source = load_source(cfg.train.init_from) if cfg.train.init_from else None
    if source is not None:
        require_modality(
            run_modality(cfg), source.modality, "--init-from", "start from a run of the modality this config trains on"
        )
    if source is not None:
        tokenizer = source_tokenizer(cfg, source)
    else:  # trained on a sample of the train stream, kept in the cache (where `data prepare` may have left it)
        tokenizer = cached_tokenizer(cfg.data, cache_dir_for(cfg.data, run_dir))
    check_vocabulary(cfg, tokenizer, log)
    return TrainingPlan(run_dir, resolve(cfg, tokenizer.vocab_size), tokenizer, source=source)


def check_train_split(cfg: Any) -> None:
    """The train split exists and is not certainly empty, told from its files without reading them."""
    source_files(cfg, "train")  # a missing corpus: one line
    why = empty_split(cfg, "train")
    if why is not None:
        raise ConfigError(f"data.path: the train split has no text ({why}); point data.path at a non-empty corpus")


def note_binary(cfg: RunConfig, log: Log) -> None:
    """Say, in one line, when a text run's train files are not text (``data.path`` naming a binary file): it trains
    on those bytes as they are, which is rarely what was meant (``evaluate --text`` refuses such a file). Told from
    the first MB of the first files, of a format read from the user's own files (one with no download source: a
    benchmark's may be an archive)."""
    if run_modality(cfg) != TEXT or corpus_format(cfg.data.format).sources:
        return
    for path in source_files(cfg.data, "train")[:NOTE_FILES]:
        try:
            with open(path, "rb") as f:
                reason = binary_reason(f.read(NOTE_BYTES))
        except OSError:
            return  # unreadable: reading the split says so
        if reason:
            log(
                f"note: data.path {cfg.data.path}: the train split is not text ({path}: {reason}); training on its "
                "bytes as they are (point data.path at text files if that is not what you meant)"
            )
            return


def plan_follower(run_dir: Path, cfg: RunConfig) -> TrainingPlan:
    """A new run as a process other than the main one sees it, once the main process has written it (torchrun)."""
    saved, tokenizer = open_run(run_dir)
    source = load_source(cfg.train.init_from) if cfg.train.init_from else None
    return TrainingPlan(run_dir, saved, tokenizer, source=source)


def source_tokenizer(cfg: RunConfig, source: Any) -> Any:
    """The tokenizer of an ``--init-from`` source: its ids are what the copied weights mean."""
    if source.tokenizer.kind != cfg.data.tokenizer:
        raise ConfigError(
            f"data.tokenizer: the --init-from source uses a {source.tokenizer.kind!r} tokenizer, whose ids its weights "
            f"read; set data.tokenizer = {source.tokenizer.kind!r}"
        )
    return source.tokenizer


def plan_resume(run_dir: Path, cfg: RunConfig | None, overrides: list[str] | tuple[str, ...]) -> TrainingPlan:
    """The config to resume with: the run's own (read once) with ``overrides``, which a given ``cfg`` must match key
    for key, as must the newest checkpoint's."""
    raw = read_run_tables(run_dir)  # one line when run_dir is not a run
    saved = RunConfig.from_raw(apply_run_overrides(raw, ()))
    tokenizer = load_tokenizer(run_dir / TOKENIZER_DIR)
    for text in overrides:  # resolve() puts the tokenizer's size in its place: an override of it would be lost
        parts, value = parse_override(text)
        if parts == ["model", "vocab_size"] and value != tokenizer.vocab_size:
            raise ConfigError(
                f"--resume: model.vocab_size = {value}, but this run's tokenizer has {tokenizer.vocab_size} ids and a "
                "run's vocabulary cannot change; drop the override (or start a new run)"
            )
    wanted = resolve(
        cfg if cfg is not None else RunConfig.from_raw(apply_run_overrides(raw, overrides)), tokenizer.vocab_size
    )
    diff = config_difference(saved, wanted, ignore=_RESUME_IGNORED)
    if diff:
        raise ConfigError(
            f"--resume: the config differs from the run's ({diff}); resume with the run's own config "
            f"(only {', '.join(RESUME_REMEDY_KEYS)} and keys that change logging may change)"
        )
    ckpt = newest_good_checkpoint(run_dir, RESUME_FILES)  # the trainer reports the damaged ones it passes over
    if ckpt is not None:  # None: killed before its first checkpoint, the trainer starts again at step 0
        diff = config_difference(read_run_config(ckpt), saved, ignore=_RESUME_IGNORED)
        if diff:
            raise CheckpointError(
                f"checkpoint {ckpt} was written by another config ({diff}); it cannot be resumed here"
            )
    return TrainingPlan(run_dir, wanted, tokenizer, saved=saved)


def check_length(plan: TrainingPlan, step: int) -> None:
    """A resumed run may be given more steps (to train further), never fewer than it has trained."""
    steps = plan.cfg.train.steps
    if steps != plan.saved.train.steps and steps < step:
        raise ConfigError(
            f"--set train.steps={steps}: this run has already trained {step} steps; give more than {step} "
            "to train it further"
        )


def record_resume_changes(plan: TrainingPlan, log: Log) -> None:
    """Write the resumed config into the run (atomically), so the next plain ``--resume`` keeps the new values;
    report the keys that change the trajectory."""
    old_flat, new_flat = flat(resolve(plan.saved, plan.cfg.model.vocab_size)), flat(plan.cfg)
    changed = [k for k in new_flat if not k.startswith("eval.") and old_flat.get(k) != new_flat[k]]
    if not changed:
        return
    for key in changed:
        if key in RESUME_REMEDY_KEYS:
            log(f"resuming with {key} = {new_flat[key]!r} (was {old_flat.get(key)!r})")
    write_text_atomic(plan.run_dir / CONFIG_FILE, config_text(plan.cfg))


def write_new_run(plan: TrainingPlan) -> None:
    """The tokenizer and, last, the config of a new run: the config's presence marks a run ``--resume`` accepts."""
    plan.tokenizer.save(plan.run_dir / TOKENIZER_DIR)
    write_text_atomic(plan.run_dir / CONFIG_FILE, config_text(plan.cfg))


def undo_new_run(run_dir: Path, created: bool) -> None:
    """Remove what a failed start wrote: the directory if this start created it, else its contents (it was empty,
    or held only a token cache, which stays: it is valid or rebuilt)."""
    if created:
        remove(run_dir, base=run_dir.parent)
    elif run_dir.is_dir():
        for child in run_dir.iterdir():
            if child.name not in PREPARED_ENTRIES:
                remove(child, base=run_dir)  # a link is removed itself, never what it points to


__all__ = [
    "TrainingPlan",
    "check_length",
    "plan_follower",
    "plan_new_run",
    "plan_resume",
    "record_resume_changes",
    "source_tokenizer",
    "undo_new_run",
    "write_new_run",
]
