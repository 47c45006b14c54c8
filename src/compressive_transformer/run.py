"""Run directories: what the CLI subcommands do, as plain functions (no argparse).

A run directory holds ``config.toml`` (the resolved config), ``tokenizer/``, ``checkpoints/``, ``metrics.jsonl``,
``eval_<split>.json`` and ``.lock``. A new run never writes into a directory that already holds something; a resumed
run must have been written by the same config (keys that only change logging may differ, and the optimisation keys
of :data:`RESUME_REMEDY_KEYS`, the remedy for a diverged run). Training holds the run's lock throughout, so a second
``train``/``--resume`` of the same run stops in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from compressive_transformer.budget import check_fits
from compressive_transformer.checkpoint import (
    RESUME_FILES,
    CheckpointError,
    load_newest_weights,
    newest_good_checkpoint,
)
from compressive_transformer.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    load_toml,
    to_dict,
    tomllib,
)
from compressive_transformer.data import build_tokenizer, load_corpus, load_tokenizer, read_documents
from compressive_transformer.data.readers import data_root_path
from compressive_transformer.distributed import DistInfo, barrier, init_distributed, local_device
from compressive_transformer.evaluate import EvalResult, evaluate, write_eval_record
from compressive_transformer.fileio import require_writable, write_text_atomic
from compressive_transformer.init_from import load_source
from compressive_transformer.models import MemoryModel, build_model
from compressive_transformer.precision import amp_dtype, inference_amp
from compressive_transformer.presets import DEMO_TOML, TINY_TOML
from compressive_transformer.registry import corpus_format
from compressive_transformer.runlock import LOCK_FILE, RunLock
from compressive_transformer.toml_writer import config_text
from compressive_transformer.train import Trainer, TrainSummary, resolve_device, set_threads

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
# keys that do change the trajectory but nothing a checkpoint holds (the schedule, clipping), so a resumed run may
# change them: the remedy for a run that diverged. The run's config.toml records the new values.
RESUME_REMEDY_KEYS = (
    "train.lr",
    "train.lr_start",
    "train.lr_final",
    "train.warmup_steps",
    "train.decay_steps",
    "train.grad_clip",
    "train.amp",  # a run begun in bf16 may continue where bf16 is slow, or a diverging fp16 run in bf16
)
EVAL_KEYS = ("eval.", "data.path", "data.cache_dir")  # what `evaluate` may override in a trained run

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


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
    data = dataclasses.replace(
        cfg.data,
        path=absolute(data_root_path(cfg.data.path)),
        cache_dir=absolute(cfg.data.cache_dir),
        tokenizer_file=absolute(cfg.data.tokenizer_file),
    )
    train = dataclasses.replace(cfg.train, init_from=absolute(cfg.train.init_from))
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab_size), data=data, train=train)


def read_run_config(run_dir: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(
            f"{run_dir}: not a run directory (no {CONFIG_FILE}); train one with `compressive-transformer train`"
        )
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
    """A new run needs a missing or empty directory (a lock file left by a run killed while it was being set up
    does not count)."""
    if run_dir.exists() and (not run_dir.is_dir() or any(p.name != LOCK_FILE for p in run_dir.iterdir())):
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


def load_model(
    run_dir: str | Path,
    cfg: RunConfig,
    checkpoint: str | Path | None = None,
    *,
    device: str | None = None,
    threads: int | None = None,
    log: Log | None = _stderr,
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
    log: Log | None = _stderr,
) -> tuple[MemoryModel, Path]:
    """:func:`load_model` and the checkpoint it loaded."""
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads: must be >= 1, got {threads}")
    target = resolve_device(device or "auto", key="--device")
    set_threads(threads if threads is not None else cfg.train.num_threads, log if target.type == "cpu" else None)
    model = build_model(cfg.model).to(target)
    path = load_newest_weights(run_dir, model, checkpoint, log)
    model.eval()
    return model, path


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
        if cfg is None:
            raise ConfigError("train: no config given")
        _require_empty(run_dir)
        check_fits(
            cfg.model,
            batch_size=max(cfg.train.batch_size // info.world_size, 1),
            seg_len=cfg.model.seg_len,
            mem_len=cfg.model.mem_len,
            cmem_len=cfg.model.cmem_len,
            device=resolve_device(cfg.train.device),
        )
        train_docs = read_documents(cfg.data, "train")  # a missing or empty corpus stops here, before any write
        source = load_source(cfg.train.init_from) if cfg.train.init_from else None
        tokenizer = source_tokenizer(cfg, source) if source is not None else build_tokenizer(cfg.data, train_docs)
        cfg = resolve(cfg, tokenizer.vocab_size)
    created = not run_dir.exists()
    if not resume and info.is_main:  # hold the run before writing into it; a racing second `train` stops here
        run_dir.mkdir(parents=True, exist_ok=True)
        lock.acquire()
        _require_empty(run_dir)
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
            if created:
                shutil.rmtree(run_dir, ignore_errors=True)
            elif run_dir.is_dir():
                for child in run_dir.iterdir():
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise
    if resume:
        step = trainer.resume()
        if info.is_main:
            _record_resume_changes(run_dir, saved, cfg, log)
            log(f"resuming {run_dir} at step {step} of {cfg.train.steps}")
    n_params = sum(p.numel() for p in trainer.model.parameters())
    if info.is_main:
        procs = f", {info.world_size} processes" if info.active else ""
        log(
            f"run {run_dir}: {n_params:,} parameters, {train_corpus.num_tokens:,} training tokens, device {trainer.device}{procs}"
        )
    return trainer.train(max_steps=max_steps)


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


def evaluate_run(
    run_dir: str | Path,
    *,
    split: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    checkpoint: str | Path | None = None,
    progress: bool = True,
    out: str | Path | None = None,
    log: Log = _stderr,
    device: str | None = None,
    threads: int | None = None,
) -> EvalResult:
    """Stream a whole split through the run's newest good model; write ``eval_<split>.json`` into the run (or to
    ``out``). Where that cannot be written it stops before computing anything."""
    bad = [o for o in overrides if not o.strip().startswith(EVAL_KEYS)]
    if bad:
        raise ConfigError(
            f"override {bad[0]!r}: only eval.*, data.path and data.cache_dir can change when evaluating a trained run"
        )
    run_dir = Path(run_dir)
    cfg, tokenizer = open_run(run_dir, overrides)
    if not corpus_format(cfg.data.format).needs_path and any(o.strip().startswith("data.path") for o in overrides):
        raise ConfigError(
            f"--set data.path: a {cfg.data.format} run reads no path; score your own text with `evaluate RUN --text FILE`"
        )
    if split is not None and any(o.strip().startswith("eval.split") for o in overrides):
        raise ConfigError("--set eval.split: --split is given too and wins; drop one of them")
    split = split or cfg.eval.split
    target = Path(out) if out is not None else run_dir / f"eval_{split}.json"
    require_writable(target)
    e = cfg.eval
    model, path = load_model_from(run_dir, cfg, checkpoint, device=device, threads=threads, log=log)
    check_fits(
        cfg.model,
        batch_size=e.batch_size,
        seg_len=e.seg_len or cfg.model.seg_len,
        device=next(model.parameters()).device,
        mem_len=cfg.model.mem_len if e.mem_len is None else e.mem_len,
        cmem_len=cfg.model.cmem_len if e.cmem_len is None else e.cmem_len,
        key="eval.seg_len",
    )
    with _writable_cache(cache_dir(cfg, run_dir)) as caches:
        corpus = load_corpus(cfg.data, split, tokenizer, caches)
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
    from compressive_transformer.loading import Run
    from compressive_transformer.text_eval import run_record

    run = Run(config=cfg, tokenizer=tokenizer, model=model, run_dir=run_dir, checkpoint=path)
    source = {"kind": "split", "format": cfg.data.format, "path": cfg.data.path, "split": split}
    write_eval_record(target, run_record(run, result, source))
    return result


def log_stderr(message: str) -> None:
    """Notes for the user of a command whose stdout is its result (scores, generated text)."""
    print(message, file=sys.stderr)


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
    log: Log = _stderr,
) -> str:
    """The continuation of ``prompt`` (text, without the prompt) sampled from the run's newest good model."""
    from compressive_transformer.loading import load_run
    from compressive_transformer.textgen import generate_text

    run = load_run(run_dir, device=device, log=log)
    return generate_text(
        run,
        prompt,
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
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


def demo(
    *, steps: int | None = None, run_dir: str | Path | None = None, log: Log = print, prompt: str = "The "
) -> DemoResult:
    """Train the demo config on the pydoc topics, evaluate on validation, sample; never reuses a run directory."""
    overrides = [f"train.steps={steps}"] if steps is not None else []
    cfg = config_from_text(DEMO_TOML, overrides)
    if steps is not None and steps < cfg.train.warmup_steps * 2:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, warmup_steps=max(steps // 10, 0)))
    run_dir = Path(run_dir) if run_dir is not None else fresh_run_dir("demo")
    start = time.perf_counter()
    log(
        f"demo: training a {cfg.model.n_layers}-layer Compressive Transformer on the pydoc topics for {cfg.train.steps} steps"
    )
    train_run(cfg, run_dir, log=log)
    log("demo: evaluating on the whole validation split (memory carried through)")
    result = evaluate_run(run_dir, split="validation")
    log(f"demo: {result.summary()}")
    sample = generate_run(run_dir, prompt, max_tokens=200, temperature=0.8, top_k=40, seed=0)
    return DemoResult(
        run_dir=run_dir,
        steps=cfg.train.steps,
        seconds=time.perf_counter() - start,
        validation=result,
        sample=prompt + sample,
    )
