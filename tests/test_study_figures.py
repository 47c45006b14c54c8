"""Every figure the study READMEs and docs/results.md quote from the agent and speech studies, recomputed from the
committed per-run and per-seed files: a stale or edited number fails here.

Each check builds the exact text a document quotes (a table row's cells, a sentence's numbers) from the results
files and asserts the document holds it; editing either side without the other breaks the match."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from compressive_transformer.agents.report import read_run_metrics, stability

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ROOT / "benchmarks" / "agents"
SPEECH = ROOT / "benchmarks" / "speech"
AGENT_RESULTS = "## Equal reach and a control: results (after the runs)"
FAIR_RESULTS = "### Fair comparison: results (after the runs)"
ARMS = ("lstm", "lstm40", "txl", "ct1", "ct4", "txl48")
DOC_ARM = {  # docs/results.md names the agent arms in words
    "lstm": "LSTM, 16-step unrolls",
    "lstm40": "LSTM, 40-step unrolls",
    "txl": "Transformer-XL, 18 slots",
    "ct1": "Compressive, c = 1",
    "ct4": "Compressive, c = 4",
    "txl48": "Transformer-XL, 48 slots",
}


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _flat(text: str) -> str:
    """Text with its line breaks and indentation folded to single spaces (a quoted sentence may wrap)."""
    return re.sub(r"\s+", " ", text)


def _finals(study: str, arm: str) -> str:
    seeds = json.loads(_text(AGENTS / study / "results.json"))["models"][arm]["final_by_seed"]
    return ", ".join(f"{seeds[str(s)]:.3f}" for s in (0, 1, 2))


def _section(text: str, heading: str) -> str:
    """The part of a markdown text under ``heading`` (a whole heading line), up to the next heading."""
    start = text.index(heading + "\n") + len(heading) + 1
    following = re.search(r"^#{1,6} ", text[start:], flags=re.M)
    return text[start : start + following.start()] if following else text[start:]


def _row(text: str, first_cell: str) -> list[str]:
    rows = [line for line in text.splitlines() if line.startswith(f"| {first_cell} |")]
    assert len(rows) == 1, f"one table row starting {first_cell!r}, found {len(rows)}"
    return [c.strip() for c in rows[0].strip().strip("|").split("|")]


@pytest.mark.parametrize("arm", ARMS)
def test_agent_final_success_per_seed_as_quoted(arm: str) -> None:
    control, reach = _finals("control", arm), _finals("reach", arm)
    readme = _row(_section(_text(AGENTS / "README.md"), AGENT_RESULTS), f"`{arm}`")
    assert readme[2] == control and readme[3].startswith(reach), readme
    doc = _row(_section(_text(ROOT / "docs" / "results.md"), "## Agents"), DOC_ARM[arm])
    assert doc[2] == control and doc[3] == reach, doc


def _stable(study: str, run: str) -> dict:
    return stability(read_run_metrics(AGENTS / study / "runs" / run))


def test_agent_drops_and_windowed_ends_as_quoted() -> None:
    readme, results = _flat(_text(AGENTS / "README.md")), _flat(_text(ROOT / "docs" / "results.md"))
    ct4 = [len(_stable("full", f"ct4-seed{s}")["drops"]) for s in (0, 1, 2)]
    txl48 = [len(_stable("reach", f"txl48-seed{s}")["drops"]) for s in (0, 1, 2)]
    said = lambda n: f"{n[0]}, {n[1]} and {n[2]} times"  # noqa: E731
    assert f"`txl48` fell {said(txl48)} by seed and `ct4` {said(ct4)}" in readme
    assert f"`ct4` drops {said(ct4)} by seed and `txl48` {said(txl48)}" in readme
    ends = ", ".join(f"{_stable('full', f'ct4-seed{s}')['final']:.3f}" for s in (0, 1, 2))
    assert f"({ends} over the last 200 episodes)" in readme and f"({ends} over the last 200 episodes;" in results
    seed2 = _stable("full", "ct4-seed2")["drops"]
    collapse = max(seed2, key=lambda d: (d["recovered_at"] or 2e6) - d["at"])  # the long one
    span = f"from {collapse['at'] / 1e6:.2f} M to {collapse['recovered_at'] / 1e6:.2f} M steps"
    assert span in readme and span in results
    last = _stable("reach", "txl48-seed1")
    fall = last["drops"][-1]
    assert f"({fall['lowest']:.2f} at {fall['at'] / 1e6:.2f} M steps, back to {last['final']:.3f}" in readme


def test_agent_parameter_counts_as_quoted() -> None:
    from benchmarks.agents.run import arm_parameters
    from compressive_transformer.core.config import load_toml

    spec = load_toml(AGENTS / "control.toml")
    spec["config"] = str(ROOT / spec["config"])
    n = {arm: f"{arm_parameters(spec, arm)['total']:,}" for arm in ARMS}
    embedding = arm_parameters(spec, "txl")["observation_embedding"]
    quoted = (
        f"(observation embedding, {embedding}, included): LSTM {n['lstm']}; Transformer-XL (18 or 48 slots) "
        f"{n['txl']}; c = 1 {n['ct1']}; c = 4 {n['ct4']}."
    )
    assert n["lstm"] == n["lstm40"] and n["txl"] == n["txl48"]
    assert quoted in _flat(_text(ROOT / "docs" / "results.md"))
    assert quoted in _flat(_text(AGENTS / "README.md"))


def _speech_bits(folder: str, variant: str) -> dict[int, float]:
    out = {}
    for path in sorted((SPEECH / folder / "results" / variant).glob("seed-*.json")):
        r = json.loads(_text(path))
        out[int(r["seed"])] = r["evaluations"]["train"]["test"]["bits_per_char"]
    return out


FAIR_ARMS = {  # the speech README's first cell -> variant; docs/results.md's
    "`transformer-xl` (reused)": ("transformer-xl", "Transformer-XL"),
    "`compressive` (reused)": ("compressive", "Compressive Transformer"),
    "`transformer-xl-wide`": ("transformer-xl-wide", "Transformer-XL, wider FFN (equal parameters)"),
    "`wavenet30`, lr 3e-3": ("wavenet30", "WaveNet, 30 layers, lr 3e-3 from a sweep"),
    "`wavenet30-cpu`, lr 3e-3": ("wavenet30-cpu", "the same WaveNet at the Compressive Transformer's CPU time"),
}


@pytest.mark.parametrize("cell", FAIR_ARMS)
def test_speech_fair_scores_as_quoted(cell: str) -> None:
    variant, doc_name = FAIR_ARMS[cell]
    arm = json.loads(_text(SPEECH / "fair" / "comparisons.json"))["arms"][variant]
    bits = _speech_bits("fair", variant)
    assert {str(k): v for k, v in bits.items()} == arm["bits"]
    score = f"{arm['interval']['mean']:.4f} ± {arm['interval']['half_width']:.4f}"
    row = _row(_section(_text(SPEECH / "README.md"), FAIR_RESULTS), cell)
    assert row[1] == f"{arm['parameters']:,}" and row[2] == str(arm["updates"])
    assert row[5] == score and row[6] == ", ".join(f"{bits[s]:.4f}" for s in sorted(bits))
    if arm["train_cpu_seconds_mean"]:
        assert row[3] == f"{arm['train_cpu_seconds_mean']:.0f}"
    doc = _row(_section(_text(ROOT / "docs" / "results.md"), "## Speech"), doc_name)
    assert doc[4] == score


def test_speech_fair_differences_and_cpu_time_as_quoted() -> None:
    judged = json.loads(_text(SPEECH / "fair" / "comparisons.json"))["judged"]
    readme, results = _flat(_text(SPEECH / "README.md")), _flat(_text(ROOT / "docs" / "results.md"))
    top = _flat(_text(ROOT / "README.md"))
    for d in judged:
        iv, seeds = d["interval"], ", ".join(f"{v:+.3f}" for v in d["per_seed"].values())
        quoted = f"= {iv['mean']:+.3f} ({seeds}), interval [{iv['low']:+.3f}, {iv['high']:+.3f}]"
        if d["a"] == "compressive":  # the README words this one's per-seed list as "per seed ..."
            quoted = f"= {iv['mean']:+.3f} (per seed {seeds}), interval [{iv['low']:+.3f}, {iv['high']:+.3f}]"
        assert quoted in readme, quoted
        assert f"({iv['mean']:+.3f}, [{iv['low']:+.3f}, {iv['high']:+.3f}])" in results or d["a"] == "compressive"
    ct = judged[0]["interval"]
    minus = lambda x: f"{x:+.2f}".replace("-", "−")  # noqa: E731  (README.md's typographic minus)
    assert f"{ct['mean']:+.3f} bits/sample, interval [{minus(ct['low'])}, {minus(ct['high'])}]" in top
    assert f"interval 0.{round((ct['high'] - ct['low']) * 100):02d} wide" in readme
    cpu = [
        json.loads(_text(p))["cpu_seconds"]["train"]["seconds"]
        for p in sorted((SPEECH / "rerun" / "results" / "compressive").glob("seed-*.json"))
    ]
    measured = sum(cpu) / len(cpu)
    wavenet = json.loads(_text(SPEECH / "fair" / "comparisons.json"))["arms"]["wavenet30"]["train_cpu_seconds_mean"]
    share = f"{wavenet / measured:.0%} of the CPU time ({wavenet:.0f} against the {measured:.0f} s"
    assert share in readme
    assert f"with {wavenet / measured:.0%} of its CPU time ({wavenet:.0f} against the {measured:.0f} s" in results
