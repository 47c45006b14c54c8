"""A study's aggregate: intervals over seeds, paired differences against the baseline, tables and plots.

Everything here is computed from the per-run result files (``OUT/results/VARIANT/seed-S.json``) alone, so a study
cut short reports the runs it finished, and the report can be rebuilt without any checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from compressive_transformer.analysis.recurrence import bucket_names
from compressive_transformer.analysis.stats import mean_interval, paired_differences
from compressive_transformer.core.context import receptive_field
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.experiments.compare import model_name
from compressive_transformer.experiments.study import Study, read_result, stored_identity, study_jobs
from compressive_transformer.experiments.study_render import markdown, plots
from compressive_transformer.runs.provenance import is_mixed, report_provenance

METRICS = ("bits_per_char", "bits_per_byte", "bits_per_token", "word_ppl")


def load_results(study: Study, out: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """variant -> seed -> result, for the runs whose result matches the study's current settings."""
    results: dict[str, dict[int, dict[str, Any]]] = {v: {} for v in study.configs}
    for job in study_jobs(study, out, threads=1, progress=False):
        r = read_result(job.result_path)
        if r is not None and stored_identity(r) == job.identity():
            results[job.variant][job.seed] = r
    return results


def _variant_info(study: Study, name: str, runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    m = study.configs[name].model
    any_run = next(iter(runs.values()), None)
    return {
        "model": model_name(m),
        "seg_len": m.seg_len,
        "mem_len": m.memory.mem_len,
        "cmem_len": m.memory.cmem_len,
        "compression_rate": m.compression.rate if m.memory.cmem_len else None,
        "compression": f"{m.compression.function} + {m.compression.loss}" if m.memory.cmem_len else "-",
        "attention_keys": 0 if m.is_wavenet else m.seg_len + m.memory.mem_len + m.memory.cmem_len,  # keys per query
        # past tokens an output can read: per attention layer, or WaveNet's whole receptive field
        "reach": receptive_field(m.wavenet.dilations) - 1
        if m.is_wavenet
        else m.memory.mem_len + (m.compression.rate * m.memory.cmem_len if m.memory.cmem_len else 0),
        "parameters": any_run["parameters"] if any_run else None,
        "updates": study.configs[name].train.steps,
        "train_cpu_seconds": _per_seed(runs, lambda r: _train_cpu(r, study.configs[name].train.steps)),
        "seeds_done": sorted(runs),
    }


def _train_cpu(result: dict[str, Any], steps: int) -> float | None:
    """The run's training CPU seconds where every one of its steps was counted (runs before the record: None)."""
    train = (result.get("cpu_seconds") or {}).get("train")
    return train["seconds"] if train and train["steps"] >= steps else None


def _per_seed(runs: dict[int, dict[str, Any]], get: Any) -> dict[int, float]:
    out = {}
    for seed, r in runs.items():
        try:
            v = get(r)
        except (KeyError, TypeError):
            continue
        if v is not None:
            out[seed] = float(v)
    return out


def _compare(values: dict[int, float], base: dict[int, float] | None, level: float) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "per_seed": {str(k): v for k, v in values.items()},
        "interval": mean_interval(list(values.values()), level).to_dict(),
    }
    if base is not None:
        entry["vs_baseline"] = paired_differences(values, base, level)
    return entry


def _summary_header(study: Study, results: dict[str, dict[int, dict[str, Any]]], command: str) -> dict[str, Any]:
    """What the study was (spec, budget, data, variants) and how far it got (runs done, machines)."""
    s, base = study.settings, study.baseline
    cfg0 = study.configs[base]
    t = cfg0.train
    edges = study.lookback_edges()
    summary: dict[str, Any] = {
        "title": s.title,
        "spec": str(study.path),
        "overrides": list(study.overrides),
        "command": command,
        "baseline": base,
        "seeds": list(s.seeds),
        "level": s.level,
        "budget": {
            "steps": t.steps,
            "batch_size": t.batch_size,
            "seg_len": cfg0.model.seg_len,
            "accumulate": [list(a) for a in t.accumulate],
            "train_tokens": sorted({r["train_tokens"] for runs in results.values() for r in runs.values()}),
        },
        "data": {"format": cfg0.data.format, "tokenizer": cfg0.data.tokenizer, "vocab_size": cfg0.data.vocab_size},
        "lookback_edges": edges,
        "lookback_buckets": bucket_names(edges),
        "variants": {v: _variant_info(study, v, runs) for v, runs in results.items()},
        "runs_done": sum(len(r) for r in results.values()),
        "runs_total": len(study.configs) * len(s.seeds),
        "machines": sorted(
            {json.dumps(r["machine"], sort_keys=True) for runs in results.values() for r in runs.values()}
        ),
    }
    summary["machines"] = [json.loads(m) for m in summary["machines"]]
    records = {
        f"{v} seed {seed}": r.get("provenance") for v, runs in results.items() for seed, r in sorted(runs.items())
    }
    summary["provenance"] = {"runs": records, "mixed": is_mixed(records)}
    return summary


