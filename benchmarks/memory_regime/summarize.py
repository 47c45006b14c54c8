"""Tables and plots of the memory-regime study from the study runner's result files.

    python -m benchmarks.memory_regime.summarize stage1   # benchmarks/memory_regime/stage1/summary.md + screen.png
                                                          # (from screen/*.json and stage1.toml)
    python -m benchmarks.memory_regime.summarize stage2   # benchmarks/memory_regime/stage2/summary.md + recovered.png

Stage 1 (one seed per cell): the cost of cutting a Transformer-XL's memory at evaluation, in bits per character
and per lookback bucket (bits per token of the tokens whose word last occurred that far back). Stage 2 (seeds x
arms): each arm's test bits per character, the fraction of the ceiling gap each compressed memory recovers (per seed,
and as a ratio of the mean gaps with Fieller's 95% interval, paired by seed; see analysis/ceiling.py), and the loss
by lookback against the baseline.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from compressive_transformer.analysis.ceiling import recovered_fraction
from compressive_transformer.analysis.stats import mean_interval, paired_differences
from compressive_transformer.core.fileio import write_text_atomic

HERE = Path(__file__).resolve().parent
STAGE2_ARMS = {
    "baseline": "Transformer-XL at the CT's attention cost (baseline)",
    "ct-conv-attention": "Compressive, conv + attention reconstruction",
    "ct-maxpool": "Compressive, max pool, no compression loss",
    "ceiling": "Transformer-XL with the CT's reach uncompressed (ceiling)",
}
COMPRESSED = ("ct-conv-attention", "ct-maxpool")


def load(out: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """variant -> seed -> result, from OUT/results/VARIANT/seed-S.json."""
    runs: dict[str, dict[int, dict[str, Any]]] = {}
    for path in sorted((out / "results").glob("*/seed-*.json")):
        r = json.loads(path.read_text(encoding="utf-8"))
        runs.setdefault(r["variant"], {})[int(r["seed"])] = r
    return runs


def machine_line(result: dict[str, Any]) -> str:
    m = result.get("machine") or {}
    flags = " ".join(m.get("cpu_flags") or [])
    return (
        f"{m.get('cpu', '?')} ({flags}), torch {m.get('torch', '?')}, {m.get('torch_threads', '?')} thread(s) per run"
    )


# ---------------------------------------------------------------------------------------------------------------
# stage 1


CUTS = ("half", "quarter", "eighth")


STAGE1_SPECS = ("stage1.toml", "stage1-long.toml")  # the cells up to 1.54M training bytes, and at 4.1M


def stage1(out: Path, split: str = "validation") -> str:
    """From the screen's files (``screen/CELL.json``) and the cells' configs in the stage-1 specs."""
    from compressive_transformer.experiments.study import load_study

    specs = [load_study(HERE / name) for name in STAGE1_SPECS]
    owner = {name: spec for spec in specs for name in spec.configs}  # cell -> the spec that defines it
    cells = {}
    for name in owner:
        path = HERE / "screen" / f"{name}.json"
        if path.is_file():
            cells[name] = json.loads(path.read_text(encoding="utf-8"))
    lines = [
        "# Stage 1: the cost of cutting Transformer-XL's memory at evaluation",
        "",
        "One seed per cell, bytes. Each cell's model is trained with the memory in the `memory` column and evaluated on",
        f"the same slice of the {split} split (the first 100 segments of 16 streams, `screen.py`; the PG-19 sample's two",
        "validation books fill only 2 streams, 12,800 bytes, so its width-128 cell was re-scored on 800 segments of each;",
        "the bytes scored are in the table) with it and with 1/2, 1/4 and",
        "1/8 of it; the cost of a cut is bits/byte(cut) - bits/byte(training memory): positive means the model uses the",
        "memory that was cut. Training bytes are updates x batch x segment.",
        "",
        "| cell | width | segment | updates x batch | train bytes | memory | bytes scored | bits/byte | cost at 1/2 | cost at 1/4 | cost at 1/8 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = []
    for name, r in cells.items():
        cfg = owner[name].configs[name]
        mems = [owner[name].lengths(name, ev)[1] for ev in ("train",) + CUTS]
        bpb = [r["memories"][str(m)]["bits_per_byte"] for m in mems]
        costs = [b - bpb[0] for b in bpb[1:]]
        rows.append((name, costs))
        tokens = cfg.train.steps * cfg.train.batch_size * cfg.model.seg_len
        lines.append(
            f"| {name} | {cfg.model.d_model} | {cfg.model.seg_len} | {cfg.train.steps} x {cfg.train.batch_size} | "
            f"{tokens / 1e6:.2f}M | {'/'.join(map(str, mems))} | {r['memories'][str(mems[0])]['predicted_bytes']:,} | "
            f"{bpb[0]:.4f} | " + " | ".join(f"{c:+.4f}" for c in costs) + " |"
        )
    lines += [
        "",
        "Cost of the 1/8 cut by lookback bucket: bits per token of the tokens whose word last occurred that many tokens",
        "before the start of its segment (`in segment`: visible without memory), cut minus full memory; the number of",
        "tokens in the bucket in brackets. Where a document was cut into several streams the lookback is still counted",
        "from the document's start, so the buckets are approximate for the PG-19 and enwik8 slices.",
        "",
    ]
    if cells:
        first = next(iter(cells.values()))
        names = list(first["memories"][str(first["train_mem_len"])]["lookback"]["buckets"])
        lines += ["| cell | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for name, r in cells.items():
            full_mem = str(owner[name].lengths(name, "train")[1])
            cut_mem = str(owner[name].lengths(name, "eighth")[1])
            full = r["memories"][full_mem]["lookback"]["buckets"]
            cut = r["memories"][cut_mem]["lookback"]["buckets"]
            txt = []
            for k in names:
                a, b = full[k]["bits_per_token"], cut[k]["bits_per_token"]
                txt.append(f"{b - a:+.3f} ({full[k]['tokens']})" if a is not None and b is not None else "-")
            lines.append(f"| {name} | " + " | ".join(txt) + " |")
        m = first.get("machine") or {}
        lines += [
            "",
            f"Machine: {m.get('cpu', '?')} ({' '.join(m.get('cpu_flags') or [])}), torch {m.get('torch', '?')}.",
        ]
    missing = [n for n in owner if n not in cells]
    if missing:
        lines += ["", f"Not run: {', '.join(missing)}."]
    text = "\n".join(lines) + "\n"
    write_text_atomic(out / "summary.md", text)
    if cells:
        _plot_stage1(owner, cells, out / "screen.png")
    return text


def _plot_stage1(owner: dict[str, Any], cells: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for name, r in cells.items():
        order = ("train",) + CUTS
        mems = [owner[name].lengths(name, ev)[1] for ev in order]
        full = r["memories"][str(mems[0])]["bits_per_byte"]
        costs = [r["memories"][str(m)]["bits_per_byte"] - full for m in mems]
        ax.plot(mems, costs, marker="o", label=name, ls="-" if "w128" in name or "4M" in name else "--")
    ax.set_xscale("log", base=2)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("memory at evaluation (slots)")
    ax.set_ylabel("bits/byte lost against the training memory")
    ax.set_title("Stage 1: what cutting Transformer-XL's memory costs (validation slice)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------------
# stage 2


def _per_seed(runs: dict[int, dict[str, Any]], split: str, get) -> dict[int, float]:
    return {s: get(r["evaluations"]["train"][split]) for s, r in runs.items()}


def stage2(out: Path, split: str = "test") -> str:
    runs = load(out)
    missing = [a for a in STAGE2_ARMS if a not in runs]
    bpc = {a: _per_seed(runs[a], split, lambda e: e["bits_per_char"]) for a in STAGE2_ARMS if a in runs}
    lines = [
        "# Stage 2: fraction of the ceiling gap recovered",
        "",
        f"{split} split, bits per character; means ± 95% Student-t intervals over seeds; Δ is the paired difference",
        "to the baseline on the same seed (negative is better).",
        "",
        "| arm | seeds | bits/char | Δ to baseline | per seed |",
        "|---|---|---|---|---|",
    ]
    for arm, label in STAGE2_ARMS.items():
        if arm not in bpc:
            lines.append(f"| {label} | 0 | not run yet | | |")
            continue
        iv = mean_interval(list(bpc[arm].values()))
        delta = ""
        if arm != "baseline" and "baseline" in bpc:
            d = paired_differences(bpc[arm], bpc["baseline"])["interval"]
            delta = f"{d['mean']:+.4f} ± {d['half_width']:.4f}" if d["half_width"] is not None else f"{d['mean']:+.4f}"
        per = ", ".join(f"{v:.4f}" for _, v in sorted(bpc[arm].items()))
        lines.append(f"| {label} | {iv.n} | {iv.format(4)} | {delta} | {per} |")
    fractions = {}
    if {"baseline", "ceiling"} <= set(bpc):
        lines += ["", "Fraction of the ceiling gap recovered, (baseline − CT) / (baseline − ceiling):", ""]
        lines += ["| compressed memory | per seed | ratio of mean gaps [95% Fieller interval] |", "|---|---|---|"]
        for arm in COMPRESSED:
            if arm not in bpc:
                continue
            f = recovered_fraction(bpc["baseline"], bpc[arm], bpc["ceiling"])
            fractions[arm] = f
            per = ", ".join(f"{v:.2f}" if v is not None else "-" for v in f["per_seed"].values())
            fr = f["fraction"]
            interval = f"[{fr['low']:.2f}, {fr['high']:.2f}]" if fr["low"] is not None else "[unbounded]"
            lines.append(f"| {STAGE2_ARMS[arm]} | {per} | {fr['ratio']:.2f} {interval} |")
        gap = mean_interval(
            [bpc["baseline"][s] - bpc["ceiling"][s] for s in sorted(set(bpc["baseline"]) & set(bpc["ceiling"]))]
        )
        lines += ["", f"Ceiling gap (baseline − ceiling): {gap.format(4)} bits/char over {gap.n} seeds."]
    lines += _lookback_table(runs, split)
    if missing:
        lines += ["", f"Not finished yet: {', '.join(missing)}."]
    first = next(iter(next(iter(runs.values())).values())) if runs else None
    if first:
        lines += ["", f"Machine: {machine_line(first)}."]
    text = "\n".join(lines) + "\n"
    write_text_atomic(out / "summary.md", text)
    (out / "recovered.json").write_text(json.dumps({"bits_per_char": bpc, "recovered": fractions}, indent=1) + "\n")
    if {"baseline", "ceiling"} <= set(bpc):
        _plot_stage2(runs, bpc, fractions, split, out / "recovered.png")
    return text


def _lookback_table(runs: dict[str, dict[int, dict[str, Any]]], split: str) -> list[str]:
    if "baseline" not in runs:
        return []
    base = runs["baseline"]
    names = list(next(iter(base.values()))["evaluations"]["train"][split]["lookback"]["buckets"])
    lines = [
        "",
        "Loss by lookback: bits per token, paired difference to the baseline (mean ± 95% over seeds); the bucket is how",
        "far before its segment's start the token's word last occurred (tokens per bucket in the header, seed 0).",
        "",
    ]
    counts = next(iter(base.values()))["evaluations"]["train"][split]["lookback"]["buckets"]
    lines += ["| arm | " + " | ".join(f"{k} ({counts[k]['tokens']})" for k in names) + " |"]
    lines += ["|---|" + "---|" * len(names)]
    for arm, label in STAGE2_ARMS.items():
        if arm not in runs:
            continue
        row = []
        for k in names:
            get = lambda e, k=k: e["lookback"]["buckets"][k]["bits_per_token"]  # noqa: E731
            mine = _per_seed(runs[arm], split, get)
            if arm == "baseline":
                row.append(mean_interval(list(mine.values())).format(3))
            else:
                d = paired_differences(mine, _per_seed(base, split, get))["interval"]
                row.append(
                    f"{d['mean']:+.3f} ± {d['half_width']:.3f}" if d["half_width"] is not None else f"{d['mean']:+.3f}"
                )
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    return lines


def _plot_stage2(runs, bpc, fractions, split: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.6]})
    for i, arm in enumerate(a for a in COMPRESSED if a in fractions):
        f = fractions[arm]
        seeds = [v for v in f["per_seed"].values() if v is not None]
        left.scatter([i] * len(seeds), seeds, color="grey", zorder=3, label="one seed" if i == 0 else None)
        fr = f["fraction"]
        if fr["low"] is not None:
            left.errorbar(
                [i + 0.15],
                [fr["ratio"]],
                yerr=[[fr["ratio"] - fr["low"]], [fr["high"] - fr["ratio"]]],
                fmt="o",
                color="C0",
                capsize=4,
                label="ratio of mean gaps, 95% Fieller" if i == 0 else None,
            )
        else:
            left.scatter(
                [i + 0.15],
                [fr["ratio"]],
                color="C0",
                marker="x",
                label="ratio (interval unbounded)" if i == 0 else None,
            )
    left.axhline(0, color="grey", lw=0.8)
    left.axhline(1, color="green", lw=0.8, ls="--")
    left.set_xticks(range(len(COMPRESSED)), ["conv + attention rec.", "max pool"])
    left.set_ylabel("fraction of the ceiling gap recovered")
    left.set_title("0 = baseline, 1 = ceiling")
    left.legend(fontsize=7)
    base = runs["baseline"]
    names = list(next(iter(base.values()))["evaluations"]["train"][split]["lookback"]["buckets"])
    for j, arm in enumerate(a for a in ("ct-conv-attention", "ct-maxpool", "ceiling") if a in runs):
        means, errs = [], []
        for k in names:
            get = lambda e, k=k: e["lookback"]["buckets"][k]["bits_per_token"]  # noqa: E731
            d = paired_differences(_per_seed(runs[arm], split, get), _per_seed(base, split, get))["interval"]
            means.append(d["mean"])
            errs.append(d["half_width"] or 0.0)
        xs = [x + (j - 1) * 0.25 for x in range(len(names))]
        right.errorbar(xs, means, yerr=errs, fmt="o", capsize=3, label=STAGE2_ARMS[arm])
    right.axhline(0, color="grey", lw=0.8)
    right.set_xticks(range(len(names)), names, rotation=30, fontsize=7)
    right.set_ylabel("bits/token against the baseline (lower is better)")
    right.set_xlabel("how far back the token's word last occurred")
    right.legend(fontsize=7)
    fig.suptitle(f"Where a longer or compressed memory pays ({split} split, paired by seed)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str]) -> None:
    stage = argv[0] if argv else "stage1"
    out = Path(argv[1]) if len(argv) > 1 else HERE / stage
    print({"stage1": stage1, "stage2": stage2}[stage](out))


if __name__ == "__main__":
    main(sys.argv[1:])
