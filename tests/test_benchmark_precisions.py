"""benchmarks/bench.py --precisions: members keyed impl / impl@bf16, targets per precision and with every
implementation at its faster precision, MFU against the matmul rate of the member's precision."""

from __future__ import annotations

import pytest

bench = pytest.importorskip("benchmarks.bench")
workloads = pytest.importorskip("benchmarks.workloads")


def phase(tokens_per_s: float) -> dict:
    return {"tokens_per_s": tokens_per_s, "tokens_per_step": 64, "min_s": 64 / tokens_per_s, "peak_rss_mb": 300.0}


def results() -> dict:
    impls = {
        "ours": {"train": phase(100.0), "eval": phase(400.0)},
        "lucidrains": {"train": phase(90.0), "eval": phase(300.0)},
        "ours@bf16": {"train": phase(200.0), "eval": phase(900.0)},
        "lucidrains@bf16": {"train": phase(80.0), "eval": phase(500.0)},
    }
    machine = {"cpu": "Some CPU", "nproc": 2, "bf16_flags": ["avx512_bf16"]}
    return {
        "impls": impls,
        "machine": machine,
        "matmul": {"n": 512, "gflops": 10.0, "before": 10.0, "after": 10.0},
        "matmul_bf16": {"n": 512, "gflops": 40.0},
        "matmul_precisions": {"n": 1024, "fp32_gflops": 10.0, "bf16_gflops": 35.0},
        "precisions": ["fp32", "bf16"],
        "date": "d",
        "torch": "t",
        "threads": 2,
        "load_start": [],
        "load_end": [],
        "steps": 2,
        "warmup": 1,
        "rounds": 1,
        "gen_rounds": 1,
    }


def test_keys_name_the_precision_only_when_it_is_not_fp32():
    assert bench.member_key("ours", "fp32") == "ours" and bench.member_key("ours", "bf16") == "ours@bf16"
    assert bench.split_key("ours@bf16") == ("ours", "bf16") and bench.split_key("labml") == ("labml", "fp32")


def test_targets_in_each_precision_and_at_each_implementations_faster_one():
    res, w = results(), workloads.get("tiny")
    bench.derive(res, w)
    assert res["targets"]["train_vs_fastest_peer"]["value"] == pytest.approx(100 / 90)
    assert res["targets_bf16"]["train_vs_fastest_peer"]["value"] == pytest.approx(200 / 80)
    # lucidrains trains faster in fp32 (90 > 80), ours in bf16: each compared at its faster precision
    assert res["best_precision"] == {"ours": "bf16", "lucidrains": "fp32"}
    assert res["targets_best"]["train_vs_fastest_peer"]["value"] == pytest.approx(200 / 90)
    assert res["targets_best"]["eval_vs_fastest_peer"]["value"] == pytest.approx(900 / 300)  # lucidrains' fp32 row
    flops = workloads.train_flops_per_token(w)
    assert res["impls"]["ours"]["train"]["mfu"] == pytest.approx(flops * 100 / 10e9)
    assert res["impls"]["ours@bf16"]["train"]["mfu"] == pytest.approx(flops * 200 / 40e9)  # against the bf16 rate
    md = bench.markdown(res, w)
    assert "Targets, bf16 autocast:" in md and "Faster precision: ours bf16, lucidrains fp32" in md
    assert "has bf16 instructions (avx512_bf16)" in md and "(3.50x fp32)" in md
    assert "| ours@bf16 |" in md


def test_machine_info_says_whether_the_cpu_has_bf16_instructions():
    info = bench.machine_info()
    assert info["has_bf16_instructions"] == bool(info["bf16_flags"])
    assert set(info["bf16_flags"]) <= {"avx512_bf16", "amx_bf16"}