def aggregate(study: Study, results: dict[str, dict[int, dict[str, Any]]], *, command: str = "") -> dict[str, Any]:
    """The study's JSON summary (see the module docstring of :mod:`.study`)."""
    s, level, base = study.settings, study.settings.level, study.baseline
    summary = _summary_header(study, results, command)
    metrics: dict[str, Any] = {}
    lookback: dict[str, Any] = {}
    frequency: dict[str, Any] = {}
    for ev in study.evaluation_names:
        for split in s.splits:
            key = f"{ev}/{split}"
            metrics[key], lookback[key], frequency[key] = {}, {}, {}
            get = lambda m: lambda r: r["evaluations"][ev][split][m]  # noqa: E731
            for v, runs in results.items():
                metrics[key][v] = {}
                for m in METRICS:
                    base_vals = _per_seed(results[base], get(m)) if v != base else None
                    metrics[key][v][m] = _compare(_per_seed(runs, get(m)), base_vals, level)
                first = next(iter(runs.values()), None)
                if first is not None:
                    e = first["evaluations"][ev][split]
                    metrics[key][v]["lengths"] = {
                        "seg_len": e["seg_len"],
                        "mem_len": e["mem_len"],
                        "cmem_len": e["cmem_len"],
                    }
                lookback[key][v] = {}
                for b in summary["lookback_buckets"]:
                    getb = lambda r, b=b: r["evaluations"][ev][split]["lookback"]["buckets"][b]["bits_per_token"]  # noqa: E731
                    base_vals = _per_seed(results[base], getb) if v != base else None
                    entry = _compare(_per_seed(runs, getb), base_vals, level)
                    if first is not None:
                        entry["tokens"] = first["evaluations"][ev][split]["lookback"]["buckets"][b]["tokens"]
                    lookback[key][v][b] = entry
                frequency[key][v] = {}
                if first is not None:
                    for b in first["evaluations"][ev][split]["frequency"]:
                        getf = lambda r, b=b: r["evaluations"][ev][split]["frequency"][b]["ppl"]  # noqa: E731
                        base_vals = _per_seed(results[base], getf) if v != base else None
                        entry = _compare(_per_seed(runs, getf), base_vals, level)
                        entry["words"] = first["evaluations"][ev][split]["frequency"][b]["words"]
                        if base_vals is not None:  # the paper's relative gain 1 - ppl / ppl_baseline, per seed
                            vals = _per_seed(runs, getf)
                            gains = {
                                k: 1.0 - vals[k] / base_vals[k]
                                for k in vals.keys() & base_vals.keys()
                                if base_vals[k] > 0
                            }
                            entry["relative_gain"] = mean_interval(list(gains.values()), level).to_dict()
                        frequency[key][v][b] = entry
    summary["metrics"], summary["lookback"], summary["frequency"] = metrics, lookback, frequency
    summary["attention"] = {
        v: _mean_attention(runs) for v, runs in results.items() if any(r.get("attention") for r in runs.values())
    }
    summary["curves"] = {v: {str(seed): r["curve"] for seed, r in sorted(runs.items())} for v, runs in results.items()}
    # why a curve lacks a part (e.g. a validation curve dropped as invalid), said once under the plots
    summary["curve_notes"] = sorted(
        {r["curve_note"] for runs in results.values() for r in runs.values() if "curve_note" in r}
    )
    return summary


def _mean_attention(runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The attention profile averaged over seeds (bucket by bucket, per layer and over layers)."""
    profiles = [r["attention"] for r in runs.values() if r.get("attention")]
    first = profiles[0]

    def mean_of(getter: Any) -> dict[str, list[float | None]]:
        out = {}
        for region in first["average"]:
            cols = zip(*(getter(p)[region] for p in profiles))
            out[region] = [None if any(x is None for x in col) else sum(col) / len(col) for col in cols]
        return out

    return {
        "regions": first["regions"],
        "buckets_per_region": first["buckets_per_region"],
        "average": mean_of(lambda p: p["average"]),
        "layers": [mean_of(lambda p, i=i: p["layers"][i]) for i in range(len(first["layers"]))],
        "seeds": len(profiles),
        "split": first.get("split"),
        "segments": first.get("segments"),
    }


def write_report(study: Study, out: Path, *, command: str = "") -> dict[str, Any]:
    """Aggregate the finished runs into ``results.json``, ``results.md`` and PNG plots in ``out``."""
    summary = aggregate(study, load_results(study, out), command=command)
    summary["report"] = report_provenance(exclude=[out])  # who made this report, kept apart from the runs' machines
    summary["plots"] = plots(summary, out) if summary["runs_done"] else []
    write_text_atomic(out / "results.json", json.dumps(summary, indent=1) + "\n")
    write_text_atomic(out / "results.md", markdown(summary))
    return summary


__all__ = ["aggregate", "load_results", "write_report"]
