"""``compressive-transformer report RUN_DIR [RUN_DIR...]``: one self-contained directory that compares runs at a glance.

It holds ``report.md`` and ``report.html`` (the same content), every plot as PNG and ``report.json`` with the
numbers behind them: a summary table (model shape, memory, temporal range and attention cost, steps, final train
loss, every ``eval_<split>.json``), training curves of all runs on one plot, and per run with a checkpoint the
paper's analyses (attention by memory region, compressibility of layers, temporal range); the frequency-bucket
perplexity table puts all runs side by side.
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from compressive_transformer.analysis import plots
from compressive_transformer.analysis.compressibility import compressibility_over_training, held_out_compressibility
from compressive_transformer.analysis.curves import curves_from_records, run_name
from compressive_transformer.analysis.frequency import (
    compare_frequency,
    frequency_perplexity,
    frequency_table,
    word_counts,
)
from compressive_transformer.analysis.regions import attention_by_region, bucket_table
from compressive_transformer.analysis.temporal import empirical_temporal_range
from compressive_transformer.core.config import ConfigError, Log, to_dict
from compressive_transformer.core.context import temporal_range
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.core.modality import TEXT, require_modality, run_modality
from compressive_transformer.data import load_corpus, read_documents
from compressive_transformer.runs.checkpoint import list_checkpoints
from compressive_transformer.runs.loading import load_run
from compressive_transformer.runs.metrics import read_metrics
from compressive_transformer.runs.rundir import cache_dir, read_run_config

ANALYSES = ("regions", "compressibility", "temporal", "frequency")


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, (np.integer, np.floating)):
        return _json_safe(obj.item())
    return obj


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if math.isfinite(v) else str(v)
    return str(v)


def load_trained(
    run_dir: str | Path, checkpoint: str | Path | None = None, *, device: str | None = None, threads: int | None = None
) -> tuple[Any, Any, Any]:
    """(RunConfig, tokenizer, model in eval mode) of a run directory, on ``device`` (default auto)."""
    run = load_run(run_dir, device=device, checkpoint=checkpoint, threads=threads)
    return run.config, run.tokenizer, run.model


def analyze_run(
    run_dir: str | Path,
    *,
    split: str = "validation",
    analyses: Sequence[str] = ANALYSES,
    max_segments: int = 40,
    batch_size: int = 4,
    checkpoint: str | Path | None = None,
    log: Log = print,
    device: str | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """The paper's analyses of one trained run on ``split`` (capped at ``max_segments`` batches each), JSON-ready.

    Frequency buckets need the run's train split (for the word counts) and are returned as the per-model part of
    :func:`compare_frequency`.
    """
    bad = [a for a in analyses if a not in ANALYSES]
    if bad:
        raise ConfigError(f"analyses: unknown {bad[0]!r}; use {', '.join(ANALYSES)}")
    run_dir = Path(run_dir)
    analyses = _for_modality(run_dir, analyses, log)
    cfg, tokenizer, model = load_trained(run_dir, checkpoint, device=device, threads=threads)
    corpus = load_corpus(cfg.data, split, tokenizer, cache_dir(cfg, run_dir))
    out: dict[str, Any] = {"split": split, "max_segments": max_segments}
    if "regions" in analyses:
        log(f"{run_dir}: attention by memory region")
        out["regions"] = attention_by_region(model, corpus, batch_size=batch_size, max_segments=max_segments)
    if "compressibility" in analyses:
        log(f"{run_dir}: compressibility of layers")
        out["compressibility"] = {
            "over_training": compressibility_over_training(read_metrics(run_dir)),
            "held_out": held_out_compressibility(model, corpus, batch_size=batch_size, max_segments=max_segments),
        }
    if "temporal" in analyses:
        log(f"{run_dir}: temporal range (perturbation)")
        s = cfg.model.seg_len
        length = s * math.ceil((temporal_range(cfg.model).max_range + 2 * s) / s)
        tokens = np.asarray(corpus.tokens[: min(length, corpus.num_tokens)], dtype=np.int64)
        if len(tokens) >= 2 * s:
            tokens = tokens[: len(tokens) - len(tokens) % s]  # whole segments: the probe is a segment's last position
            out["temporal"] = empirical_temporal_range(model, tokens, batch_size=48, tolerance=1e-9)
    if "frequency" in analyses:
        log(f"{run_dir}: perplexity by word frequency")
        counts = word_counts(read_documents(cfg.data, "train"))
        docs = read_documents(cfg.data, split)
        out["frequency"] = frequency_perplexity(
            model, tokenizer, docs, counts, batch_size=batch_size, max_segments=max_segments
        )
    return out


def _for_modality(run_dir: Path, analyses: Sequence[str], log: Log) -> Sequence[str]:
    """Perplexity by word frequency needs words: for an audio run it is left out of the default set and refused
    when asked for by name."""
    modality = run_modality(read_run_config(run_dir))
    if modality == TEXT or "frequency" not in analyses:
        return analyses
    if tuple(analyses) != tuple(ANALYSES):
        require_modality(modality, TEXT, "--only frequency", "its samples have no words; drop frequency")
    log(f"{run_dir}: models {modality}; perplexity by word frequency is left out (samples have no words)")
    return [a for a in analyses if a != "frequency"]


def summarize_run(run_dir: str | Path) -> dict[str, Any]:
    """What a run directory says about itself: config, ranges, last metrics, evaluation results."""
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    m = cfg.model
    r = temporal_range(m)
    records = read_metrics(run_dir)
    train = [x for x in records if "loss" in x]
    evals = {}
    for p in sorted(run_dir.glob("eval_*.json")):
        try:
            record = json.loads(p.read_text(encoding="utf-8"))
        except ValueError:  # not JSON (or not UTF-8): not an evaluation this library wrote
            continue
        if isinstance(record, dict):
            evals[p.stem.removeprefix("eval_")] = record
    ckpts = list_checkpoints(run_dir)
    return {
        "run_dir": str(run_dir),
        "model": "compressive" if m.uses_compression else ("transformer-xl" if m.memory.mem_len else "transformer"),
        "config": to_dict(cfg),
        "max_range": r.max_range,
        "attention_cost": r.attention_cost,
        "steps": int(train[-1]["step"]) if train else 0,
        "final_loss": float(train[-1]["loss"]) if train else None,
        "eval": evals,
        "checkpoint": str(ckpts[-1]) if ckpts else None,
    }


def region_share_table(shares: Sequence[dict[str, float]]) -> str:
    """Per layer, the fraction of attention each memory region receives (rows sum to 1)."""
    names = list(shares[0]) if shares else []
    lines = ["| layer | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [f"| {i} | " + " | ".join(_fmt(s[n], 3) for n in names) + " |" for i, s in enumerate(shares)]
    return "\n".join(lines)


def _summary_table(summaries: dict[str, dict[str, Any]]) -> str:
    splits = sorted({s for x in summaries.values() for s in x["eval"]})
    head = [
        "run",
        "model",
        "l",
        "d",
        "n_s",
        "n_m",
        "n_cm",
        "c",
        "compression",
        "range",
        "attn cost",
        "steps",
        "train loss",
    ]
    head += [f"{s} {k}" for s in splits for k in ("bits/token", "bits/char", "ppl", "word ppl")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, x in summaries.items():
        m = x["config"]["model"]
        mem = m["memory"]
        comp = f"{m['compression']['function']}/{m['compression']['loss']}" if mem["cmem_len"] else "-"
        row = [
            name,
            x["model"],
            m["n_layers"],
            m["d_model"],
            m["seg_len"],
            mem["mem_len"],
            mem["cmem_len"],
            m["compression"]["rate"] if mem["cmem_len"] else "-",
            comp,
            x["max_range"],
            x["attention_cost"],
            x["steps"],
            _fmt(x["final_loss"]),
        ]
        for s in splits:
            e = x["eval"].get(s, {})
            row += [
                _fmt(e.get("bits_per_token", e.get("bpc"))),
                _fmt(e.get("bits_per_char")),
                _fmt(e.get("ppl")),
                _fmt(e.get("word_ppl")),
            ]
        lines.append("| " + " | ".join(str(v) for v in row) + " |")
    return "\n".join(lines)


def _analysis_sections(a: dict[str, Any], name: str, slug: str, out: Path) -> list[str]:
    """The markdown (and PNGs in ``out``) of one run's analyses: attention by region, compressibility, temporal range."""
    md: list[str] = []
    if "regions" in a:
        plots.plot_attention_regions(
            a["regions"], out / f"{slug}_attention_regions.png", title=f"{name}: attention by memory region"
        )
        md += [
            "### Attention by memory region (oldest -> newest)",
            "",
            f"![attention by region]({slug}_attention_regions.png)",
            "",
            bucket_table(a["regions"]),
            "",
            "Share of attention per region:",
            "",
            region_share_table(a["regions"]["region_share"]),
            "",
        ]
    if "compressibility" in a:
        c = a["compressibility"]
        series = dict(c["over_training"], held_out=[v if v is not None else 0.0 for v in c["held_out"]["per_layer"]])
        md += ["### Compressibility of layers", ""]
        if c["held_out"]["per_layer"] or c["over_training"]["per_layer"]:
            plots.plot_compressibility(
                series, out / f"{slug}_compressibility.png", title=f"{name}: compression loss per layer"
            )
            md += [f"![compressibility]({slug}_compressibility.png)", ""]
        md += [
            "held-out compression loss per layer: "
            + (", ".join(_fmt(v) for v in c["held_out"]["per_layer"]) or "no compressed memory"),
            "",
        ]
    if "temporal" in a:
        t = a["temporal"]
        plots.plot_temporal_range(t, out / f"{slug}_temporal_range.png", title=f"{name}: temporal range")
        md += [
            "### Temporal range",
            "",
            f"![temporal range]({slug}_temporal_range.png)",
            "",
            f"theoretical l(n_m + c n_cm) = {t['theoretical_max_range']} (+{t['probe_offset_in_segment']} for the probed position = "
            f"{t['theoretical_reach']}); empirical (farthest perturbation that changes the final output by > {t['tolerance']:g}) = "
            f"{t['empirical_range']} over {len(t['distances'])} probed distances up to {max(t['distances'])}",
            "",
        ]
    return md


