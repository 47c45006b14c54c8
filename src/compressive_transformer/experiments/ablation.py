"""The long-range experiment over seeds: every (task, model, seed) cell at one step budget, resumable and parallel.

Each cell is trained and evaluated once and written to ``OUT/cells/TASK/MODEL/seed-S.json`` (atomically), so a
killed run loses at most the cells in flight: the next call reuses every finished cell and runs only the rest. All
models of a call train for the same number of steps (``--budget``, else the preset's ablation budget), so the
compression fn x loss cells compare at equal budget. The summary (``OUT/seeds.json``, rendered by
:mod:`~compressive_transformer.experiments.ablation_report`) holds each cell's mean accuracy over seeds with its 95%
Student-t interval and the paired per-seed differences against the paper's best cell.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from compressive_transformer.analysis.stats import mean_interval, paired_differences
from compressive_transformer.core.config import ConfigError, to_dict
from compressive_transformer.core.config_base import Log
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.experiments.ablation_report import render
from compressive_transformer.experiments.long_range import (
    ABLATION_MODELS,
    PRESETS,
    Preset,
    describe_model,
    run_one,
    train_config,
)
from compressive_transformer.experiments.long_range_report import split_accuracy
from compressive_transformer.experiments.runner import run_cells, write_json
from compressive_transformer.experiments.tasks.training import TaskRunConfig

SUMMARY_FILE = "seeds.json"
BASELINE = "ct-conv-attention"  # the paper's best cell: paired differences are taken against it


@dataclass(frozen=True)
class Cell:
    task: str
    model: str
    seed: int

    def path(self, out: Path) -> Path:
        return out / "cells" / self.task / self.model / f"seed-{self.seed}.json"


def plan_cells(
    preset: Preset, *, tasks: Sequence[str], models: Sequence[str], seeds: Sequence[int], budget: int | None
) -> list[tuple[Cell, TaskRunConfig]]:
    """Every (task, model, seed) with its run config, all at one step budget; validates names before anything runs."""
    all_tasks = preset.tasks()
    for t in tasks:
        if t not in all_tasks:
            raise ConfigError(f"--tasks: unknown {t!r}; use one of {', '.join(all_tasks)}")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds: give distinct seeds, e.g. 0,1,2 (got {','.join(map(str, seeds))})")
    models = tuple(dict.fromkeys(x for m in models for x in (ABLATION_MODELS if m == "ablation" else (m,))))
    vocab = max(cfg.vocab_size for cfg in all_tasks.values())
    configs = {m: preset.model(m, vocab) for m in models}
    steps = budget if budget is not None else preset.ablation_steps
    return [
        (
            Cell(t, m, s),
            TaskRunConfig(configs[m], all_tasks[t], train_config(preset, seed=s, steps=steps, ablation=True)),
        )
        for t in tasks
        for m in models
        for s in seeds
    ]


def _finished(cell: Cell, run: TaskRunConfig, out: Path) -> dict[str, Any] | None:
    """The cell's record if it already ran with this configuration; an error if it ran with another."""
    path = cell.path(out)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(record, dict) or "train" not in record or "task_config" not in record:
            raise ValueError("not a cell record")
    except ValueError as e:
        raise ConfigError(
            f"{path}: is not a cell record ({type(e).__name__}); delete it to run the cell again"
        ) from None
    same = lambda a, b: json.loads(json.dumps(a)) == json.loads(json.dumps(to_dict(b)))  # noqa: E731  (tuples as lists)
    if not same(record["train"], run.train) or not same(record["task_config"], run.task):
        raise ConfigError(f"{path}: ran with another budget or task; use another --out or delete {out / 'cells'}")
    return record


def run_cell(cell: Cell, run: TaskRunConfig, out: Path, threads: int = 1) -> dict[str, Any]:
    """Train and evaluate one cell and write its record (temp file + rename: a kill never leaves half a cell)."""
    torch.set_num_threads(threads)
    record = run_one(run) | {"name": cell.model, "seed": cell.seed}
    write_json(cell.path(out), record)
    return record


def _run_planned(planned: tuple[Cell, TaskRunConfig], out: Path, threads: int) -> tuple[Cell, dict[str, Any]]:
    cell, run = planned
    return cell, run_cell(cell, run, out, threads)


