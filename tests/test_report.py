"""`report`: a self-contained directory comparing trained runs (markdown, HTML, PNGs, JSON)."""

from __future__ import annotations

import json

import pytest
import torch

from compressive_transformer.analysis.report import analyze_run, markdown_to_html, write_report
from compressive_transformer.core.config import ConfigError
from compressive_transformer.inference.workflows import evaluate_run
from compressive_transformer.runs.rundir import build_config
from compressive_transformer.training.workflows import train_run

FAST = [
    "train.steps=3",
    "train.log_every=1",
    "train.checkpoint_every=0",
    "train.val_batches=1",
    "train.progress=false",
    "eval.max_batches=2",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("runs")
    ct, txl = root / "ct", root / "txl"
    train_run(build_config(None, FAST), ct, log=lambda _: None)
    train_run(build_config(None, FAST + ["model.cmem_len=0", "model.mem_len=24"]), txl, log=lambda _: None)
    evaluate_run(ct, split="validation", progress=False)
    return ct, txl


def test_report_compares_two_runs(runs, tmp_path):
    ct, txl = runs
    out = tmp_path / "report"
    md = write_report([ct, txl], out, max_segments=3, batch_size=2, log=lambda _: None)
    text = md.read_text()
    assert "| ct | compressive |" in text and "| txl | transformer-xl |" in text
    for png in (
        "curves_loss.png",
        "ct_attention_regions.png",
        "ct_compressibility.png",
        "ct_temporal_range.png",
        "txl_temporal_range.png",
        "frequency_buckets.png",
    ):
        assert (out / png).stat().st_size > 0, png
        assert f"]({png})" in text
    data = json.loads((out / "report.json").read_text())
    assert set(data["runs"]) == {"ct", "txl"} and data["runs"]["ct"]["eval"]["validation"]["bits_per_token"] > 0
    assert "Share of attention per region:\n\n| layer | " in text  # a table, one row per layer
    assert data["runs"]["txl"]["max_range"] == 2 * 24 and data["runs"]["ct"]["max_range"] == 2 * (16 + 2 * 8)
    regions = data["analyses"]["ct"]["regions"]
    assert [r["buckets"] for r in regions["regions"]] == [6, 6, 6] and len(regions["layers"]) == 2
    assert data["analyses"]["txl"]["regions"]["regions"][0]["buckets"] == 0  # no compressed memory
    assert len(data["analyses"]["ct"]["compressibility"]["over_training"]["steps"]) == 3
    assert data["frequency"]["gain_of"] == "txl over ct"
    html = (out / "report.html").read_text()
    assert '<img src="ct_attention_regions.png"' in html and "<table>" in html


def test_analyze_run_subset_and_errors(runs):
    ct, _ = runs
    a = analyze_run(ct, analyses=("temporal",), log=lambda _: None)
    assert set(a) == {"split", "max_segments", "temporal"}
    t = a["temporal"]
    assert 0 < t["empirical_range"] and t["theoretical_max_range"] == 2 * (16 + 2 * 8)
    with pytest.raises(ConfigError, match="unknown 'bogus'"):
        analyze_run(ct, analyses=("bogus",))
    with pytest.raises(ConfigError, match="at least one run"):
        write_report([], "unused")


def test_markdown_to_html_subset():
    html = markdown_to_html("# T\n\n| a | b |\n|---|---|\n| 1 | <2> |\n\n![x](p.png)\n\n    cmd --x\ntext")
    assert "<h1>T</h1>" in html and "<td>&lt;2&gt;</td>" in html and '<img src="p.png"' in html
    assert "<pre>cmd --x</pre>" in html and "<p>text</p>" in html


def test_analyze_says_once_where_it_wrote(runs, capsys):
    from compressive_transformer import cli

    ct, _ = runs
    assert cli.main(["analyze", str(ct), "--only", "temporal", "--max-segments", "2", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("wrote ") == 1 and f"wrote {ct / 'analysis' / 'report.md'}" in out, out
