"""A study: every variant of a spec trained with each of several seeds on one budget, then measured on whole books.

The spec is a comparison spec (``[base]``, ``[variants.NAME]``, see :mod:`.spec`) plus a ``[study]`` table
(:class:`StudySettings`) and, per variant, optional ``evaluations.NAME`` tables of memory lengths to evaluate with
besides the training ones (``train``), e.g. a compressed memory 4x longer than in training. Every variant must name
the same evaluations, so their columns compare.

Run ``(variant, seed)`` trains in ``OUT/runs/VARIANT/seed-S`` with ``train.seed = S``: the same seed gives every
variant the same data order, which is what makes the per-seed paired differences meaningful. Once trained, each
run is measured (:func:`measure_run`): for every evaluation and split, the per-token loss over whole documents with
memory carried from each document's start, as bits per character / byte / token and word perplexity, split by how
far back each word last occurred and by its frequency in the train split; and its attention by memory region. The
measurements land in ``OUT/results/VARIANT/seed-S.json`` (small, meant to be committed), with the code commit and
the data's fingerprint that made them (``provenance``, :mod:`compressive_transformer.runs.provenance`) and the
machine they ran on (``machine``); the run directories
(checkpoints) and the token cache are scratch (``OUT/.gitignore`` says so).

A study is resumable at any moment: a result file whose config and measurement settings match is reused; a run
directory with a checkpoint is resumed; one killed before its first checkpoint is started again. The aggregate
(:mod:`.study_report`: ``results.json``, ``results.md``, plots) is rewritten from the result files after every
finished run, so a study cut short still reports the runs it finished.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from compressive_transformer.analysis.frequency import bucket_perplexity, token_nll, token_words, word_counts, word_nll
from compressive_transformer.analysis.recurrence import Reach, default_edges, loss_by_lookback
from compressive_transformer.analysis.regions import attention_by_region
from compressive_transformer.core.config import (
    ConfigError,
    Log,
    RunConfig,
    apply_run_overrides,
    eval_lengths,
    from_dict,
    load_toml,
    require,
)
from compressive_transformer.core.config_base import flatten, unflatten
from compressive_transformer.core.fileio import remove, write_text_atomic
from compressive_transformer.core.models import model_kind
from compressive_transformer.data import read_documents
from compressive_transformer.data.units import summary_line, texts_size, units
from compressive_transformer.experiments.spec import load_variants
from compressive_transformer.runs import cputime
from compressive_transformer.runs.checkpoint import latest_checkpoint
from compressive_transformer.runs.failures import sizes_to_lower
from compressive_transformer.runs.machine import machine_info, resolve_device
from compressive_transformer.runs.metrics import read_metrics
from compressive_transformer.runs.precision import bf16_flags, inference_amp, resolve_amp
from compressive_transformer.runs.rundir import RESUME_FREE_KEYS, flat, load_model, open_run
from compressive_transformer.training.workflows import train_run

RESULT_VERSION = 1
SCRATCH = ("runs/", "cache/", "logs/")


@dataclass(frozen=True)
class StudySettings:
    """The ``[study]`` table."""

    title: str = ""
    seeds: tuple[int, ...] = (0, 1, 2)
    baseline: str = ""  # the variant every other one is compared with; "" means the first
    splits: tuple[str, ...] = ("validation", "test")
    level: float = 0.95  # confidence level of the intervals over seeds
    lookback_edges: tuple[int, ...] = ()  # loss-by-lookback buckets; () derives them from the variants' memories
    attention_split: str = "test"
    attention_segments: int = 200  # segments with full memories averaged into the attention profile (0: none)
    parallel: int = 1  # runs trained at once; the threads are split between them
    threads: int = 0  # CPU threads for the whole study; 0 means every core

    def __post_init__(self) -> None:
        p = "study."
        require(
            len(self.seeds) > 0 and len(set(self.seeds)) == len(self.seeds),
            p + "seeds",
            "must be a non-empty list of distinct integers",
        )
        require(all(s >= 0 for s in self.seeds), p + "seeds", "must be >= 0")
        require(
            len(self.splits) > 0 and all(s in ("train", "validation", "test") for s in self.splits),
            p + "splits",
            "use train, validation and/or test",
        )
        require(0.0 < self.level < 1.0, p + "level", "must be in (0, 1), e.g. 0.95")
        require(
            all(e >= 1 for e in self.lookback_edges) and list(self.lookback_edges) == sorted(set(self.lookback_edges)),
            p + "lookback_edges",
            "must be increasing integers >= 1",
        )
        require(
            self.attention_split in ("train", "validation", "test"),
            p + "attention_split",
            "use train, validation or test",
        )
        require(self.attention_segments >= 0, p + "attention_segments", "must be >= 0 (0 skips the attention profile)")
        require(self.parallel >= 1, p + "parallel", "must be >= 1")
        require(self.threads >= 0, p + "threads", "must be >= 0 (0 means every core)")


@dataclass(frozen=True)
class EvalLengths:
    """One ``evaluations.NAME`` table of a variant: lengths to evaluate with (unset: the training ones)."""

    mem_len: int | None = None
    cmem_len: int | None = None
    seg_len: int | None = None

    def __post_init__(self) -> None:
        for key in ("mem_len", "cmem_len"):
            v = getattr(self, key)
            require(v is None or v >= 0, key, "must be >= 0")
        require(self.seg_len is None or self.seg_len > 0, "seg_len", "must be > 0")


@dataclass(frozen=True)
class Study:
    path: Path
    settings: StudySettings
    configs: dict[str, RunConfig]  # variant -> run config (seed not yet applied)
    evaluations: dict[str, dict[str, EvalLengths]]  # variant -> evaluation name -> lengths ("train" included)
    overrides: tuple[str, ...] = ()

    @property
    def baseline(self) -> str:
        return self.settings.baseline or next(iter(self.configs))

    @property
    def evaluation_names(self) -> list[str]:
        return list(next(iter(self.evaluations.values())))

    def lengths(self, variant: str, evaluation: str) -> tuple[int, int, int]:
        """(seg_len, mem_len, cmem_len) of ``variant`` under ``evaluation``."""
        e = self.evaluations[variant][evaluation]
        return tuple(
            eval_lengths(self.configs[variant].model, seg_len=e.seg_len, mem_len=e.mem_len, cmem_len=e.cmem_len)
        )

    def lookback_edges(self) -> list[int]:
        """The study's lookback edges: given, or every variant's raw memory and total reach at training lengths."""
        if self.settings.lookback_edges:
            return list(self.settings.lookback_edges)
        reaches = [
            Reach(c.model.memory.mem_len, c.model.memory.cmem_len, c.model.compression.rate)
            for c in self.configs.values()
        ]
        return default_edges(reaches) or [self.configs[self.baseline].model.seg_len]


def load_study(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Study:
    """Parse and check a study spec; ``overrides`` (section.key=value) apply to every variant's run config."""
    path = Path(path)
    raw = load_toml(path)
    configs, extras = load_variants(raw, path, overrides, tables=("study", "base", "variants"), extras=("evaluations",))
    settings = from_dict(StudySettings, raw.get("study", {}), "study")
    if settings.baseline and settings.baseline not in configs:
        raise ConfigError(f"study.baseline: no variant named {settings.baseline!r}; use one of {', '.join(configs)}")
    evaluations: dict[str, dict[str, EvalLengths]] = {}
    for name, extra in extras.items():
        tables = extra.get("evaluations", {})
        if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
            raise ConfigError(
                f"variants.{name}.evaluations: write one table per evaluation, e.g. [variants.{name}.evaluations.long]"
            )
        if "train" in tables:
            raise ConfigError(
                f"variants.{name}.evaluations.train: 'train' is the training lengths; name the evaluation otherwise"
            )
        evaluations[name] = {"train": EvalLengths()} | {
            ev: from_dict(EvalLengths, t, f"variants.{name}.evaluations.{ev}") for ev, t in tables.items()
        }
    first = next(iter(evaluations))
    for name, evs in evaluations.items():
        missing = set(evaluations[first]) ^ set(evs)
        if missing:
            ev = sorted(missing)[0]
            has, lacks = (first, name) if ev in evaluations[first] else (name, first)
            raise ConfigError(
                f"variants.{lacks}: has no evaluations.{ev} (variant {has} has); every variant needs the same evaluations"
            )
    for name, cfg in configs.items():
        for ev, lengths in evaluations[name].items():
            _, mem, cmem = (lengths.seg_len, lengths.mem_len, lengths.cmem_len)
            if cmem and not cfg.model.uses_compression:
                raise ConfigError(
                    f"variants.{name}.evaluations.{ev}.cmem_len: {name} has no compressed memory (model.memory.cmem_len = 0)"
                )
            fixed = model_kind(cfg.model).fixed_memory
            if fixed and (mem is not None or cmem is not None):
                raise ConfigError(f"variants.{name}.evaluations.{ev}: {fixed}; remove the lengths")
    return Study(path, settings, configs, evaluations, tuple(overrides))


