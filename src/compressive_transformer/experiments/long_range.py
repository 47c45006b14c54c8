"""The equal-attention-cost experiment on the generated long-range tasks.

:func:`run_long_range` trains Transformer-XL and the Compressive Transformer at equal attention cost
(``n_s (n_s + n_m + n_cm)``), plus, optionally, every compression function x compression loss of the paper's
ablation, and writes ``results.json`` (accuracy by distance, attention cost, theoretical range, the command) with
plots and tables beside it. Training one model on one task is :mod:`compressive_transformer.experiments.tasks.training`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from compressive_transformer.analysis.plots import plot_accuracy_by_distance
from compressive_transformer.core.config import CompressionConfig, ConfigError, MemoryConfig, ModelConfig, to_dict
from compressive_transformer.core.context import temporal_range
from compressive_transformer.core.models import build_model
from compressive_transformer.experiments.long_range_report import binned, write_long_range_outputs
from compressive_transformer.experiments.long_range_results import RESULTS_FILE, locked_results
from compressive_transformer.experiments.runner import run_cells, write_json
from compressive_transformer.experiments.tasks.generators import (
    AssociativeRecallConfig,
    PasskeyConfig,
    SelectiveCopyConfig,
    TaskConfig,
)
from compressive_transformer.experiments.tasks.training import (
    Log,
    TaskRunConfig,
    TaskTrainConfig,
    _quiet,
    bin_counts,
    evaluate_task,
    load_task_run_config,
    train_task,
)
from compressive_transformer.runs.provenance import code_state, generated, run_provenance


def describe_model(cfg: ModelConfig) -> dict[str, Any]:
    """Attention cost and ranges of a model, as results.json records them."""
    r = temporal_range(cfg)
    return {
        "kind": "compressive" if cfg.uses_compression else "transformer-xl",
        "seg_len": cfg.seg_len,
        "mem_len": cfg.memory.mem_len,
        "cmem_len": cfg.memory.cmem_len,
        "compression_rate": cfg.compression.rate if cfg.uses_compression else None,
        "compression": cfg.compression.function if cfg.uses_compression else None,
        "compression_loss": cfg.compression.loss if cfg.uses_compression else None,
        "n_layers": cfg.n_layers,
        "d_model": cfg.d_model,
        "attention_cost": r.attention_cost,
        "max_range": r.max_range,
        # the last position of a segment sees n_s - 1 more tokens than the first, which the range counts
        "max_range_last_position": r.max_range + cfg.seg_len - 1,
        "single_layer_reach_last_position": cfg.memory.mem_len
        + (cfg.compression.rate * cfg.memory.cmem_len if cfg.uses_compression else 0)
        + cfg.seg_len
        - 1,
    }


def _history_summary(history: list[dict[str, Any]], points: int = 50) -> list[dict[str, Any]]:
    """At most ``points`` records (averaged over windows) so results.json stays small."""
    if not history:
        return []
    size = max(1, len(history) // points)
    out = []
    for i in range(0, len(history), size):
        chunk = history[i : i + size]
        out.append(
            {
                "step": chunk[-1]["step"],
                "loss": float(np.mean([r["loss"] for r in chunk])),
                "accuracy": float(np.mean([r["accuracy"] for r in chunk])),
                "aux_loss": float(np.mean([r["aux_loss"] for r in chunk])),
            }
        )
    return out


def run_one(run: TaskRunConfig, *, log: Log = _quiet) -> dict[str, Any]:
    """Train and evaluate one model on one task; a JSON-ready record."""
    torch.manual_seed(run.train.seed)
    model = build_model(run.model)
    start = time.perf_counter()
    history = train_task(model, run.task, run.train, log=log)
    train_seconds = time.perf_counter() - start
    counts = evaluate_task(model, run.task, per_value=run.train.eval_per_value, seed=run.train.seed)
    return {
        "task": run.task.name,
        "task_config": to_dict(run.task),
        "model": describe_model(run.model),
        "train": to_dict(run.train),
        "accuracy": {str(d): ok / n for d, (ok, n) in counts.items()},
        "counts": {str(d): [ok, n] for d, (ok, n) in counts.items()},
        "accuracy_binned": {str(k): v for k, v in bin_counts(counts, run.model.seg_len).items()},
        "overall_accuracy": sum(ok for ok, _ in counts.values()) / max(sum(n for _, n in counts.values()), 1),
        "final_train_loss": float(np.mean([r["loss"] for r in history[-20:]])),
        "history": _history_summary(history),
        "train_seconds": train_seconds,
        "n_parameters": sum(p.numel() for p in model.parameters()),
        # the code, the task's generator and the machine that made this record
        "provenance": run_provenance(
            code_state(),
            generated(
                "compressive_transformer.experiments.tasks.generators", {"task": run.task.name, **to_dict(run.task)}
            ),
        ),
    }


def run_task(
    config: str | Path | TaskRunConfig, out_dir: str | Path, *, overrides: Sequence[str] = (), log: Log = print
) -> dict[str, Any]:
    """``task train CONFIG``: one model on one task from a TOML file; writes ``OUT/result.json`` and a plot."""
    run = config if isinstance(config, TaskRunConfig) else load_task_run_config(config, overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = run_one(run, log=log)
    record["command"] = (
        f"compressive-transformer task train {config}" + "".join(f" --set {o}" for o in overrides) + f" --out {out_dir}"
    )
    write_json(out / "result.json", record)

    plot_accuracy_by_distance([record], out / "accuracy_by_distance.png", title=f"{run.task.name}")
    return record


# ---------------------------------------------------------------------------------------------------------------
# the equal-attention-cost experiment


@dataclass(frozen=True)
class Preset:
    """Sizes of one version of the experiment. The memory layout is always TXL n_m = 2k vs CT n_m = n_cm = k, c = 4
    (equal attention cost), with ``k = seg_len``; the tasks' distances straddle both models' ranges."""

    name: str
    seg_len: int
    seq_len: int
    d_model: int
    n_heads: int
    d_ff: int
    steps: int  # main comparison, per model and task
    ablation_steps: int  # per cell of the compression fn x loss grid
    batch_size: int
    lr: float
    warmup_steps: int
    eval_per_value: int
    curriculum_steps: int  # one-segment examples first (see TaskTrainConfig)
    n_layers: int = 2
    compression_rate: int = 4

    def tasks(self) -> dict[str, TaskConfig]:
        s, L = self.seg_len, self.seq_len
        txl_reach = self.n_layers * 2 * s + s - 1  # last position of a segment
        pairs, copies = min(4, (s - 1) // 3), min(4, (s - 1) // 2)  # the curriculum needs them within one segment
        return {
            # distances inside both ranges, between one- and two-layer TXL reach, and beyond TXL's range
            "passkey": PasskeyConfig(
                seq_len=L, distances=_passkey_distances(s, L), n_filler=16, n_keys=16, n_values=16
            ),
            "associative_recall": AssociativeRecallConfig(
                seq_len=L,
                n_pairs=pairs,
                gaps=tuple(sorted({s // 4, txl_reach // 2, txl_reach + s // 2, L - 3 * pairs - 2})),
                n_filler=16,
                n_keys=16,
                n_values=16,
            ),
            "selective_copy": SelectiveCopyConfig(
                seq_len=L, n_tokens=copies, gap=s, n_filler=16, n_keys=1, n_values=16
            ),
        }

    def model(self, name: str, vocab_size: int) -> ModelConfig:
        base = dict(
            vocab_size=vocab_size,
            d_model=self.d_model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            d_ff=self.d_ff,
            seg_len=self.seg_len,
            dropout=0.0,
        )
        k, c = self.seg_len, self.compression_rate
        if name == "txl":
            return ModelConfig(**base, memory=MemoryConfig(2 * k, 0), compression=CompressionConfig(rate=c))
        if name == "ct":
            comp = CompressionConfig(rate=c, function="conv", loss="attention")
            return ModelConfig(**base, memory=MemoryConfig(k, k), compression=comp)
        if name.startswith("ct-"):
            fn, loss = _ablation_cell(name)
            return ModelConfig(
                **base, memory=MemoryConfig(k, k), compression=CompressionConfig(rate=c, function=fn, loss=loss)
            )
        raise ConfigError(f"models: unknown {name!r}; use txl, ct or ct-<compression>-<loss> (e.g. ct-mean_pool-none)")

    def train(self, name: str, seed: int, *, ablation: bool) -> TaskTrainConfig:
        steps = self.ablation_steps if ablation else self.steps
        return TaskTrainConfig(
            steps=steps,
            batch_size=self.batch_size,
            lr=self.lr,
            warmup_steps=self.warmup_steps,
            eval_per_value=self.eval_per_value,
            seed=seed,
            curriculum_steps=min(self.curriculum_steps, steps),
        )


def _passkey_distances(s: int, L: int) -> tuple[int, ...]:
    """In units of the segment: 0.5, 1.5, 2.5 (one TXL layer reaches them), 3.5, 4.5 (two TXL layers),
    5.5, 7.5, 9.5 (beyond TXL's 2 x 2s + s - 1, within CT's 2 x (s + 4s) + s - 1)."""
    return tuple(d for d in (s // 2 + k * s for k in (0, 1, 2, 3, 4, 5, 7, 9)) if d <= L - 2)


ABLATION = (  # cheapest first: the local losses keep a graph in every segment, so those cells cost the most
    ("max_pool", "none"),
    ("mean_pool", "none"),
    ("most_used", "none"),
    ("conv", "bptt"),
    ("dilated_conv", "bptt"),
    ("conv", "attention"),
    ("conv", "autoencoder"),
    ("dilated_conv", "attention"),
    ("dilated_conv", "autoencoder"),
)
ABLATION_MODELS = tuple(f"ct-{fn}-{loss}" for fn, loss in ABLATION)


def _ablation_cell(name: str) -> tuple[str, str]:
    for fn, loss in ABLATION:
        if name == f"ct-{fn}-{loss}":
            return fn, loss
    raise ConfigError(f"models: unknown {name!r}; the ablation cells are {', '.join(ABLATION_MODELS)}")


PRESETS: dict[str, Preset] = {
    # seconds: the shape of the experiment at toy size, for tests and a first look
    "quick": Preset(
        "quick",
        seg_len=8,
        seq_len=80,
        d_model=16,
        n_heads=2,
        d_ff=32,
        steps=3,
        ablation_steps=2,
        batch_size=4,
        lr=3e-3,
        warmup_steps=1,
        eval_per_value=4,
        curriculum_steps=1,
    ),
    # the committed results: minutes per model on passkey on one CPU thread (lr 2e-3 and above stall at chance)
    "full": Preset(
        "full",
        seg_len=32,
        seq_len=320,
        d_model=64,
        n_heads=4,
        d_ff=128,
        steps=800,
        ablation_steps=500,
        batch_size=32,
        lr=1e-3,
        warmup_steps=40,
        eval_per_value=64,
        curriculum_steps=250,
    ),
}


def train_config(preset: Preset, *, seed: int, steps: int | None, ablation: bool) -> TaskTrainConfig:
    """The preset's training for a main model or an ablation cell; ``steps`` overrides its budget (the warm-up and
    the one-segment curriculum shrink with it: at most a tenth and a half of it)."""
    train = preset.train("", seed, ablation=ablation)
    if steps is None:
        return train
    return dataclasses.replace(
        train,
        steps=steps,
        warmup_steps=min(train.warmup_steps, max(steps // 10, 1)),
        curriculum_steps=min(train.curriculum_steps, steps // 2),
    )


def experiment_command(
    preset: str, out_dir: str | Path, tasks: Sequence[str], models: Sequence[str], seed: int, steps: int | None
) -> str:
    cmd = f"compressive-transformer task long-range --preset {preset} --tasks {','.join(tasks)} --models {','.join(models)} --seed {seed}"
    if steps is not None:
        cmd += f" --budget {steps}"
    return cmd + f" --out {out_dir}"


def run_long_range(
    preset: str | Preset,
    out_dir: str | Path,
    *,
    tasks: Sequence[str] = ("passkey",),
    models: Sequence[str] = ("txl", "ct"),
    seed: int = 0,
    budget: int | None = None,
    log: Log = print,
) -> dict[str, Any]:
    """Train each model on each task, evaluate accuracy by distance, merge into ``OUT/results.json``, plot.

    ``models``: ``txl``, ``ct``, ``ct-<compression>-<loss>`` cells, or ``ablation`` for all nine cells.
    ``budget`` overrides the preset's training steps (main models and ablation cells alike). Results already in
    ``results.json`` for other (task, model) pairs are kept, so the ablation can be run as a separate command.
    """
    if isinstance(preset, str) and preset not in PRESETS:
        raise ConfigError(f"--preset: unknown {preset!r}; use one of {', '.join(PRESETS)}")
    p = PRESETS[preset] if isinstance(preset, str) else preset
    all_tasks = p.tasks()
    for t in tasks:
        if t not in all_tasks:
            raise ConfigError(f"--tasks: unknown {t!r}; use one of {', '.join(all_tasks)}")
    models = tuple(x for m in models for x in (ABLATION_MODELS if m == "ablation" else (m,)))  # "ablation": every cell
    vocab = max(cfg.vocab_size for cfg in all_tasks.values())
    runs = {m: p.model(m, vocab) for m in models}  # validates every name before any training
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    command = experiment_command(p.name, out_dir, tasks, models, seed, budget)
    with locked_results(out) as results:  # fail early on a results file of another preset
        if results.get("preset") not in (None, p.name):
            raise ConfigError(
                f"{out / RESULTS_FILE}: holds results of preset {results['preset']!r}; use another --out for preset {p.name!r}"
            )

    def one(cell: tuple[str, str]) -> dict[str, Any]:
        task_name, model_name = cell
        train = train_config(p, seed=seed, steps=budget, ablation=model_name.startswith("ct-"))
        log(
            f"{task_name} / {model_name}: {train.steps} steps, {describe_model(runs[model_name])['attention_cost']} query-key pairs per segment"
        )
        return run_one(TaskRunConfig(runs[model_name], all_tasks[task_name], train), log=log)

    def done(cell: tuple[str, str], record: dict[str, Any]) -> None:
        task_name, model_name = cell
        record.update({"name": model_name, "command": command})
        with locked_results(out) as results:  # other processes may be adding their runs to the same file
            results.update({"preset": p.name, "preset_config": dataclasses.asdict(p), "seed": seed})
            entries = [e for e in results.get("runs", []) if not (e["task"] == task_name and e["name"] == model_name)]
            results["runs"] = entries + [record]
        key = "accuracy_binned" if binned(task_name) else "accuracy"
        log("  accuracy by distance: " + ", ".join(f"{d}: {a:.2f}" for d, a in record[key].items()))

    run_cells([(t, m) for t in tasks for m in models], one, on_done=done)
    with locked_results(out) as results:
        write_long_range_outputs(out, results, ("txl", "ct", *ABLATION_MODELS))
    return results


__all__ = [
    "ABLATION",
    "ABLATION_MODELS",
    "PRESETS",
    "Preset",
    "describe_model",
    "run_long_range",
    "run_one",
    "run_task",
    "train_config",
]
