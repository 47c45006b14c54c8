"""The ablation's paired comparisons with Holm's correction for multiplicity.

    python -m benchmarks.ablation.holm            # writes benchmarks/ablation/holm.md

Two families of nine comparisons each, on the test books' bits per character at the training memory lengths:
every cell against conv x attention (the paper's best), and Transformer-XL against every cell. Each comparison is a
paired t-test over the three seeds (two degrees of freedom, two-sided); Holm's step-down procedure then controls the
family-wise error rate at 5% within each family.
"""

from __future__ import annotations

import json
from pathlib import Path

from compressive_transformer.analysis.stats import holm, paired_differences
from compressive_transformer.core.fileio import write_text_atomic

HERE = Path(__file__).resolve().parent
SPLIT = "test"


def per_seed(variant: str) -> dict[int, float]:
    out = {}
    for path in sorted((HERE / "results" / variant).glob("seed-*.json")):
        r = json.loads(path.read_text(encoding="utf-8"))
        out[int(r["seed"])] = r["evaluations"]["train"][SPLIT]["bits_per_char"]
    return out


def paired_p(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, float]:
    """(mean difference a - b, half-width of its 95% interval, two-sided p of the paired t-test)."""
    d = paired_differences(a, b)
    return d["interval"]["mean"], d["interval"]["half_width"], d["p"]


def family(title: str, pairs: list[tuple[str, str, str]]) -> list[str]:
    rows = [paired_p(per_seed(a), per_seed(b)) for _, a, b in pairs]
    adj = holm([p for *_, p in rows])
    lines = [
        f"### {title}",
        "",
        "| comparison | Δ bits/char (95%) | p (paired t, 2 df) | Holm-adjusted p |",
        "|---|---|---|---|",
    ]
    for (label, _, _), (mean, hw, p), q in zip(pairs, rows, adj):
        lines.append(f"| {label} | {mean:+.4f} ± {hw:.4f} | {p:.3f} | {q:.3f}{' **' if q < 0.05 else ''} |")
    survivors = sum(q < 0.05 for q in adj)
    lines += ["", f"{survivors} of {len(pairs)} comparisons survive Holm's correction at 5%.", ""]
    return lines


def main() -> None:
    cells = sorted(p.name for p in (HERE / "results").iterdir() if p.is_dir())
    others = [c for c in cells if c not in ("conv-attention", "transformer-xl")]
    best = [(f"{c} − conv-attention", c, "conv-attention") for c in others + ["transformer-xl"]]
    txl = [(f"transformer-xl − {c}", "transformer-xl", c) for c in cells if c != "transformer-xl"]
    lines = [
        "# The ablation's comparisons, corrected for multiplicity",
        "",
        "Test books, bits per character at the training memory lengths, seeds 0, 1, 2 (`results/*/seed-*.json`).",
        "Δ is the paired mean difference (negative: the first is better) with its 95% Student-t half-width; p is the",
        "two-sided paired t-test; Holm's step-down adjustment is within each family of nine.",
        "",
        *family("Every cell against conv × attention", best),
        *family("Transformer-XL against every cell (negative: Transformer-XL is better)", txl),
        "Reproduce: `python -m benchmarks.ablation.holm`.",
        "",
    ]
    text = "\n".join(lines)
    write_text_atomic(HERE / "holm.md", text)
    print(text)


if __name__ == "__main__":
    main()