# ---------------------------------------------------------------------------------------------------------------
# one run


@dataclass(frozen=True, eq=False)  # hashed by identity: a job is one unit of work
class Job:
    """Everything one worker needs to train and measure run (variant, seed); picklable."""

    variant: str
    seed: int
    config: RunConfig
    run_dir: Path
    result_path: Path
    log_path: Path
    evaluations: dict[str, tuple[int, int, int]]  # name -> (seg_len, mem_len, cmem_len)
    splits: tuple[str, ...]
    lookback_edges: tuple[int, ...]
    attention_split: str
    attention_segments: int
    threads: int
    progress: bool
    provenance: dict[str, Any] | None = None  # the code and data the run is made by (runs.provenance), not its identity

    @property
    def name(self) -> str:
        return f"{self.variant} seed {self.seed}"

    def identity(self) -> dict[str, Any]:
        """What a result file must match to be reused: the run's config (bar keys that never change the
        trajectory) and the measurement settings."""
        return {
            "version": RESULT_VERSION,
            "config": identity_config(self.config),
            "measure": {
                "evaluations": {k: list(v) for k, v in self.evaluations.items()},
                "splits": list(self.splits),
                "lookback_edges": list(self.lookback_edges),
                "attention_split": self.attention_split,
                "attention_segments": self.attention_segments,
            },
        }


