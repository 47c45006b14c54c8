"""Training curves of several runs, read from their ``metrics.jsonl`` (train records carry ``loss``, validation
records ``val_loss``), ready to be drawn on one plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from compressive_transformer.runs.metrics import read_metrics


def curves_from_records(
    records: Sequence[dict[str, Any]],
    keys: Sequence[str] = ("loss", "bits_per_token", "lr", "tokens_per_s", "aux_loss"),
) -> dict[str, list[float]]:
    """``{"step": [...], key: [...], "val_step": [...], "val_" + k: [...]}`` for the keys the records hold."""
    train = [r for r in records if "loss" in r and "step" in r]
    val = [r for r in records if "val_loss" in r and "step" in r]
    out: dict[str, list[float]] = {"step": [int(r["step"]) for r in train], "val_step": [int(r["step"]) for r in val]}
    for k in keys:
        if train and all(isinstance(r.get(k), (int, float)) for r in train):
            out[k] = [float(r[k]) for r in train]
    for k in ("loss", "bits_per_token", "bits_per_char", "ppl"):
        if val and all(isinstance(r.get("val_" + k), (int, float)) for r in val):
            out["val_" + k] = [float(r["val_" + k]) for r in val]
    return out


def run_name(run_dir: str | Path, taken: set[str]) -> str:
    """The run directory's name, made unique among ``taken`` (two runs may share a basename)."""
    path = Path(run_dir)
    name = path.name or str(path)
    if name in taken:
        name = f"{path.parent.name}/{path.name}"
    base, n = name, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return name


def training_curves(run_dirs: Sequence[str | Path]) -> dict[str, dict[str, list[float]]]:
    """Curves of each run, keyed by a unique run name."""
    taken: set[str] = set()
    return {run_name(d, taken): curves_from_records(read_metrics(d)) for d in run_dirs}


__all__ = ["curves_from_records", "run_name", "training_curves"]
