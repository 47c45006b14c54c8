"""benchmarks/quality.py: runs train for a wall-clock budget and report validation BPC, finished runs are reused,
peers that are not installed are skipped, and the aggregate is the stats module's mean and Student-t interval."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

quality = pytest.importorskip("benchmarks.quality")

from compressive_transformer.analysis.stats import mean_interval  # noqa: E402


def record(impl: str, precision: str, seed: int, bpc: float, steps: int = 100) -> dict:
    return {
        "impl": impl,
        "precision": precision,
        "seed": seed,
        "val_bpc": bpc,
        "steps": steps,
        "curve": {"step": [1, 2, 3], "loss": [3.0, 2.5, 2.0]},
    }


def test_aggregate_gives_mean_and_95_percent_interval_per_implementation_and_precision(tmp_path: Path):
    records = [record("ours", "fp32", s, b) for s, b in enumerate((2.40, 2.38, 2.42))]
    records += [record("ours", "bf16", s, b, steps=180) for s, b in enumerate((2.35, 2.37, 2.36))]
    records += [{"impl": "lucidrains", "precision": "fp32", "seed": 0, "error": "ModuleNotFoundError"}]
    summary = quality.aggregate(records)
    assert set(summary) == {"ours@fp32", "ours@bf16"}  # failed runs carry no number
    iv = mean_interval([2.40, 2.38, 2.42])
    got = summary["ours@fp32"]["val_bpc"]
    assert got["mean"] == pytest.approx(2.40) and got["half_width"] == pytest.approx(iv.half_width)
    assert got["half_width"] == pytest.approx(4.303 * 0.02 / math.sqrt(3), rel=1e-3)  # t(0.975, 2 df) = 4.303
    assert summary["ours@bf16"]["steps"]["mean"] == 180 and summary["ours@bf16"]["seeds"] == [0, 1, 2]
    meta = {
        "budget_s": 600,
        "workload": "reference",
        "machine": {"cpu": "x", "bf16_flags": []},
        "threads": 2,
        "val_segments": 256,
    }
    md = "\n".join(quality.markdown(summary, records, meta))
    assert "| ours | bf16 | 3 | 2.360 ± 0.025 |" in md and md.index("ours | bf16") < md.index(
        "ours | fp32"
    )  # best first
    assert "`lucidrains@fp32-seed0`: ModuleNotFoundError" in md
    assert quality.plot(summary, records, tmp_path / "q.png").stat().st_size > 0


def test_row_segments_are_contiguous_per_row_and_wrap():
    import torch

    stream = torch.arange(10, dtype=torch.uint8)
    it = quality.row_segments(stream, batch=2, seg_len=3, starts=[0, 8])
    x, y = next(it)
    assert x.tolist() == [[0, 1, 2], [8, 9, 0]] and y.tolist() == [[1, 2, 3], [9, 0, 1]]
    x, _ = next(it)
    assert x.tolist() == [[3, 4, 5], [1, 2, 3]]


def books(root: Path) -> Path:
    text = "It was the best of times, it was the worst of times. " * 40
    for split, n in (("train", 2), ("validation", 1)):
        (root / split).mkdir(parents=True)
        for i in range(n):
            (root / split / f"{i}.txt").write_text(text[i:], encoding="utf-8")
    return root


@pytest.mark.slow
def test_tiny_budget_run_of_ours_is_stored_and_reused_and_missing_peers_are_skipped(tmp_path: Path, capsys):
    data, out = books(tmp_path / "pg19"), tmp_path / "out"
    argv = [
        "--workload",
        "tiny",
        "--impl",
        "ours,lucidrains",
        "--precisions",
        "fp32",
        "--seeds",
        "0",
        "--budget",
        "1",
        "--val-segments",
        "2",
        "--threads",
        "1",
        "--data",
        str(data),
        "--out",
        str(out),
    ]
    quality.main(argv)
    first = capsys.readouterr().out
    run = json.loads((out / "quality" / "ours@fp32-seed0.json").read_text())
    assert run["steps"] >= 1 and run["train_s"] >= 1.0 and 0 < run["val_bpc"] < 10
    assert run["val_tokens"] == 2 * 2 * 16  # 2 segments of the tiny workload's 2 streams x 16 bytes
    summary = json.loads((out / "quality.json").read_text())["summary"]
    assert summary["ours@fp32"]["val_bpc"]["mean"] == pytest.approx(run["val_bpc"])
    assert (out / "quality.md").exists() and (out / "quality.png").exists()
    installed = "skipping lucidrains" not in first
    if installed:
        assert (out / "quality" / "lucidrains@fp32-seed0.json").exists()
    quality.main(argv)
    assert "ours@fp32-seed0: reused" in capsys.readouterr().out
    assert json.loads((out / "quality" / "ours@fp32-seed0.json").read_text()) == run


def test_unknown_precision_or_missing_data_stop_with_one_line(tmp_path: Path):
    with pytest.raises(SystemExit, match="unknown 'fp8'"):
        quality.main(["--precisions", "fp8", "--data", str(tmp_path)])
    with pytest.raises(SystemExit, match="is not a directory"):
        quality.main(["--impl", "ours", "--data", str(tmp_path / "nowhere")])


def test_results_record_paths_inside_the_repository_relative_to_it(tmp_path):
    from benchmarks.common import ROOT, repo_path

    assert repo_path(ROOT / "benchmarks" / "impls" / "ours.py") == "benchmarks/impls/ours.py"
    assert repo_path(tmp_path / "x.txt") == str(tmp_path / "x.txt")