def study_jobs(study: Study, out: Path, *, threads: int, progress: bool) -> list[Job]:
    jobs = []
    edges = tuple(study.lookback_edges())
    for variant, base in study.configs.items():
        for seed in study.settings.seeds:
            cache = base.data.cache_dir or str((out / "cache").resolve())
            cfg = dataclasses.replace(
                base,
                train=dataclasses.replace(
                    base.train, seed=seed, num_threads=threads, progress=progress and base.train.progress
                ),
                data=dataclasses.replace(base.data, cache_dir=cache),
            )
            jobs.append(
                Job(
                    variant=variant,
                    seed=seed,
                    config=cfg,
                    run_dir=out / "runs" / variant / f"seed-{seed}",
                    result_path=out / "results" / variant / f"seed-{seed}.json",
                    log_path=out / "logs" / f"{variant}-seed-{seed}.log",
                    evaluations={ev: study.lengths(variant, ev) for ev in study.evaluation_names},
                    splits=tuple(study.settings.splits),
                    lookback_edges=edges,
                    attention_split=study.settings.attention_split,
                    attention_segments=study.settings.attention_segments,
                    threads=threads,
                    progress=progress,
                )
            )
    return jobs


def identity_config(cfg: RunConfig) -> dict[str, Any]:
    """The config part of a result's identity: every key but those that never change the trajectory, with the
    precisions resolved on this machine, since the same config trains in bf16 on a CPU with bf16 instructions and in
    fp32 on one without, and the two are different runs."""
    config = _trajectory_keys(cfg)
    device = resolve_device(cfg.train.device)
    config["train.amp"] = resolve_amp(cfg.train.amp, device)
    config["eval.amp"] = inference_amp(cfg, device)
    return config


def _trajectory_keys(cfg: RunConfig) -> dict[str, Any]:
    """Every dotted config key but those that never change the trajectory, as JSON stores them."""
    return json.loads(json.dumps({k: v for k, v in flat(cfg).items() if not k.startswith(RESUME_FREE_KEYS)}))


