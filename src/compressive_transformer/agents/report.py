"""Success rate against environment steps from agent runs' metrics: per-seed curves, intervals over seeds, a plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from compressive_transformer.analysis.plots import save_figure, subplots
from compressive_transformer.analysis.stats import mean_interval
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


def summarize(
    runs: Mapping[str, Mapping[int, Path]], *, total_steps: int, bin_steps: int, final_fraction: float
) -> dict[str, Any]:
    """``runs[model][seed]`` = run directory -> per model: curves per seed, the mean curve with its 95% interval
    per bin, and the final success rate with its 95% interval over seeds (runs not finished are left out)."""
    out: dict[str, Any] = {}
    for model, seeds in runs.items():
        curves, finals = {}, {}
        for seed, run_dir in seeds.items():
            records = read_metrics(run_dir)
            if not records or records[-1]["env_steps"] < total_steps:
                continue
            curves[seed] = success_curve(records, bin_steps, total_steps)
            finals[seed] = final_success(records, total_steps, final_fraction)
        n_bins = max((len(c) for c in curves.values()), default=0)
        by_bin = [mean_interval([c[b] for c in curves.values() if b < len(c)]) for b in range(n_bins)]
        out[model] = {
            "seeds": sorted(curves),
            "curves": {str(s): c for s, c in curves.items()},
            "bin_steps": bin_steps,
            "mean_curve": [i.to_dict() for i in by_bin],
            "final": mean_interval(list(finals.values())).to_dict(),
            "final_by_seed": {str(s): f for s, f in finals.items()},
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


__all__ = ["final_success", "plot_success", "success_curve", "summarize"]
