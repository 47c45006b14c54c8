"""Running a study: train and measure every (variant, seed) not yet done, a few at a time in worker processes, and
rewrite the report after each (:mod:`.study` defines the study and its jobs, :mod:`.study_report` aggregates)."""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
import os
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.data import read_documents
from compressive_transformer.experiments.study import SCRATCH, Job, Log, load_study, result_state, run_job, study_jobs
from compressive_transformer.experiments.study_report import write_report
from compressive_transformer.runs.metrics import read_metrics


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
    parallel = parallel or s.parallel
    total_threads = threads or s.threads or os.cpu_count() or 1
    lanes = max(1, min(parallel, total_threads))
    per_job = max(1, total_threads // lanes)
    jobs = study_jobs(study, out, threads=per_job, progress=lanes == 1)
    states = {j: result_state(j) for j in jobs}
    for j in jobs:  # a result is never replaced by one of a different run; re-measuring the same run is fine
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
    todo = [j for j in jobs if states[j] != "done"]
    log(
        f"study {study.path}: {len(study.configs)} variants x {len(s.seeds)} seeds; {len(jobs) - len(todo)} done, "
        f"{len(todo)} to run, {lanes} at a time with {per_job} thread(s) each"
    )

    def report() -> dict[str, Any]:
        return write_report(study, out, command=command)

    errors: list[tuple[Job, BaseException]] = []
    if lanes == 1:
        for i, job in enumerate(todo):
            log(f"[{i + 1}/{len(todo)}] {job.name} -> {job.run_dir} (log {job.log_path})")
            run_job(job)
            report()
    else:
        steps_total = sum(j.config.train.steps for j in todo)
        bar = tqdm(total=steps_total, desc="study", unit="step", dynamic_ncols=True)
        ctx = multiprocessing.get_context("spawn")
        with futures.ProcessPoolExecutor(max_workers=lanes, mp_context=ctx) as pool:
            pending = {pool.submit(run_job, j): j for j in todo}
            done_steps = 0
            while pending:
                finished, _ = futures.wait(pending, timeout=10, return_when=futures.FIRST_COMPLETED)
                for fut in finished:
                    job = pending.pop(fut)
                    done_steps += job.config.train.steps
                    try:
                        fut.result()
                        bar.write(f"finished {job.name}")
                        report()
                    except Exception as e:  # noqa: BLE001  (reported with the others at the end)
                        errors.append((job, e))
                        bar.write(f"failed {job.name}: {e} (log {job.log_path})")
                bar.n = min(steps_total, done_steps + sum(_progress_of(j) for j in pending.values()))
                bar.refresh()
        bar.close()
    summary = report()
    if errors:
        job, e = errors[0]
        raise ConfigError(
            f"{len(errors)} of {len(todo)} runs failed; first: {job.name}: {e} (see {job.log_path}); rerun the study to retry them"
        )
    return summary


__all__ = ["run_study"]