def stored_identity(result: dict[str, Any]) -> dict[str, Any]:
    """A result's identity as this version would write it for the same run: config keys added since it was written
    take their defaults (a new key's default keeps the old behaviour), and precisions stored as configured ("auto",
    "") are resolved on the machine the run ran on (its ``machine`` record)."""
    identity = result.get("identity") or {}
    config = identity.get("config")
    if not isinstance(config, dict):
        return identity
    defaults = _trajectory_keys(RunConfig())
    config = {**defaults, **_current_keys(config)}
    optional = [k for k, v in defaults.items() if v is None and k.startswith("model.")]  # sections absent by default
    for section in optional:
        if any(k.startswith(section + ".") for k in config):
            del config[section]  # given: its keys stand in for the default None
    known = tuple(f"{s}." for s in optional)
    machine = result.get("machine") or {}
    on_cpu = config["train.device"] == "cpu" or (config["train.device"] == "auto" and "gpu" not in machine)
    if config["train.amp"] == "auto" and on_cpu:  # on a GPU "auto" is bf16 where supported: left unresolved
        config["train.amp"] = "bf16" if bf16_flags(machine.get("cpu_flags") or []) else "none"
    if config["eval.amp"] == "":
        config["eval.amp"] = config["train.amp"]
    return {**identity, "config": {k: v for k, v in config.items() if k in defaults or k.startswith(known)}}


def _current_keys(config: dict[str, Any]) -> dict[str, Any]:
    """A stored identity's dotted keys as this version names them: its [model] table read as any [model] table is
    (the flat keys of the earlier layout in their sections), a table value (``model.adaptive``) one key per entry."""
    return flatten(apply_run_overrides(unflatten(config), ()))


