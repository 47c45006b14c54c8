"""The tokenizer-sample study (benchmarks/tokenizer_sample): its decision rule, and every figure its README and
results.md quote, recomputed from the committed results.json; the draws its README listed before the runs are the
draws the runs recorded."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from benchmarks.tokenizer_sample.run import ARMS, BASELINE, render, summarize, verdict

STUDY = Path(__file__).resolve().parents[1] / "benchmarks" / "tokenizer_sample"


def _results() -> dict:
    return json.loads((STUDY / "results.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (0.01, 0.02, "costs, within the margin"),
        (0.01, 0.05, "costs"),
        (-0.02, 0.02, "no cost"),
        (-0.02, -0.01, "gains and no cost"),
        (-0.05, -0.01, "gains"),
        (-0.01, 0.05, "not distinguishable"),
        (-0.05, 0.01, "not distinguishable"),
    ],
)
def test_verdict_follows_the_readme_rule(low: float, high: float, expected: str) -> None:
    assert verdict(low, high, margin=0.03) == expected


def _record(arm: str, seed: int, bpc: float, tokens: int = 100) -> dict:
    return {"arm": arm, "seed": seed, "test_bits_per_char": bpc, "test_tokens": tokens}


def test_summary_pairs_only_seeds_every_arm_finished() -> None:
    runs = [_record(a, s, 2.0 + 0.01 * s + (0.1 if a != BASELINE else 0.0)) for s in (0, 1, 2) for a in ARMS]
    runs.append(_record(BASELINE, 3, 9.0))  # an interrupted seed: only its first arm finished
    summary = summarize(runs)
    assert summary["seeds"] == [0, 1, 2]
    for arm in ARMS:
        if arm != BASELINE:
            iv = summary["arms"][arm]["bits_per_char_minus_full"]["interval"]
            assert iv["mean"] == pytest.approx(0.1) and iv["half_width"] == pytest.approx(0.0, abs=1e-12)
            assert summary["arms"][arm]["verdict"] == "costs"


def test_results_md_and_summary_are_recomputed_from_the_runs() -> None:
    record = _results()
    assert record["summary"] == summarize(record["runs"])
    assert (STUDY / "results.md").read_text(encoding="utf-8") == render(record)


def test_each_run_drew_what_the_readme_listed_before_the_runs() -> None:
    readme = (STUDY / "README.md").read_text(encoding="utf-8")
    listed = {}
    for line in readme.splitlines():
        m = re.match(r"\s*\| (\d) \| [^|]+ \| ([\d,]+) \| [^|]+ \| ([\d,]+) \|$", line)
        if m:
            listed[int(m[1])] = {"one-book": int(m[2].replace(",", "")), "middle": int(m[3].replace(",", ""))}
    assert sorted(listed) == [0, 1, 2, 3, 4]
    runs = _results()["runs"]
    for r in runs:
        expected = r["train_split_bytes"] if r["arm"] == BASELINE else listed[r["seed"]][r["arm"]]
        assert r["sample_bytes_drawn"] == expected, (r["arm"], r["seed"])
    assert {r["arm"] for r in runs} == set(ARMS)


def _readme_results() -> str:
    text = (STUDY / "README.md").read_text(encoding="utf-8")
    return re.sub(r"\s+", " ", text[text.index("## Results (after the runs)") :])


@pytest.mark.parametrize("arm", [a for a in ARMS if a != BASELINE])
def test_readme_table_row_as_in_the_results(arm: str) -> None:
    s = _results()["summary"]["arms"][arm]
    d = s["bits_per_char_minus_full"]
    iv = d["interval"]
    per_seed = ", ".join(f"{d['per_seed'][str(k)]:+.3f}" for k in range(5)).replace("+-", "-")
    cells = f"| {iv['mean']:+.4f} ± {iv['half_width']:.4f} [{iv['low']:+.4f}, {iv['high']:+.4f}] | {per_seed} |"
    assert f"{cells} {s['verdict']} |" in _readme_results()


def test_readme_figures_as_in_the_results() -> None:
    record, text = _results(), _readme_results()
    full = [r["test_bits_per_char"] for r in record["runs"] if r["arm"] == BASELINE]
    tokens = record["summary"]["arms"]["one-book"]["test_tokens_ratio_minus_1"]["interval"]
    cpu = sum(r["train_cpu_seconds"] for r in record["runs"])
    assert f"All {len(record['runs'])} runs finished" in text
    assert f"{cpu:.0f} s of training CPU time" in text
    assert f"{min(full):.4f} - {max(full):.4f} bits/char" in text
    assert f"(standard deviation {statistics.stdev(full):.3f})" in text
    assert f"+{100 * tokens['mean']:.1f}% ± {100 * tokens['half_width']:.1f}% on average" in text
    assert f"source at commit {record['src_commit'][:7]}" in text
