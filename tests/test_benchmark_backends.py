"""benchmarks/backends.py: members per attention backend, the phases each runs on a CPU, and the target ratios per
backend in each precision and at each member's faster precision."""

from __future__ import annotations

import pytest

backends = pytest.importorskip("benchmarks.backends")


def test_members_name_their_backend_and_build_with_it():
    names = backends.expand(["ours", "lucidrains"], ["explicit", "fused"], ("ours", "ours_txl"))
    assert names == ["ours+explicit", "ours+fused", "lucidrains"]
    assert backends.expand(["ours"], [], ("ours",)) == ["ours"]
    assert backends.backend_variant("ours+sdpa-bias", {"mem_len": 4}) == (
        "ours",
        {"mem_len": 4, "attn_impl": "sdpa-bias"},
    )
    assert backends.backend_variant("labml", {}) == ("labml", {})


def result(train, evaluate, rss, mfu=None):
    return {
        "train": {"tokens_per_s": train, "peak_rss_mb": rss, "mfu": mfu},
        "eval": {"tokens_per_s": evaluate, "peak_rss_mb": rss},
    }


def test_targets_per_backend_in_each_precision_and_at_the_faster_one():
    impls = {
        "ours+explicit": result(130.0, 100.0, 90.0, 0.4),
        "ours+explicit@bf16": result(200.0, 150.0, 80.0, 0.3),
        "lucidrains": result(100.0, 100.0, 100.0),
        "lucidrains@bf16": result(150.0, 60.0, 95.0),
    }
    t = backends.backend_targets(impls)
    assert set(t) == {"ours+explicit", "ours+explicit@bf16", "ours+explicit@best"}
    assert t["ours+explicit"]["train_vs_lucidrains"] == pytest.approx(1.3)
    assert t["ours+explicit@bf16"]["eval_vs_lucidrains"] == pytest.approx(2.5)
    best = t["ours+explicit@best"]  # each side at its faster precision, per phase; memory at its lowest
    assert best["train_vs_lucidrains"] == pytest.approx(200 / 150)
    assert best["eval_vs_lucidrains"] == pytest.approx(150 / 100)
    assert best["peak_rss_train_vs_lucidrains"] == pytest.approx(80 / 95)
    assert best["train_mfu"] == pytest.approx(0.4)
    md = "\n".join(backends.markdown_lines(t))
    assert "| ours+explicit | 1.3 (met) | 1 (NOT met) | 0.9 (met)" in md
