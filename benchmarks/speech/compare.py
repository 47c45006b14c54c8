"""The speech study's judged comparisons: paired differences over seeds with Bonferroni-corrected t intervals, and
each arm's cost beside its bits per sample.

    python -m benchmarks.speech.compare benchmarks/speech/fair [--split test] [--design fair|tuned]

Reads ``DIR/results/VARIANT/seed-S.json`` (the study runner's per-seed files) and ``DIR/cost.json`` (the cost
pilot); writes ``DIR/comparisons.md`` and ``DIR/comparisons.json``. The comparisons and their family size are the
pre-registered ones (README.md, "Fair comparison"); a comparison whose arms have not finished is left out. Each
run's provenance (code commit, data fingerprint) is listed, run by run where the runs differ, apart from the code and
machine that made the comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from compressive_transformer.analysis.stats import mean_interval, paired_differences
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.runs.provenance import code_label, mixed_lines, report_provenance

JUDGED = (  # (a, b): the interval of a - b decides; the README says which side each prediction expects
    ("compressive", "transformer-xl-wide"),
    ("wavenet30", "compressive"),
    ("wavenet30-cpu", "compressive"),
)
REPORTED = (("transformer-xl-wide", "transformer-xl"), ("compressive", "transformer-xl"), ("wavenet30", "wavenet20"))
# the cost pilot measured the 30-layer WaveNet under its sweep name; the learning rate does not change its cost
COST_OF = {"wavenet30": "wavenet30-lr1e-3", "wavenet30-cpu": "wavenet30-lr1e-3"}
# each pre-registered design: (judged, reported, cost names); "tuned" is README.md's "Tuned transformers"
DESIGNS = {
    "fair": (JUDGED, REPORTED, COST_OF),
    "tuned": (
        (("compressive", "transformer-xl-wide"), ("wavenet30", "compressive"), ("wavenet30", "transformer-xl-wide")),
        (),
        {},
    ),
}


def per_seed(folder: Path, variant: str, split: str) -> dict[int, dict[str, Any]]:
    out = {}
    for path in sorted((folder / "results" / variant).glob("seed-*.json")):
        r = json.loads(path.read_text(encoding="utf-8"))
        out[int(r["seed"])] = r
    return out


def arm(
    folder: Path, variant: str, split: str, cost: dict[str, Any], cost_of: dict[str, str] = COST_OF
) -> dict[str, Any] | None:
    runs = per_seed(folder, variant, split)
    if not runs:
        return None
    provenance = {f"{variant} seed {s}": r.get("provenance") for s, r in sorted(runs.items())}
    bits = {s: r["evaluations"]["train"][split]["bits_per_char"] for s, r in runs.items()}
    train = {s: (r.get("cpu_seconds") or {}).get("train") for s, r in runs.items()}
    cpu = [t["seconds"] for t in train.values() if t]
    c = cost.get(cost_of.get(variant, variant), {})
    updates = runs[min(runs)]["identity"]["config"]["train.steps"]
    return {
        "parameters": runs[min(runs)]["parameters"]["total"],
        "updates": updates,
        "bits": bits,
        "interval": mean_interval(list(bits.values())).to_dict(),
        "train_cpu_seconds": {str(s): (t["seconds"] if t else None) for s, t in train.items()},
        "train_cpu_seconds_mean": sum(cpu) / len(cpu) if cpu else None,
        "pilot_cpu_seconds": c["cpu_seconds_per_update"] * updates if c else None,
        "train_flops": c["flops_per_update"]["total"] * updates if c else None,
        "provenance": provenance,
        "machines": sorted({json.dumps(r.get("machine"), sort_keys=True) for r in runs.values()}),
    }


def compare(folder: Path, split: str, design: str = "fair") -> dict[str, Any]:
    judged, reported, cost_of = DESIGNS[design]
    cost_path = folder / "cost.json"
    cost = json.loads(cost_path.read_text(encoding="utf-8"))["variants"] if cost_path.is_file() else {}
    names = {n for pair in judged + reported for n in pair}
    arms = {n: a for n in sorted(names) if (a := arm(folder, n, split, cost, cost_of)) is not None}
    level = 1 - 0.05 / len(judged)

    def diff(a: str, b: str, lvl: float) -> dict[str, Any] | None:
        if a not in arms or b not in arms:
            return None
        return {"a": a, "b": b, "level": lvl} | paired_differences(arms[a]["bits"], arms[b]["bits"], lvl)

    return {
        "split": split,
        "arms": arms,
        "design": design,
        "judged": [d for a, b in judged if (d := diff(a, b, level))],
        "reported": [d for a, b in reported if (d := diff(a, b, 0.95))],
        "report": report_provenance(exclude=[folder]),  # what made this comparison, not its runs
    }


def markdown(result: dict[str, Any], command: str) -> list[str]:
    lines = [
        f"# Speech, {result.get('design', 'fair')} comparison: {result['split']} split, bits per sample",
        "",
        f"`{command}`. Mean ± 95% t half-width over seeds. Training CPU seconds: the runs' own record (process CPU time, "
        "one thread), else the cost pilot's CPU seconds per update x updates (in brackets). FLOPs: the cost pilot's "
        "forward + backward per update x updates.",
        "",
        "| arm | parameters | updates | training CPU s | training PFLOP | bits / sample | per seed |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, a in result["arms"].items():
        iv = a["interval"]
        cpu = (
            f"{a['train_cpu_seconds_mean']:,.0f}"
            if a["train_cpu_seconds_mean"]
            else (f"({a['pilot_cpu_seconds']:,.0f})" if a["pilot_cpu_seconds"] else "-")
        )
        flops = f"{a['train_flops'] / 1e15:.3f}" if a["train_flops"] else "-"
        seeds = ", ".join(f"{v:.4f}" for _, v in sorted(a["bits"].items()))
        hw = f" ± {iv['half_width']:.4f}" if iv["half_width"] is not None else ""
        lines.append(
            f"| {name} | {a['parameters']:,} | {a['updates']} | {cpu} | {flops} | {iv['mean']:.4f}{hw} | {seeds} |"
        )
    for title, rows in (("Judged (Bonferroni over 3)", result["judged"]), ("Reported, not judged", result["reported"])):
        lines += ["", f"## {title}", "", "| a - b | mean | per seed | interval | paired t p (two-sided) |"]
        lines.append("|---|---|---|---|---|")
        for d in rows:
            iv = d["interval"]
            seeds = ", ".join(f"{v:+.4f}" for v in d["per_seed"].values())
            ci = f"{d['level']:.1%} [{iv['low']:+.4f}, {iv['high']:+.4f}]" if iv["half_width"] is not None else "-"
            p = f"{d['p']:.4f}" if d["p"] is not None else "-"
            lines.append(f"| {d['a']} - {d['b']} | {iv['mean']:+.4f} | {seeds} | {ci} | {p} |")
    runs = {name: r for a in result["arms"].values() for name, r in a["provenance"].items()}
    report = result["report"]
    lines += ["", *mixed_lines(runs), "", f"This comparison: code {code_label(report['code'])}."]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--split", default="test", choices=("validation", "test"))
    p.add_argument("--design", default="fair", choices=tuple(DESIGNS), help="the pre-registered comparisons to make")
    args = p.parse_args(argv)
    result = compare(args.folder, args.split, args.design)
    command = "python -m benchmarks.speech.compare " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = markdown(result, command)
    write_text_atomic(args.folder / "comparisons.json", json.dumps(result, indent=1) + "\n")
    write_text_atomic(args.folder / "comparisons.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
