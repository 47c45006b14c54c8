"""Evaluating and sampling a run directory, as plain functions (no argparse): the newest good checkpoint, the run's
own config and tokenizer, and the result written into the run."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any, Iterator

from compressive_transformer.core.config import ConfigError, RunConfig, apply_run_overrides
from compressive_transformer.core.dtypes import amp_dtype
from compressive_transformer.core.registry import corpus_format
from compressive_transformer.data import load_corpus
from compressive_transformer.inference.evaluate import EvalResult, evaluate, write_eval_record
from compressive_transformer.inference.generate import SamplingConfig
from compressive_transformer.inference.text_eval import result_path, run_record
from compressive_transformer.inference.textgen import generate_text
from compressive_transformer.runs.budget import check_fits
from compressive_transformer.runs.failures import EVALUATION_REMEDY, evaluation_sizes, sizes_to_lower
from compressive_transformer.runs.loading import Run, load_run
from compressive_transformer.runs.precision import inference_amp
from compressive_transformer.runs.rundir import (
    EVAL_KEYS,
    Log,
    cache_dir,
    load_model_from,
    log_stderr,
    open_run,
    read_run_tables,
)


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


def split_result_path(
    run_dir: str | Path,
    *,
    split: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    out: str | Path | None = None,
) -> tuple[str, Path]:
    """The split :func:`evaluate_run` scores and the file it writes (``out``, which must not exist, else
    ``eval_<split>.json`` under a name no earlier result holds), after refusing overrides that evaluating a trained
    run would ignore; checked writable before any work."""
    bad = [o for o in overrides if not o.strip().startswith(EVAL_KEYS)]
    if bad:
        raise ConfigError(
            f"override {bad[0]!r}: only eval.*, data.path and data.cache_dir can change when evaluating a trained run"
        )
    tables = read_run_tables(run_dir)
    fmt = RunConfig.from_raw(apply_run_overrides(tables, ())).data.format
    if not corpus_format(fmt).needs_path and any(o.strip().startswith("data.path") for o in overrides):
        raise ConfigError(
            f"--set data.path: a {fmt} run reads no path; score your own text with `evaluate RUN --text FILE`"
        )
    if split is not None and any(o.strip().startswith("eval.split") for o in overrides):
        raise ConfigError("--set eval.split: --split is given too and wins; drop one of them")
    split = split or RunConfig.from_raw(apply_run_overrides(tables, overrides)).eval.split
    return split, result_path(Path(run_dir), f"{split}", out)


def evaluate_run(run_dir: str | Path, **options: Any) -> EvalResult:
    """Stream a whole split through the run's newest good model; write ``eval_<split>.json`` into the run under a
    name no earlier result holds (``eval_<split>-2.json`` ...), or to ``out``, which must not exist. Where that
    cannot be written it stops before computing anything. The keywords are :func:`evaluate_run_to`'s (``split``,
    ``overrides``, ``checkpoint``, ``progress``, ``out``, ``log``, ``device``, ``threads``), which also says which
    file it wrote."""
    return evaluate_run_to(run_dir, **options)[0]


def evaluate_run_to(
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
) -> tuple[EvalResult, Path]:
    """:func:`evaluate_run`, returning the file written too: a name another evaluation took meanwhile (two started
    together) is never replaced, the next free one is taken."""
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
    return result, write_eval_record(target, run_record(run, result, source))


def generate_run(
    run_dir: str | Path,
    prompt: str,
    *,
    max_tokens: int = 200,
    sampling: SamplingConfig | None = None,
    seed: int | None = None,
    compile: bool | None = None,
    device: str | None = None,
    log: Log = log_stderr,
) -> str:
    """The continuation of ``prompt`` (text, without the prompt) sampled from the run's newest good model, each token
    drawn as ``sampling`` says (default temperature 1)."""
    run = load_run(run_dir, device=device, log=log)
    return generate_text(
        run,
        prompt,
        max_tokens=max_tokens,
        sampling=sampling,
        seed=seed,
        compile=compile,
    ).text


__all__ = ["evaluate_run", "evaluate_run_to", "generate_run", "split_result_path"]
