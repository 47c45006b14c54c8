"""Whole workflows over a run directory, as plain functions (no argparse): train (or resume) a run, evaluate it,
sample from it, and the demo that does all three.

Training holds the run's lock throughout, so a second ``train``/``--resume`` of the same run stops in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from compressive_transformer.core.config import ConfigError, RunConfig, parse_override
from compressive_transformer.core.dtypes import amp_dtype
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.core.modality import require_modality, run_modality
from compressive_transformer.core.registry import corpus_format
from compressive_transformer.data import build_tokenizer, load_corpus, load_tokenizer, read_documents
from compressive_transformer.data.baselines import ReferenceScores, reference_scores
from compressive_transformer.data.readers import empty_split
from compressive_transformer.runs.budget import TRAINING_BYTES, check_fits, check_model_size
from compressive_transformer.runs.checkpoint import RESUME_FILES, CheckpointError, newest_good_checkpoint
from compressive_transformer.runs.failures import (
    EVALUATION_REMEDY,
    TRAINING_REMEDY,
    evaluation_sizes,
    sizes_to_lower,
    training_sizes,
)
from compressive_transformer.runs.init_from import load_source
from compressive_transformer.runs.loading import Run, load_run
from compressive_transformer.runs.machine import resolve_device
from compressive_transformer.runs.precision import inference_amp
from compressive_transformer.runs.presets import DEMO_TOML
from compressive_transformer.runs.rundir import (
    CONFIG_FILE,
    EVAL_KEYS,
    RESUME_FREE_KEYS,
    RESUME_REMEDY_KEYS,
    TOKENIZER_DIR,
    Log,
    cache_dir,
    check_vocabulary,
    claim_run_dir,
    config_difference,
    config_from_text,
    flat,
    fresh_run_dir,
    load_model_from,
    log_stderr,
    open_run,
    read_run_config,
    require_empty,
    resolve,
)
from compressive_transformer.runs.runlock import RunLock
from compressive_transformer.runs.toml_writer import config_text
from compressive_transformer.training.distributed import DistInfo, barrier, init_distributed, local_device
from compressive_transformer.training.evaluate import EvalResult, evaluate, write_eval_record
from compressive_transformer.training.generate import SamplingConfig
from compressive_transformer.training.schedule import learning_rate
from compressive_transformer.training.text_eval import result_path, run_record
from compressive_transformer.training.textgen import generate_text
from compressive_transformer.training.trainer import Trainer, TrainSummary

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
        if not resume and info.is_main and (why := empty_split(cfg.data, "test")) is not None:
            log(
                f"note: the test split has no text ({why}); training goes on, but `evaluate --split test` will have nothing to score"
            )
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
    check_model_size(cfg.model, device=resolve_device(cfg.train.device), bytes_per_parameter=TRAINING_BYTES)
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
    check_model_size(wanted.model, device=resolve_device(wanted.train.device), bytes_per_parameter=TRAINING_BYTES)
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


@contextlib.contextmanager
def _writable_cache(preferred: Path) -> Iterator[Path]:
    """``preferred`` when the token cache can be written there (or is already there); else a temporary directory,
    removed afterwards (a read-only run is still evaluated, its split encoded afresh)."""
    try:
        preferred.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=preferred, prefix=".probe-"):
            pass
    except OSError:
        with tempfile.TemporaryDirectory(prefix="ct-eval-cache-", ignore_cleanup_errors=True) as tmp:
            yield Path(tmp)
        return
    yield preferred


def _optional_corpus(cfg: RunConfig, split: str, tokenizer: Any, caches: Path, log: Log) -> Any:
    try:
        return load_corpus(cfg.data, split, tokenizer, caches)
    except ConfigError as e:
        log(f"note: no {split} data ({e}); training without validation")
        return None


def split_result_path(
    run_dir: Path,
    *,
    split: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    out: str | Path | None = None,
) -> tuple[str, Path]:
    """The split :func:`evaluate_run` scores and the file it writes (``out``, else ``eval_<split>.json`` under a
    name no earlier result holds), after refusing overrides that evaluating a trained run would ignore."""
    bad = [o for o in overrides if not o.strip().startswith(EVAL_KEYS)]
    if bad:
        raise ConfigError(
            f"override {bad[0]!r}: only eval.*, data.path and data.cache_dir can change when evaluating a trained run"
        )
    saved = read_run_config(run_dir)
    if not corpus_format(saved.data.format).needs_path and any(o.strip().startswith("data.path") for o in overrides):
        raise ConfigError(
            f"--set data.path: a {saved.data.format} run reads no path; score your own text with `evaluate RUN --text FILE`"
        )
    if split is not None and any(o.strip().startswith("eval.split") for o in overrides):
        raise ConfigError("--set eval.split: --split is given too and wins; drop one of them")
    split = split or read_run_config(run_dir, overrides).eval.split
    return split, result_path(run_dir, split, out)


def evaluate_run(
    run_dir: str | Path,
    *,
    split: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    checkpoint: str | Path | None = None,
    progress: bool = True,
    out: str | Path | None = None,
    log: Log = log_stderr,
    device: str | None = None,
    threads: int | None = None,
) -> EvalResult:
    """Stream a whole split through the run's newest good model; write ``eval_<split>.json`` into the run under a
    name no earlier result holds (``eval_<split>-2.json`` ...), or to ``out``, which must not exist. Where that
    cannot be written it stops before computing anything."""
    run_dir = Path(run_dir)
    split, target = split_result_path(run_dir, split=split, overrides=overrides, out=out)
    cfg, tokenizer = open_run(run_dir, overrides)
    e = cfg.eval
    lengths = e.lengths(cfg.model)
    model, path = load_model_from(run_dir, cfg, checkpoint, device=device, threads=threads, log=log)
    check_fits(
        cfg.model,
        batch_size=e.batch_size,
        seg_len=lengths.seg_len,
        device=next(model.parameters()).device,
        mem_len=lengths.mem_len,
        cmem_len=lengths.cmem_len,
        key="eval.seg_len",
    )
    with _writable_cache(cache_dir(cfg, run_dir)) as caches:
        corpus = load_corpus(cfg.data, split, tokenizer, caches)
    with sizes_to_lower("evaluating", evaluation_sizes(cfg), EVALUATION_REMEDY):
        result = evaluate(
            model,
            corpus,
            split=split,
            batch_size=e.batch_size,
            seg_len=lengths.seg_len,
            mem_len=lengths.mem_len,
            cmem_len=lengths.cmem_len,
            max_batches=e.max_batches,
            progress=progress,
            amp_dtype=amp_dtype(inference_amp(cfg, next(model.parameters()).device)),
            unknown_id=getattr(tokenizer, "unk_id", None),
        )
    run = Run(config=cfg, tokenizer=tokenizer, model=model, run_dir=run_dir, checkpoint=path)
    source = {"kind": "split", "format": cfg.data.format, "path": cfg.data.path, "split": split}
    write_eval_record(target, run_record(run, result, source))
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
    device: str | None = None,
    log: Log = log_stderr,
    sampling: SamplingConfig | None = None,
) -> str:
    """The continuation of ``prompt`` (text, without the prompt) sampled from the run's newest good model
    (``sampling``, when given, replaces ``temperature``, ``top_k`` and ``top_p``)."""
    sampling = sampling or SamplingConfig(temperature, top_k, top_p)  # checked before the model loads
    run = load_run(run_dir, device=device, log=log)
    return generate_text(
        run,
        prompt,
        max_tokens=max_tokens,
        sampling=sampling,
        seed=seed,
        compile=compile,
    ).text


@dataclass
class DemoResult:
    run_dir: Path
    steps: int
    seconds: float
    validation: EvalResult
    sample: str
    references: ReferenceScores  # the validation text under simple references: what the score means


def demo(
    *, steps: int | None = None, run_dir: str | Path | None = None, log: Log = print, prompt: str = "The "
) -> DemoResult:
    """Train the demo config on the pydoc topics, evaluate on validation, sample; never reuses a run directory."""
    overrides = [f"train.steps={steps}"] if steps is not None else []
    cfg = config_from_text(DEMO_TOML, overrides)
    if steps is not None and steps < cfg.train.warmup_steps * 2:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, warmup_steps=max(steps // 10, 0)))
    run_dir = Path(run_dir) if run_dir is not None else fresh_run_dir("demo")
    require_empty(run_dir, "the demo always trains a new run: choose another --run-dir, or leave it out")
    start = time.perf_counter()
    log(
        f"demo: training a {cfg.model.n_layers}-layer Compressive Transformer on the pydoc topics for {cfg.train.steps} steps"
    )
    train_run(cfg, run_dir, log=log)
    log("demo: evaluating on the whole validation split (memory carried through)")
    result = evaluate_run(run_dir, split="validation")
    references = reference_scores(read_documents(cfg.data, "train"), read_documents(cfg.data, "validation"))
    sample = generate_run(run_dir, prompt, max_tokens=200, sampling=SamplingConfig(temperature=0.8, top_k=40), seed=0)
    return DemoResult(
        run_dir=run_dir,
        steps=cfg.train.steps,
        seconds=time.perf_counter() - start,
        validation=result,
        sample=prompt + sample,
        references=references,
    )
