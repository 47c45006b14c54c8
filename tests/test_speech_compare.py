"""The speech study's judged comparisons (benchmarks/speech/compare.py): paired by seed, Bonferroni over the three
pre-registered ones, each arm's cost from its own CPU record or the cost pilot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.speech.compare import main

BITS = {
    "compressive": [4.14, 4.16, 4.12],
    "transformer-xl-wide": [4.17, 4.20, 4.15],
    "wavenet30": [4.25, 4.26, 4.24],
    "wavenet30-cpu": [4.10, 4.12, 4.08],
}


def _write(folder: Path, variant: str, bits: list[float], steps: int, cpu: float | None) -> None:
    for seed, b in enumerate(bits):
        result = {
            "seed": seed,
            "identity": {"config": {"train.steps": steps}},
            "parameters": {"total": 1000, "compressor": 0},
            "evaluations": {"train": {"test": {"bits_per_char": b}, "validation": {"bits_per_char": b + 0.01}}},
        }
        if cpu is not None:
            result["cpu_seconds"] = {"train": {"seconds": cpu + seed, "steps": steps, "calls": 1}, "measure": 1.0}
        path = folder / "results" / variant / f"seed-{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result))


def test_judged_intervals_are_bonferroni_and_costs_come_from_the_runs_or_the_pilot(tmp_path: Path) -> None:
    for variant, bits in BITS.items():
        steps = 4300 if variant == "wavenet30-cpu" else 1500
        _write(tmp_path, variant, bits, steps, None if variant == "compressive" else 900.0)
    pilot = {"cpu_seconds_per_update": 0.5, "flops_per_update": {"total": 2e9}}
    (tmp_path / "cost.json").write_text(json.dumps({"variants": {"compressive": pilot, "wavenet30-lr1e-3": pilot}}))
    assert main([str(tmp_path)]) == 0
    out = json.loads((tmp_path / "comparisons.json").read_text())
    judged = {(d["a"], d["b"]): d for d in out["judged"]}
    assert set(judged) == {
        ("compressive", "transformer-xl-wide"),
        ("wavenet30", "compressive"),
        ("wavenet30-cpu", "compressive"),
    }
    d = judged[("wavenet30-cpu", "compressive")]
    assert d["level"] == pytest.approx(1 - 0.05 / 3)
    assert d["interval"]["mean"] == pytest.approx(-0.04) and d["interval"]["half_width"] == pytest.approx(0.0, abs=1e-9)
    arms = out["arms"]
    assert arms["compressive"]["pilot_cpu_seconds"] == pytest.approx(750.0), "no CPU record: the pilot's, x 1500"
    assert arms["wavenet30-cpu"]["train_cpu_seconds_mean"] == pytest.approx(901.0)
    assert arms["wavenet30-cpu"]["train_flops"] == pytest.approx(2e9 * 4300), "the sweep's cost, at its own updates"
    md = (tmp_path / "comparisons.md").read_text()
    assert "| compressive | 1,000 | 1500 | (750) |" in md and "98.3% [" in md
    assert "transformer-xl-wide - transformer-xl" not in md, "an arm that has not run is left out"
    assert main([str(tmp_path), "--split", "validation"]) == 0
    assert json.loads((tmp_path / "comparisons.json").read_text())["arms"]["wavenet30"]["interval"]["mean"] == (
        pytest.approx(4.26)
    )