def read_result(path: Path) -> dict[str, Any] | None:
    """A run's result, or None where there is none (or the file is not one: not JSON, not UTF-8, not an object)."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) else None


def result_state(job: Job) -> str:
    """``done`` (a matching result exists), ``todo``, ``remeasure`` (a result of the same run measured with other
    settings) or ``retrain`` (a result of a run with another config)."""
    result = read_result(job.result_path)
    if result is None:
        return "todo"
    have, want = stored_identity(result), job.identity()
    if have == want:
        return "done"
    return "remeasure" if have.get("config") == want["config"] and have.get("version") == want["version"] else "retrain"


def run_job(job: Job) -> dict[str, Any]:
    """Train (or resume) the run and measure it; writes and returns its result. Runs in a worker process."""

    torch.set_num_threads(job.threads)
    job.log_path.parent.mkdir(parents=True, exist_ok=True)
    with job.log_path.open("a", encoding="utf-8") as f:

        def log(line: str) -> None:
            f.write(line.rstrip("\n") + "\n")
            f.flush()

        log(f"== {job.name} ({time.strftime('%Y-%m-%d %H:%M:%S')})")
        started = (job.run_dir / "config.toml").is_file()
        if started and latest_checkpoint(job.run_dir) is None:  # killed before its first checkpoint: nothing to keep
            log(f"{job.run_dir} has no checkpoint; starting it again")
            remove(job.run_dir, base=job.run_dir.parent)
            started = False
        t0 = time.perf_counter()
        summary = train_run(job.config, job.run_dir, resume=started, log=log)  # records its CPU time (runs.cputime)
        train_s = time.perf_counter() - t0
        t0, c0 = time.perf_counter(), time.process_time()
        result = measure_run(job, log=log)
        result["seconds"] = {"train_this_call": train_s, "measure": time.perf_counter() - t0}
        result["cpu_seconds"] = {"train": cputime.total(job.run_dir), "measure": time.process_time() - c0}
        result["final_train_loss"] = final_train_loss(job.run_dir, job.config.train.steps, summary.last_loss)
        result["provenance"] = job.provenance or {"code": None, "data": None}
        write_text_atomic(job.result_path, json.dumps(result, indent=1) + "\n")
        log(f"wrote {job.result_path}")
    return result


def final_train_loss(run_dir: Path, steps: int, trained: float | None) -> float | None:
    """The training loss of the run's last step: this call's (``trained``), else, when training had finished before
    (a study killed while measuring, then rerun), the one its metrics recorded at that step (the same number)."""
    if trained is not None:
        return trained
    losses = [r["loss"] for r in read_metrics(run_dir) if r.get("step") == steps and "loss" in r]
    return float(losses[-1]) if losses else None


# measurement happens after training: a rerun keeps the trained run and only measures it again
MEASURE_REMEDY = (
    "lower [base.eval] batch_size or the evaluation's lengths (seg_len/mem_len/cmem_len) in the spec and run the study "
    "again: the trained runs are kept and only measured again"
)


def measure_run(job: Job, *, log: Log = print) -> dict[str, Any]:
    """Per evaluation and split: bits per character / byte / token, word perplexity, loss by lookback and by word
    frequency, over whole documents with memory carried from each one's start; attention by memory region."""
    cfg, tokenizer = open_run(job.run_dir)
    model = load_model(job.run_dir, cfg)
    counts = word_counts(read_documents(cfg.data, "train"))
    batch = cfg.eval.batch_size
    evaluations: dict[str, dict[str, Any]] = {ev: {} for ev in job.evaluations}
    texts = {}
    for split in dict.fromkeys(job.splits + ((job.attention_split,) if job.attention_segments else ())):
        docs = read_documents(cfg.data, split)
        texts[split] = (token_words(tokenizer, docs), texts_size(docs))
    for ev, (seg_len, mem_len, cmem_len) in job.evaluations.items():
        for split in job.splits:
            tw, size = texts[split]
            t0 = time.perf_counter()
            rows = min(batch, len(tw.doc_offsets) - 1)
            sizes = {
                "eval.batch_size": rows,
                f"evaluation {ev!r} seg_len/mem_len/cmem_len": f"{seg_len}/{mem_len}/{cmem_len}",
            }
            with sizes_to_lower(f"measuring {job.name} on {split}", sizes, MEASURE_REMEDY):
                nll = token_nll(model, tw, batch_size=rows, seg_len=seg_len, mem_len=mem_len, cmem_len=cmem_len)
            predicted = ~np.isnan(nll)
            total = float(nll[predicted].sum())
            n_tok = int(predicted.sum())
            u = units(total, n_tok, size, tokenizer_kind=tokenizer.kind)
            record = {
                "seg_len": seg_len,
                "mem_len": mem_len,
                "cmem_len": cmem_len,
                "documents": len(tw.doc_offsets) - 1,
                "tokens": int(len(tw.ids)),
                "predicted_tokens": n_tok,
                "nll_nats": total,
                **{k: v for k, v in u.to_dict().items() if k != "ppl"},
                **size.to_dict(),
                "lookback": loss_by_lookback(tw, nll, seg_len=seg_len, edges=job.lookback_edges),
                "frequency": bucket_perplexity(tw.words, word_nll(tw, nll), counts),
                "seconds": time.perf_counter() - t0,
            }
            evaluations[ev][split] = record
            log(f"{ev} {split}: {summary_line(u)} ({record['seconds']:.0f} s)")
    attention = None
    if job.attention_segments:
        tw, _ = texts[job.attention_split]
        source = SimpleNamespace(tokens=tw.ids, doc_offsets=tw.doc_offsets)
        rows = min(batch, len(tw.doc_offsets) - 1)
        sizes = {"eval.batch_size": rows, "study.attention_segments": job.attention_segments}
        with sizes_to_lower(f"measuring {job.name}'s attention", sizes, MEASURE_REMEDY):
            attention = attention_by_region(model, source, batch_size=rows, max_segments=job.attention_segments)
        attention["split"] = job.attention_split
    records = read_metrics(job.run_dir)
    params = {
        "total": sum(p.numel() for p in model.parameters()),
        "compressor": sum(p.numel() for p in model.parameters_of("compressor")),
    }
    return {
        "identity": job.identity(),
        "variant": job.variant,
        "seed": job.seed,
        "checkpoint": str(latest_checkpoint(job.run_dir)),
        "parameters": params,
        "train_tokens": max((int(r["tokens"]) for r in records if "tokens" in r), default=0),
        "tokens_per_s": _median([r["tokens_per_s"] for r in records if "tokens_per_s" in r]),
        "curve": _curve(records),
        "evaluations": evaluations,
        "attention": attention,
        "machine": machine_info(),
    }


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def _curve(records: list[dict[str, Any]]) -> dict[str, list[float]]:
    train = [r for r in records if "loss" in r and "step" in r]
    val = [r for r in records if "val_loss" in r]
    return {
        "step": [int(r["step"]) for r in train],
        "loss": [float(r["loss"]) for r in train],
        "val_step": [int(r["step"]) for r in val],
        "val_loss": [float(r["val_loss"]) for r in val],
    }


__all__ = [
    "EvalLengths",
    "Job",
    "Study",
    "StudySettings",
    "load_study",
    "measure_run",
    "run_job",
    "study_jobs",
]
