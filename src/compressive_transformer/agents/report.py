"""Success rate against environment steps from agent runs' metrics: per-seed curves, intervals over seeds, a plot."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from compressive_transformer.analysis.plots import save_figure, subplots
from compressive_transformer.analysis.stats import mean_interval
from compressive_transformer.core.fileio import inside, replace_file
from compressive_transformer.runs.metrics import read_metrics


def success_curve(records: Sequence[Mapping[str, Any]], bin_steps: int, total_steps: int | None = None) -> list[float]:
    """Success rate of the episodes that ended in each bin of ``bin_steps`` environment steps (NaN: none ended). The
    few steps a run makes past ``total_steps`` (its last update is whole) count into the last bin."""
    episodes: dict[int, list[int]] = {}
    last_bin = max(total_steps // bin_steps - 1, 0) if total_steps else None
    for r in records:
        b = (int(r["env_steps"]) - 1) // bin_steps
        b = b if last_bin is None else min(b, last_bin)
        n, s = episodes.setdefault(b, [0, 0]), r["new_successes"]
        n[0] += int(r["new_episodes"])
        n[1] += int(s)
    last = max(episodes, default=-1)
    return [episodes[b][1] / episodes[b][0] if episodes.get(b, [0])[0] else math.nan for b in range(last + 1)]


def final_success(records: Sequence[Mapping[str, Any]], total_steps: int, fraction: float) -> float:
    """Success rate of the episodes that ended in the last ``fraction`` of the run's environment steps."""
    start = total_steps * (1.0 - fraction)
    late = [r for r in records if r["env_steps"] > start]
    n = sum(int(r["new_episodes"]) for r in late)
    return sum(int(r["new_successes"]) for r in late) / n if n else math.nan


SOLVED = 0.9  # windowed success at or above which a run has solved the task
FALLEN = 0.6  # windowed success below which a run that had solved it has dropped (chance is 0.5)
PACKED = "metrics.jsonl.gz"  # a finished run's metrics as a study commits them (gzip of metrics.jsonl)