def write_report(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    split: str = "validation",
    analyses: Sequence[str] = ANALYSES,
    max_segments: int = 40,
    batch_size: int = 4,
    log: Log = print,
    device: str | None = None,
    threads: int | None = None,
) -> Path:
    """Write the report directory for ``run_dirs`` (models on ``device``, default auto); returns the path of ``report.md``."""
    if not run_dirs:
        raise ConfigError("report: give at least one run directory")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    taken: set[str] = set()
    names = [run_name(d, taken) for d in run_dirs]
    summaries = {n: summarize_run(d) for n, d in zip(names, run_dirs)}
    curves = {n: curves_from_records(read_metrics(d)) for n, d in zip(names, run_dirs)}
    md = [f"# Report: {', '.join(names)}", "", "## Summary", "", _summary_table(summaries), ""]
    md += [
        "range = l x (n_m + c n_cm), the theoretical maximum temporal range; attn cost = query-key pairs per layer and head per segment, n_s (n_s + n_m + n_cm).",
        "",
    ]
    md += ["## Training curves", ""]
    if any(c.get("loss") for c in curves.values()):
        plots.plot_training_curves(curves, out / "curves_loss.png", key="loss")
        md += ["![training loss](curves_loss.png)", ""]
    else:
        md += ["(no metrics.jsonl records)", ""]

    results: dict[str, Any] = {"runs": summaries, "curves": curves, "analyses": {}}
    freq: dict[str, Any] = {}
    for name, run_dir in zip(names, run_dirs):
        if summaries[name]["checkpoint"] is None or not analyses:
            continue
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        a = analyze_run(
            run_dir,
            split=split,
            analyses=analyses,
            max_segments=max_segments,
            batch_size=batch_size,
            log=log,
            device=device,
            threads=threads,
        )
        results["analyses"][name] = a
        md += [f"## Analyses of {name} ({split} split, up to {max_segments} segments of {batch_size} streams)", ""]
        md += _analysis_sections(a, name, slug, out)
        if "frequency" in a:
            freq[name] = a["frequency"]
    if freq:
        comparison = compare_frequency(freq)
        results["frequency"] = comparison
        plots.plot_frequency_buckets(comparison, out / "frequency_buckets.png")
        md += [
            "## Perplexity by word frequency",
            "",
            "![frequency buckets](frequency_buckets.png)",
            "",
            frequency_table(comparison),
            "",
        ]
    write_text_atomic(out / "report.json", json.dumps(_json_safe(results), indent=1) + "\n")
    md += ["The numbers behind every plot are in report.json.", ""]
    text = "\n".join(md)
    write_text_atomic(out / "report.md", text)
    write_text_atomic(out / "report.html", markdown_to_html(text, title=f"Report: {', '.join(names)}"))
    log(f"wrote {out / 'report.md'} (and report.html, PNGs, report.json beside it)")
    return out / "report.md"


def markdown_to_html(text: str, *, title: str = "report") -> str:
    """The small markdown subset the reports use (headings, pipe tables, images, paragraphs, indented code)."""
    body: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{html.escape(line[level:].strip())}</h{level}>")
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            i -= 1
            out = ["<table>", "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in rows[0]) + "</tr>"]
            out += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows[2:]]
            body.append("\n".join(out + ["</table>"]))
        elif m := re.fullmatch(r"!\[(.*)\]\((.*)\)", line.strip()):
            body.append(f'<p><img src="{html.escape(m.group(2))}" alt="{html.escape(m.group(1))}"></p>')
        elif line.startswith("    "):
            body.append(f"<pre>{html.escape(line[4:])}</pre>")
        elif line.strip():
            body.append(f"<p>{html.escape(line)}</p>")
        i += 1
    style = "body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}img{max-width:100%}"
    return (
        f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


__all__ = ["ANALYSES", "analyze_run", "load_trained", "markdown_to_html", "summarize_run", "write_report"]
