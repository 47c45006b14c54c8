"""Running a study: train and measure every (variant, seed) not yet done, a few at a time on the experiment runner,
and rewrite the report after each (:mod:`.study` defines the study and its jobs, :mod:`.study_report` aggregates)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.data import read_documents
from compressive_transformer.experiments.runner import run_cells, split_threads
from compressive_transformer.experiments.study import (
    SCRATCH,
    Job,
    Log,
    Study,
    load_study,
    result_state,
    run_job,
    study_jobs,
)
from compressive_transformer.experiments.study_report import write_report
from compressive_transformer.runs.metrics import read_metrics
from compressive_transformer.runs.provenance import code_state, data_fingerprint


def _progress_of(job: Job) -> int:
    """Steps the run has logged so far (read from its metrics file, so it works across processes)."""
    try:
        steps = [int(r["step"]) for r in read_metrics(job.run_dir) if "step" in r]
    except (OSError, ValueError):
        return 0
    return max(steps, default=0)


def run_study(
    spec: str | Path,
    out: str | Path,
    *,
    overrides: list[str] | tuple[str, ...] = (),
    parallel: int | None = None,
    threads: int | None = None,
    command: str = "",
    log: Log = print,
) -> dict[str, Any]:
    """Train and measure every (variant, seed) of ``spec`` not yet done in ``out``; aggregate; return the summary."""
    study = load_study(spec, overrides)
    out = Path(out)
    s = study.settings
    total, asked = threads or s.threads or os.cpu_count() or 1, parallel or s.parallel
    lanes, per_job = split_threads(total, asked)
    jobs = study_jobs(study, out, threads=per_job, progress=lanes == 1)
    todo = _with_provenance(study, _jobs_to_run(study, jobs, out), out, log)
    capped = (
        f" (parallel {asked} capped by {total} thread(s) in all: raise threads to run more)" if lanes < asked else ""
    )
    log(
        f"study {study.path}: {len(study.configs)} variants x {len(s.seeds)} seeds; {len(jobs) - len(todo)} done, "
        f"{len(todo)} to run, {lanes} at a time with {per_job} thread(s) each{capped}"
    )
    errors: list[tuple[Job, Exception]] = []
    if lanes == 1:

        def announced(job: Job) -> dict[str, Any]:
            log(f"[{todo.index(job) + 1}/{len(todo)}] {job.name} -> {job.run_dir} (log {job.log_path})")
            return run_job(job)

        run_cells(todo, announced, on_done=lambda *_: write_report(study, out, command=command))
    else:
        _run_in_parallel(study, todo, out, lanes, command, errors)
    summary = write_report(study, out, command=command)
    if errors:
        job, e = errors[0]
        raise ConfigError(
            f"{len(errors)} of {len(todo)} runs failed; first: {job.name}: {e} (see {job.log_path}); rerun the study to retry them"
        )
    return summary


def _jobs_to_run(study: Study, jobs: list[Job], out: Path) -> list[Job]:
    """The jobs without a matching result; a result is never replaced by one of a different run (re-measuring the
    same run is fine). Checks the corpus once before any run starts and leaves a ``.gitignore`` for the scratch."""
    states = {j: result_state(j) for j in jobs}
    for j in jobs:
        if states[j] == "retrain" or (states[j] == "remeasure" and not (j.run_dir / "config.toml").is_file()):
            why = (
                "another run config"
                if states[j] == "retrain"
                else "other measurement settings, and its run directory is gone"
            )
            raise ConfigError(
                f"{j.result_path}: was made with {why}; restore the spec it was made with, or study into another --out"
            )
    for cfg in {id(c.data): c for c in study.configs.values()}.values():
        read_documents(cfg.data, "train")  # a missing corpus stops here, once, before any run starts
    out.mkdir(parents=True, exist_ok=True)
    ignore = out / ".gitignore"
    if not ignore.exists():
        write_text_atomic(
            ignore,
            "# scratch of the study: checkpoints, token cache and logs (results/ and the reports are kept)\n"
            + "\n".join(SCRATCH)
            + "\n",
        )
    return [j for j in jobs if states[j] != "done"]


def _with_provenance(study: Study, todo: list[Job], out: Path, log: Log) -> list[Job]:
    """The jobs, each carrying the code commit (the study's own output folder does not make the tree dirty) and its
    data's fingerprint (every split a run reads, hashed once per data config), recorded in its result."""
    if not todo:
        return todo
    code = code_state(exclude=[out])
    splits = ("train", *study.settings.splits, study.settings.attention_split)
    data = {}
    for c in study.configs.values():
        if id(c.data) not in data:
            log(f"fingerprinting the data at {c.data.path or c.data.format} ...")
            data[id(c.data)] = data_fingerprint(c.data, splits)
    by_variant = {v: data[id(c.data)] for v, c in study.configs.items()}
    return [dataclasses.replace(j, provenance={"code": code, "data": by_variant[j.variant]}) for j in todo]


def _run_in_parallel(
    study: Study, todo: list[Job], out: Path, lanes: int, command: str, errors: list[tuple[Job, Exception]]
) -> None:
    """``lanes`` runs at a time in worker processes under one progress bar of training steps; failures are
    collected in ``errors`` while the others run on."""
    steps_total = sum(j.config.train.steps for j in todo)
    bar = tqdm(total=steps_total, desc="study", unit="step", dynamic_ncols=True)
    finished_steps = 0

    def done(job: Job, _: Any) -> None:
        nonlocal finished_steps
        finished_steps += job.config.train.steps
        bar.write(f"finished {job.name}")
        write_report(study, out, command=command)

    def failed(job: Job, e: Exception) -> None:
        nonlocal finished_steps
        finished_steps += job.config.train.steps
        errors.append((job, e))
        bar.write(f"failed {job.name}: {e} (log {job.log_path})")

    def waiting(running: list[Job]) -> None:
        bar.n = min(steps_total, finished_steps + sum(_progress_of(j) for j in running))
        bar.refresh()

    run_cells(todo, run_job, parallel=lanes, on_done=done, on_error=failed, on_wait=waiting)
    bar.close()


__all__ = ["run_study"]