def read_run_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """A run's metric records: its ``metrics.jsonl``, else the packed copy a study committed (:data:`PACKED`)."""
    if (run_dir / "metrics.jsonl").is_file():
        return read_metrics(run_dir)
    if not (run_dir / PACKED).is_file():
        return []
    with gzip.open(run_dir / PACKED, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def pack_metrics(run_dir: Path) -> Path:
    """Write ``metrics.jsonl`` gzipped beside it (:data:`PACKED`): every record at the logged resolution, a fifth
    of the size, byte-for-byte the same on every call (no timestamp in the header)."""
    data = inside(run_dir, run_dir / "metrics.jsonl").read_bytes()

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
            f.write(data)

    return replace_file(run_dir / PACKED, write)  # replaced whole: a kill mid-write leaves the previous one


def stability(
    records: Sequence[Mapping[str, Any]], *, solved: float = SOLVED, fallen: float = FALLEN
) -> dict[str, Any]:
    """Whether a run solved the task and kept it, from its windowed success (``success_rate``: the last
    ``train.window`` episodes, one value per metrics record).

    - ``solved_at``: the environment steps of the first record at or above ``solved`` (None: never).
    - ``drops``: each fall below ``fallen`` after a record at or above ``solved``, with the steps it fell at, the
      lowest windowed success until the run solved again, and the steps it did (None: not before the end). After a
      drop, the next one counts only once the run has solved again.
    - ``final``: the last record's windowed success; ``lowest_after_solving``: the lowest from ``solved_at`` on.
    - ``stays_solved``: solved, no drop, and ``final`` at or above ``solved``: it solved the task and kept it."""
    solved_at, drops, armed, lowest = None, [], False, math.inf
    for r in records:
        rate, steps = float(r["success_rate"]), int(r["env_steps"])
        if solved_at is not None:
            lowest = min(lowest, rate)
        if rate >= solved:
            if solved_at is None:
                solved_at, lowest = steps, rate
            if drops and drops[-1]["recovered_at"] is None:
                drops[-1]["recovered_at"] = steps
            armed = True
        elif armed and rate < fallen:
            drops.append({"at": steps, "lowest": rate, "recovered_at": None})
            armed = False
        if drops and drops[-1]["recovered_at"] is None:
            drops[-1]["lowest"] = min(drops[-1]["lowest"], rate)
    final = float(records[-1]["success_rate"]) if records else math.nan
    return {
        "solved_at": solved_at,
        "drops": drops,
        "final": final,
        "lowest_after_solving": None if solved_at is None else lowest,
        "stays_solved": solved_at is not None and not drops and final >= solved,
    }


def summarize(
    runs: Mapping[str, Mapping[int, Path]], *, total_steps: int, bin_steps: int, final_fraction: float
) -> dict[str, Any]:
    """``runs[model][seed]`` = run directory -> per model: curves per seed, the mean curve with its 95% interval
    per bin, the final success rate with its 95% interval over seeds, and each seed's :func:`stability` with the
    count of runs that stay solved and of drops after solving (runs not finished are left out)."""
    out: dict[str, Any] = {}
    for model, seeds in runs.items():
        curves, finals, stable = {}, {}, {}
        for seed, run_dir in seeds.items():
            records = read_run_metrics(run_dir)
            if not records or records[-1]["env_steps"] < total_steps:
                continue
            curves[seed] = success_curve(records, bin_steps, total_steps)
            finals[seed] = final_success(records, total_steps, final_fraction)
            stable[seed] = stability(records)
        n_bins = max((len(c) for c in curves.values()), default=0)
        by_bin = [mean_interval([c[b] for c in curves.values() if b < len(c)]) for b in range(n_bins)]
        out[model] = {
            "seeds": sorted(curves),
            "curves": {str(s): c for s, c in curves.items()},
            "bin_steps": bin_steps,
            "mean_curve": [i.to_dict() for i in by_bin],
            "final": mean_interval(list(finals.values())).to_dict(),
            "final_by_seed": {str(s): f for s, f in finals.items()},
            "stability_by_seed": {str(s): v for s, v in stable.items()},
            "stays_solved": sum(v["stays_solved"] for v in stable.values()),
            "drops_after_solving": sum(len(v["drops"]) for v in stable.values()),
        }
    return out


def plot_success(summary: Mapping[str, Any], path: str | Path, *, title: str = "") -> Path:
    """Mean success rate per model (a line) with its 95% interval over seeds (a band, cut to [0, 1]) and each seed
    (a thin line), against environment steps."""
    fig, ax = subplots(figsize=(7, 4.2))
    for i, (model, s) in enumerate(summary.items()):
        pts = [(b, m) for b, m in enumerate(s["mean_curve"]) if m["mean"] is not None]
        if not pts:
            continue
        x = [(b + 1) * s["bin_steps"] for b, _ in pts]
        mean = [m["mean"] for _, m in pts]
        low = [max(m["low"], 0.0) if m["low"] is not None else m["mean"] for _, m in pts]
        high = [min(m["high"], 1.0) if m["high"] is not None else m["mean"] for _, m in pts]
        ax.plot(x, mean, color=f"C{i}", linewidth=2, label=f"{model} ({len(s['seeds'])} seeds)")
        ax.fill_between(x, low, high, color=f"C{i}", alpha=0.12)
        for curve in s["curves"].values():
            seed_pts = [(b, v) for b, v in enumerate(curve) if not math.isnan(v)]
            ax.plot([(b + 1) * s["bin_steps"] for b, _ in seed_pts], [v for _, v in seed_pts], color=f"C{i}", lw=0.6)
    ax.axhline(0.5, color="grey", linestyle=":", linewidth=1, label="chance")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "success rate (mean over seeds, 95% interval)", fontsize=10)
    return save_figure(fig, path)


__all__ = [
    "FALLEN",
    "PACKED",
    "SOLVED",
    "final_success",
    "pack_metrics",
    "plot_success",
    "read_run_metrics",
    "stability",
    "success_curve",
    "summarize",
]
