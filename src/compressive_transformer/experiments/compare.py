"""Train several variants of one run config with the same budget and tabulate them (Transformer-QL's Table 1 shape).

A spec is a TOML file with a ``[base]`` run config (``[base.model]``, ``[base.data]``, ...) and one table per
variant under ``[variants.NAME]`` holding only what differs. Each variant trains in ``OUT/NAME`` (an existing
finished run with the same config is reused, never overwritten), is evaluated, and contributes one row: model,
n_s/n_m/n_cm, window, average context length (Transformer-QL paper, Appendix B), the evaluation metric, training
tokens/s and parameters.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from compressive_transformer.core.config import Log, ModelConfig, RunConfig
from compressive_transformer.core.context import context_length_from_config
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.core.models import build_model, model_kind
from compressive_transformer.experiments.runner import run_cells, write_json
from compressive_transformer.experiments.spec import load_spec
from compressive_transformer.inference.workflows import evaluate_run
from compressive_transformer.runs.metrics import read_metrics
from compressive_transformer.runs.provenance import code_state, data_fingerprint, run_provenance
from compressive_transformer.runs.rundir import read_run_config
from compressive_transformer.training.workflows import train_run


def model_name(cfg: ModelConfig) -> str:
    return model_kind(cfg).label(cfg)


def window_length(cfg: ModelConfig) -> int:
    """n_w as the Transformer-QL paper counts it: n_s + n_m (+ n_cm for the Compressive Transformer)."""
    return cfg.seg_len + cfg.memory.mem_len + cfg.memory.cmem_len


def _tokens_per_s(run_dir: Path) -> float | None:
    rates = [r["tokens_per_s"] for r in read_metrics(run_dir) if "tokens_per_s" in r]
    return statistics.median(rates) if rates else None


def compare(
    spec: str | Path,
    out_dir: str | Path,
    *,
    overrides: list[str] | tuple[str, ...] = (),
    split: str | None = None,
    log: Log = print,
) -> list[dict[str, Any]]:
    """Train and evaluate every variant of ``spec``; write ``results.json`` and ``results.md`` into ``out_dir``."""
    out_dir = Path(out_dir)
    configs = load_spec(spec, overrides)
    rows: list[dict[str, Any]] = []
    code, data = code_state(exclude=[out_dir]), {}
    for cfg in configs.values():  # each corpus fingerprinted once
        if id(cfg.data) not in data:
            data[id(cfg.data)] = data_fingerprint(cfg.data, ("train", "validation", "test"))
    run_cells(
        list(configs.items()),
        lambda variant: (
            _variant_row(*variant, out_dir, split=split, log=log)
            | {"provenance": run_provenance(code, data[id(variant[1].data)])}
        ),
        on_done=lambda _, row: rows.append(row),
    )
    write_results(out_dir, rows)
    return rows


def write_results(out_dir: Path, rows: list[dict[str, Any]]) -> None:
    """``results.json`` and ``results.md``, each atomically: a kill leaves the previous file or the new one."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "results.json", rows, indent=2)
    write_text_atomic(out_dir / "results.md", results_table(rows))


def _variant_row(name: str, cfg: RunConfig, out_dir: Path, *, split: str | None, log: Log) -> dict[str, Any]:
    """Train (or reuse) and evaluate one variant; its row of the table."""
    run_dir = out_dir / name
    log(f"== {name}: {model_name(cfg.model)}")
    finished = (run_dir / "config.toml").is_file()
    train_run(None if finished else cfg, run_dir, resume=finished, log=log)
    result = evaluate_run(run_dir, split=split, progress=False)
    m = cfg.model
    ctx = context_length_from_config(m)
    n_params = sum(p.numel() for p in build_model(read_run_config(run_dir).model).parameters())
    row = {
        "variant": name,
        "model": model_name(m),
        "n_s/n_m/n_cm": f"{m.seg_len:02d}/{m.memory.mem_len:02d}/"
        + (f"{m.memory.cmem_len:02d}" if m.memory.cmem_len else "-"),
        "window": window_length(m),
        "context_min": ctx.min,
        "context_max": ctx.max,
        "context_avg": ctx.average,
        "split": result.split,
        "bits_per_token": result.bits_per_token,
        "bits_per_char": result.bits_per_char,
        "ppl": result.ppl,
        "word_ppl": result.word_ppl,
        "eval_tokens": result.tokens,
        "eval_complete": result.complete,
        "train_steps": cfg.train.steps,
        "tokens_per_s": _tokens_per_s(run_dir),
        "parameters": n_params,
        "run_dir": str(run_dir),
    }
    log(f"   {result.summary()}")
    return row


def results_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | n_s/n_m/n_cm | n_w | avg context | split | bits/token | bits/char | ppl | train tokens/s | parameters |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rate = f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "-"
        per_char = f"{r['bits_per_char']:.4f}" if r["bits_per_char"] is not None else "-"  # a partial pass has none
        split = r["split"] + ("" if r["eval_complete"] else f" (first {r['eval_tokens']:,} tokens)")
        lines.append(
            f"| {r['model']} | {r['n_s/n_m/n_cm']} | {r['window']} | {r['context_avg']:g} | {split} | "
            f"{r['bits_per_token']:.4f} | {per_char} | {r['ppl']:.3f} | {rate} | {r['parameters']:,} |"
        )
    return "\n".join(lines) + "\n"
