"""A study's summary as markdown tables and PNG plots (pure functions of the JSON summary)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from compressive_transformer.analysis.plots import (
    plot_attention_regions,
    plot_study_bars,
    plot_study_curves,
    plot_study_lookback,
)
from compressive_transformer.runs.provenance import code_label, mixed_lines


def fmt_interval(d: dict[str, Any] | None, digits: int = 3, *, percent: bool = False) -> str:
    if not d or not d.get("n"):
        return "-"
    scale = 100.0 if percent else 1.0
    mean = d["mean"] * scale
    hw = d.get("half_width")
    unit = "%" if percent else ""
    sign = "+" if percent and mean > 0 else ""
    if hw is None or (isinstance(hw, float) and math.isnan(hw)):
        return f"{sign}{mean:.{digits}f}{unit}"
    return f"{sign}{mean:.{digits}f} ± {hw * scale:.{digits}f}{unit}"


def _machine_line(summary: dict[str, Any]) -> str:
    lines = []
    for m in summary["machines"]:
        flags = ", ".join(m.get("cpu_flags") or []) or "none of avx2/avx512/amx"
        lines.append(
            f"{m.get('cpu') or 'unknown CPU'} ({m.get('cores')} cores; flags: {flags}), torch {m.get('torch')}, {m.get('torch_threads')} thread(s) per run"
        )
    return "; ".join(lines) or "-"


def _provenance_lines(summary: dict[str, Any]) -> list[str]:
    """Which code and data made the runs (run by run where they differ), and which code and machine made this
    report."""
    runs = (summary.get("provenance") or {}).get("runs") or {}
    out = [*mixed_lines(runs), ""] if runs else []
    report = summary.get("report")
    if report:
        m = report["machine"]
        out += [
            f"This report: code {code_label(report['code'])}, on {m.get('cpu') or 'unknown CPU'} ({m.get('cores')} cores).",
            "",
        ]
    return out


def _lower_in(entry: dict[str, Any]) -> str:
    vs = entry.get("vs_baseline")
    return f"{vs['lower_in']}/{vs['n']}" if vs else "-"


def _delta(entry: dict[str, Any], digits: int = 3) -> str:
    vs = entry.get("vs_baseline")
    return fmt_interval(vs["interval"], digits) if vs else "(baseline)"


def _lengths(entry: dict[str, Any]) -> str:
    ln = entry.get("lengths")
    if not ln:
        return "-"
    return f"{ln['mem_len']}/{ln['cmem_len']}" if ln["cmem_len"] else f"{ln['mem_len']}"


def summary_table(summary: dict[str, Any], split: str | None = None) -> list[str]:
    """The headline: bits per character and word perplexity of every variant on ``split`` (default: the last
    split), at each evaluation memory, with the paired delta to the baseline."""
    keys = list(summary["metrics"])
    split = split or keys[-1].split("/")[1]
    evs = [k.split("/")[0] for k in keys if k.endswith("/" + split)]
    head = ["variant"]
    for ev in evs:
        head += [f"n_m / n_cm ({ev})", f"bits/char ({ev})", "delta", f"word ppl ({ev})"]
    lines = [
        f"## Summary: {split} split, bits per character and word perplexity",
        "",
        "| " + " | ".join(head) + " |",
        "|---" * len(head) + "|",
    ]
    for v in summary["variants"]:
        cells = [v]
        for ev in evs:
            e = summary["metrics"][f"{ev}/{split}"][v]
            cells += [
                _lengths(e),
                fmt_interval(e["bits_per_char"]["interval"], 4),
                _delta(e["bits_per_char"], 4),
                fmt_interval(e["word_ppl"]["interval"], 2),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(summary: dict[str, Any]) -> str:
    out = _header(summary)
    out += ["", *summary_table(summary)]
    out += _metric_tables(summary) + _lookback_tables(summary) + _frequency_tables(summary)
    out += _attention_tables(summary)
    if summary.get("plots"):
        out += ["", "## Plots", ""] + [f"Curves: {note}." for note in summary.get("curve_notes", [])]
        out += [f"![{Path(p).stem}]({Path(p).name})" for p in summary["plots"]]
    return "\n".join(out) + "\n"


def _cpu(per_seed: dict[Any, float] | None) -> str:
    """Mean training CPU seconds over the seeds that recorded them ("-": none did, e.g. runs made before the record)."""
    if not per_seed:
        return "-"
    return f"{sum(per_seed.values()) / len(per_seed):,.0f} ({len(per_seed)} seeds)"


def _header(summary: dict[str, Any]) -> list[str]:
    """Title, budget, reproduction command, machine and the table of variants."""
    b, pct = summary["budget"], round(100 * summary["level"])
    base = summary["baseline"]
    variants = list(summary["variants"])
    tokens = ", ".join(f"{t:,}" for t in b["train_tokens"]) or "-"
    steps = {info.get("updates", b["steps"]) for info in summary["variants"].values()}
    updates = f"{b['steps']} updates" if len(steps) <= 1 else "the updates the variants table gives, each"
    out = [f"# {summary['title'] or 'Study'}", ""]
    out += [
        f"{len(variants)} variants x {len(summary['seeds'])} seeds (seeds {', '.join(map(str, summary['seeds']))}); "
        f"**{summary['runs_done']} of {summary['runs_total']} runs finished**. Every run: {updates} of "
        f"{b['batch_size']} streams x {b['seg_len']} tokens ({tokens} training tokens), "
        f"{summary['data']['format']} data, {summary['data']['tokenizer']} tokens. Intervals are {pct}% Student-t "
        f"intervals over seeds; **delta** is the paired difference to **{base}** on the same seed (same initialisation "
        f"seed and data order), negative is better; *lower in* counts the seeds where the variant is lower.",
        "",
        f"Reproduce: `{summary['command'] or 'compressive-transformer study ' + summary['spec']}`",
        "",
        f"Machine (the runs'): {_machine_line(summary)}",
        "",
        *_provenance_lines(summary),
        "## Variants",
        "",
        "| variant | model | n_s / n_m / n_cm | c | compression | parameters (compressor) | keys per query | reach per layer (tokens; WaveNet: receptive field - 1) | updates | training CPU s per run | seeds done |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v, info in summary["variants"].items():
        p = info["parameters"]
        params = f"{p['total']:,} ({p['compressor']:,})" if p else "-"
        out.append(
            f"| {v} | {info['model']} | {info['seg_len']} / {info['mem_len']} / {info['cmem_len']} | "
            f"{info['compression_rate'] or '-'} | {info['compression']} | {params} | {info['attention_keys'] or '-'} | "
            f"{info['reach']} | {info.get('updates', '-')} | {_cpu(info.get('train_cpu_seconds'))} | "
            f"{len(info['seeds_done'])} |"
        )
    return out


def _metric_tables(summary: dict[str, Any]) -> list[str]:
    """Bits per character and word perplexity per evaluation, with paired deltas."""
    variants = list(summary["variants"])
    out: list[str] = []
    for key, per_variant in summary["metrics"].items():
        ev, split = key.split("/")
        out += ["", f"## {split}, memory of evaluation `{ev}`", ""]
        out += [
            "| variant | n_m / n_cm | bits per char | delta | lower in | word perplexity | delta | bits per token |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for v in variants:
            e = per_variant[v]
            out.append(
                f"| {v} | {_lengths(e)} | {fmt_interval(e['bits_per_char']['interval'], 4)} | {_delta(e['bits_per_char'], 4)} | "
                f"{_lower_in(e['bits_per_char'])} | {fmt_interval(e['word_ppl']['interval'], 2)} | {_delta(e['word_ppl'], 2)} | "
                f"{fmt_interval(e['bits_per_token']['interval'], 4)} |"
            )
    return out


def _lookback_tables(summary: dict[str, Any]) -> list[str]:
    """Loss by how far back the same word last occurred, per evaluation."""
    base, variants = summary["baseline"], list(summary["variants"])
    out: list[str] = []
    others = [v for v in variants if v != base]
    for key, per_variant in summary["lookback"].items():
        ev, split = key.split("/")
        out += ["", f"## Loss by lookback: {split}, memory of evaluation `{ev}`", ""]
        out += [
            "Tokens grouped by how far before their segment's start the same word last occurred in the book "
            f"(lookback, in tokens; edges {summary['lookback_edges']}); bits per token of {base}, and each variant's "
            "paired delta.",
            "",
            f"| last occurrence | tokens | {base} bits/token | " + " | ".join(f"delta {v}" for v in others) + " |",
            "|---|---|---|" + "---|" * len(others),
        ]
        buckets = summary["lookback_buckets"]
        total = sum(per_variant[base][bk].get("tokens", 0) for bk in buckets) or 1
        for bk in buckets:
            n = per_variant[base][bk].get("tokens", 0)
            cells = [_delta(per_variant[v][bk]) for v in others]
            out.append(
                f"| {bk} | {n:,} ({100 * n / total:.1f}%) | {fmt_interval(per_variant[base][bk]['interval'])} | "
                + " | ".join(cells)
                + " |"
            )
    return out


def _frequency_tables(summary: dict[str, Any]) -> list[str]:
    """Word perplexity by train-split frequency, per evaluation."""
    base, variants = summary["baseline"], list(summary["variants"])
    others = [v for v in variants if v != base]
    out: list[str] = []
    for key, per_variant in summary["frequency"].items():
        ev, split = key.split("/")
        if not per_variant.get(base):
            continue
        out += ["", f"## Word perplexity by frequency in the train split: {split}, memory of evaluation `{ev}`", ""]
        out += [
            f"| train occurrences | words | {base} | " + " | ".join(f"{v} | gain" for v in others) + " |",
            "|---|---|---|" + "---|---|" * len(others),
        ]
        for bk, e in per_variant[base].items():
            cells = []
            for v in others:
                ev_v = per_variant[v].get(bk, {})
                cells += [
                    fmt_interval(ev_v.get("interval"), 2),
                    fmt_interval(ev_v.get("relative_gain"), 1, percent=True),
                ]
            out.append(f"| {bk} | {e['words']:,} | {fmt_interval(e['interval'], 2)} | " + " | ".join(cells) + " |")
    return out


def _attention_tables(summary: dict[str, Any]) -> list[str]:
    """Attention by memory region, per layer and on average."""
    out: list[str] = []
    for v, att in summary["attention"].items():
        regions = [r for r in att["regions"] if r["buckets"] > 0]
        cols = [f"{r['name'][0]}{i + 1}" for r in regions for i in range(r["buckets"])]
        out += ["", f"## Attention by memory region: {v} ({att['split']}, {att['seeds']} seeds, oldest to newest)", ""]
        out += ["| layer | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        rows = [(str(i), layer) for i, layer in enumerate(att["layers"])] + [("mean", att["average"])]
        for name, d in rows:
            vals = [d[r["name"]][i] for r in regions for i in range(r["buckets"])]
            out.append(f"| {name} | " + " | ".join("-" if x is None else f"{x:.4f}" for x in vals) + " |")
    return out


def plots(summary: dict[str, Any], out: Path) -> list[str]:
    """Training curves, bits per character with intervals, loss-by-lookback deltas, attention profiles."""
    paths = [plot_study_curves(summary["curves"], out / "curves.png")]
    paths.append(plot_study_bars(summary, out / "bits_per_char.png"))
    key = next(iter(summary["lookback"]), None)
    if key is not None and len(summary["variants"]) > 1:
        last = [k for k in summary["lookback"] if k.endswith("/test")] or list(summary["lookback"])
        for k in dict.fromkeys([last[0], last[-1]]):
            ev, split = k.split("/")
            paths.append(plot_study_lookback(summary, k, out / f"lookback_{ev}_{split}.png"))
    for v, att in summary["attention"].items():
        if any(r["name"] == "compressed" and r["buckets"] > 0 for r in att["regions"]):
            title = f"{v}: attention by memory region ({att['split']}, mean of {att['seeds']} seeds)"
            paths.append(plot_attention_regions(att, out / f"attention_{v}.png", title=title))
    return [str(Path(p).name) for p in paths]


__all__ = ["fmt_interval", "markdown", "plots", "summary_table"]