def run_seeded(
    preset: str | Preset,
    out_dir: str | Path,
    *,
    tasks: Sequence[str] = ("passkey",),
    models: Sequence[str] = ("ablation",),
    seeds: Sequence[int] = (0, 1, 2),
    budget: int | None = None,
    parallel: int = 1,
    threads: int = 1,
    command: str = "",
    log: Log = print,
) -> dict[str, Any]:
    """Run every missing cell (``parallel`` at a time, ``threads`` torch threads each), then summarise all of them
    into ``OUT/seeds.json`` and ``OUT/seeds.md``; returns the summary."""
    if isinstance(preset, str) and preset not in PRESETS:
        raise ConfigError(f"--preset: unknown {preset!r}; use one of {', '.join(PRESETS)}")
    if parallel < 1 or threads < 1:
        raise ConfigError("--parallel / --threads: must be >= 1")
    p = PRESETS[preset] if isinstance(preset, str) else preset
    out = Path(out_dir)
    cells = plan_cells(p, tasks=tasks, models=models, seeds=seeds, budget=budget)
    todo = [(c, r) for c, r in cells if _finished(c, r, out) is None]
    log(f"{len(cells) - len(todo)} of {len(cells)} cells already done; running {len(todo)}, {parallel} at a time")

    def done(_: Any, result: tuple[Cell, dict[str, Any]]) -> None:
        cell, record = result
        log(f"{cell.task} / {cell.model} / seed {cell.seed}: accuracy {record['overall_accuracy']:.3f}")

    run_cells(todo, functools.partial(_run_planned, out=out, threads=threads), parallel=parallel, on_done=done)
    records = [_finished(c, r, out) for c, r in cells]
    summary = summarise(records, p, seeds=seeds, command=command)
    write_json(out / SUMMARY_FILE, summary)
    write_text_atomic(out / "seeds.md", render(summary))
    return summary


def summarise(
    records: Sequence[dict[str, Any]], preset: Preset, *, seeds: Sequence[int], command: str
) -> dict[str, Any]:
    """Per task and model: accuracy (all answers, and within / beyond Transformer-XL's reach) as mean and 95%
    interval over seeds, the per-seed values, and paired differences against :data:`BASELINE` where it ran."""
    vocab = max(cfg.vocab_size for cfg in preset.tasks().values())
    reach = describe_model(preset.model("txl", vocab))["max_range_last_position"]
    per: dict[str, dict[str, dict[str, dict[int, float]]]] = {}  # task -> model -> metric -> seed -> value
    info: dict[str, dict[str, Any]] = {}
    for r in records:
        within, beyond = split_accuracy(r, reach)
        values = per.setdefault(r["task"], {}).setdefault(r["name"], {"all": {}, "within": {}, "beyond": {}})
        values["all"][r["seed"]], values["within"][r["seed"]], values["beyond"][r["seed"]] = (
            r["overall_accuracy"],
            within,
            beyond,
        )
        info[r["name"]] = {
            "compression": r["model"]["compression"],
            "compression_loss": r["model"]["compression_loss"],
            "steps": r["train"]["steps"],
            "attention_cost": r["model"]["attention_cost"],
        }
    tasks: dict[str, Any] = {}
    for task, models in per.items():
        rows = {}
        for name, values in models.items():
            row: dict[str, Any] = dict(info[name])
            for metric, by_seed in values.items():
                row[metric] = mean_interval(list(by_seed.values())).to_dict() | {
                    "per_seed": {str(k): v for k, v in by_seed.items()}
                }
            if BASELINE in models and name != BASELINE:
                row["vs_baseline"] = {m: paired_differences(values[m], models[BASELINE][m]) for m in ("all", "beyond")}
            rows[name] = row
        tasks[task] = rows
    return {
        "preset": preset.name,
        "preset_config": dataclasses.asdict(preset),
        "seeds": list(seeds),
        "txl_reach": reach,
        "baseline": BASELINE,
        "command": command,
        "tasks": tasks,
    }


def seeded_command(
    preset: str,
    out_dir: str | Path,
    tasks: Sequence[str],
    models: Sequence[str],
    seeds: Sequence[int],
    budget: int | None,
    parallel: int,
) -> str:
    cmd = (
        f"compressive-transformer task long-range --preset {preset} --tasks {','.join(tasks)} --models {','.join(models)}"
        f" --seeds {','.join(map(str, seeds))}"
    )
    if budget is not None:
        cmd += f" --budget {budget}"
    return cmd + f" --parallel {parallel} --out {out_dir}"


__all__ = ["BASELINE", "Cell", "plan_cells", "run_cell", "run_seeded", "seeded_command", "summarise"]
