"""Generated long-range tasks streamed through a model segment by segment, and the equal-attention-cost experiment.

Every example is fed in segments of ``n_s`` tokens with memory carried from segment to segment (never the whole
sequence in one window) and emptied between examples (a fresh ``model.init_memory(B)`` per batch of examples). The
loss is the cross-entropy at answer positions only, plus the auxiliary compression loss; accuracy is measured per
distance on fresh examples drawn from a seed the training stream never uses.

:func:`run_long_range` trains Transformer-XL and the Compressive Transformer at equal attention cost
(``n_s (n_s + n_m + n_cm)``), plus, optionally, every compression function x compression loss of the paper's
ablation, and writes ``results.json`` (accuracy by distance, attention cost, theoretical range, the command) with a
plot beside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from compressive_transformer.config import (
    ConfigError,
    ModelConfig,
    RunConfig,
    TrainConfig,
    apply_overrides,
    from_dict,
    load_toml,
    to_dict,
)
from compressive_transformer.models import MemoryModel, build_model
from compressive_transformer.context import temporal_range
from compressive_transformer.schedule import learning_rate
from compressive_transformer.streaming import Segment, segments, stream
from compressive_transformer.tasks import (
    IGNORE_INDEX,
    AssociativeRecallConfig,
    PasskeyConfig,
    SelectiveCopyConfig,
    TaskConfig,
    make_batch,
    task_config,
)

Log = Callable[[str], None]
RESULTS_FILE = "results.json"


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------------------------
# configuration of one (model, task) run


@dataclass(frozen=True)
class TaskTrainConfig:
    """Optimisation of one model on one generated task (Adam, linear warmup then cosine, as the trainer)."""

    steps: int = 300
    batch_size: int = 16
    lr: float = 1e-3
    lr_start: float = 1e-5
    lr_final: float = 1e-5
    warmup_steps: int = 30
    grad_clip: float = 1.0  # the paper's 0.1 is for large LMs; these tiny models train faster at 1.0
    eval_per_value: int = 64  # evaluation examples per distance (passkey) or gap (recall); x4 for selective copy
    seed: int = 0
    # the first steps train on one-segment examples (every distance up to n_s): retrieval is learnt there in a few
    # hundred steps, among few distractors, and carries over to memory; without it the full task sits at chance
    curriculum_steps: int = 0

    def __post_init__(self) -> None:
        for key in ("steps", "batch_size", "eval_per_value"):
            if getattr(self, key) < 1:
                raise ConfigError(f"train.{key}: must be >= 1")
        if not 0 <= self.curriculum_steps <= self.steps:
            raise ConfigError("train.curriculum_steps: must lie in [0, steps]")
        if not 0 <= self.warmup_steps:
            raise ConfigError("train.warmup_steps: must be >= 0")
        if not 0 < self.lr_start <= self.lr or not 0 <= self.lr_final <= self.lr:
            raise ConfigError("train.lr_start / train.lr_final: must lie in (0, lr]")

    def schedule(self) -> TrainConfig:
        """The trainer's TrainConfig with these numbers, so :func:`schedule.learning_rate` is reused as is."""
        return TrainConfig(
            seed=self.seed, steps=self.steps, batch_size=self.batch_size, lr=self.lr, lr_start=self.lr_start,
            lr_final=self.lr_final, warmup_steps=min(self.warmup_steps, self.steps), grad_clip=self.grad_clip,
            device="cpu", progress=False,
        )  # fmt: skip


@dataclass(frozen=True)
class TaskRunConfig:
    model: ModelConfig
    task: TaskConfig
    train: TaskTrainConfig

    def __post_init__(self) -> None:
        if self.model.vocab_size < self.task.vocab_size:
            raise ConfigError(
                f"model.vocab_size: {self.model.vocab_size} is smaller than the task's vocabulary "
                f"({self.task.vocab_size}); raise it"
            )
        if self.model.input_dim:
            raise ConfigError("model.input_dim: the generated tasks are token sequences; set input_dim = 0")


def load_task_run_config(path: str | Path, overrides: Sequence[str] = ()) -> TaskRunConfig:
    """A ``configs/long_range/*.toml`` file: ``[model]``, ``[task]`` (with ``name``) and ``[train]`` tables."""
    raw = apply_overrides(load_toml(path), list(overrides))
    unknown = sorted(set(raw) - {"model", "task", "train"})
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section; a task config has [model], [task] and [train]")
    task_raw = dict(raw.get("task", {}))
    name = task_raw.pop("name", None)
    if name is None:
        raise ConfigError("task.name: missing; use passkey, associative_recall or selective_copy")
    task_raw = {k: tuple(v) if isinstance(v, list) else v for k, v in task_raw.items()}
    task = task_config(name, **task_raw)
    model_raw = dict(raw.get("model", {}))
    model_raw.setdefault("vocab_size", task.vocab_size)
    return TaskRunConfig(
        model=from_dict(ModelConfig, model_raw, "model"),
        task=task,
        train=from_dict(TaskTrainConfig, raw.get("train", {}), "train"),
    )


# ---------------------------------------------------------------------------------------------------------------
# streaming one batch of examples


@dataclass
class StreamResult:
    predictions: torch.Tensor  # (B, L) arg-max prediction at every position
    nll: float  # summed cross-entropy over answer positions (nats)
    answers: int
    aux_loss: float  # mean over segments of the (layer-averaged) compression loss
    aux_losses: list[float]  # per layer, mean over segments


def _needs_graph_every_segment(cfg: ModelConfig) -> bool:
    """The local compression losses train the compressor in every segment that evicts, answers or not."""
    return cfg.uses_compression and cfg.compression_loss in ("attention", "autoencoder")


def stream_task_batch(
    model: MemoryModel,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    *,
    seg_len: int,
    backward: bool = False,
) -> StreamResult:
    """Feed (B, L) examples in segments of ``seg_len`` from an empty memory, carrying memory across segments.

    With ``backward`` the loss (answer NLL / answers + compression loss / segments) is back-propagated segment by
    segment: memories are detached between segments, so each segment's graph is independent and none is kept
    longer than needed. Segments without answers run without a graph unless a local compression loss needs one.
    """
    B, L = tokens.shape
    n_seg = math.ceil(L / seg_len)
    answers = int((targets != IGNORE_INDEX).sum())
    predictions = torch.empty_like(tokens)
    nll_total, aux_total = 0.0, 0.0
    aux_layers = torch.zeros(model.cfg.n_layers)
    every = _needs_graph_every_segment(model.cfg)

    def graph(seg: Segment) -> bool:
        return backward and (every or bool((seg.targets != IGNORE_INDEX).any()))

    parts = segments(tokens, seg_len, targets)
    for step in stream(model, parts, batch_size=B, device=tokens.device, eval_mode=False, with_targets=True, grad=graph):
        out = step.out
        n_here = int((step.batch.targets != IGNORE_INDEX).sum())
        nll = out.loss * n_here  # the model's loss is a mean over this segment's answers
        if graph(step.batch):
            total = nll / max(answers, 1) + out.aux_loss / n_seg
            if total.requires_grad:
                total.backward()
        part = slice(step.index * seg_len, step.index * seg_len + step.batch.tokens.shape[1])
        predictions[:, part] = out.logits.detach().argmax(-1)
        nll_total += float(nll.detach())
        aux_total += float(out.aux_loss.detach())
        aux_layers += out.aux_losses.detach().float().cpu()
    return StreamResult(predictions, nll_total, answers, aux_total / n_seg, (aux_layers / n_seg).tolist())


# ---------------------------------------------------------------------------------------------------------------
# training and evaluation


def one_segment_version(task: TaskConfig, seg_len: int) -> TaskConfig:
    """The task shrunk to one segment, with every distance (gap) that fits: the curriculum's first stage."""
    if isinstance(task, PasskeyConfig):
        return dataclasses.replace(task, seq_len=seg_len, distances=tuple(range(2, seg_len - 1)))
    if isinstance(task, AssociativeRecallConfig):
        longest = seg_len - 3 * task.n_pairs - 1
        if longest < 0:
            raise ConfigError(f"train.curriculum_steps: {task.n_pairs} pairs do not fit in one segment of {seg_len}")
        return dataclasses.replace(task, seq_len=seg_len, gaps=tuple(range(0, longest + 1)))
    if seg_len < 2 * task.n_tokens + 1:
        raise ConfigError(f"train.curriculum_steps: {task.n_tokens} tokens to copy do not fit in one segment of {seg_len}")
    return dataclasses.replace(task, seq_len=seg_len, gap=0)


def _optimizer(model: MemoryModel, sched: TrainConfig) -> torch.optim.Optimizer:
    from compressive_transformer.train import build_optimizer  # the trainer's (model and compressor groups)

    return build_optimizer(model, RunConfig(model=model.cfg, train=sched))


def train_task(
    model: MemoryModel,
    task: TaskConfig,
    train: TaskTrainConfig,
    *,
    seg_len: int | None = None,
    log: Log = _quiet,
    log_every: int = 25,
) -> list[dict[str, Any]]:
    """Train ``model`` on freshly generated batches of ``task`` (seeded by ``train.seed``); returns per-step metrics."""
    seg_len = seg_len or model.cfg.seg_len
    sched = train.schedule()
    optimizer = _optimizer(model, sched)
    rng = np.random.default_rng(train.seed)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    short = one_segment_version(task, seg_len) if train.curriculum_steps else task
    history: list[dict[str, Any]] = []
    model.train()
    start = time.perf_counter()
    for step in range(train.steps):
        lr = learning_rate(sched, step)
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        tokens, targets, _ = make_batch(short if step < train.curriculum_steps else task, train.batch_size, rng)
        tgt = torch.from_numpy(targets)
        res = stream_task_batch(model, torch.from_numpy(tokens), tgt, seg_len=seg_len, backward=True)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, train.grad_clip if train.grad_clip > 0 else float("inf")))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mask = tgt != IGNORE_INDEX
        acc = float((res.predictions[mask] == tgt[mask]).float().mean())
        loss = res.nll / max(res.answers, 1)
        if not math.isfinite(loss):
            raise RuntimeError(f"the task loss became {loss} at step {step + 1}; lower train.lr")
        record = {"step": step + 1, "loss": loss, "accuracy": acc, "aux_loss": res.aux_loss, "aux_losses": res.aux_losses,
                  "lr": lr, "grad_norm": grad_norm, "seconds": time.perf_counter() - start}  # fmt: skip
        history.append(record)
        if (step + 1) % log_every == 0 or step + 1 == train.steps:
            log(f"  step {step + 1}/{train.steps} loss {loss:.3f} acc {acc:.3f} aux {res.aux_loss:.4f} ({record['seconds']:.0f} s)")
    model.eval()
    return history


def _eval_configs(task: TaskConfig) -> list[TaskConfig]:
    """One config per distance (passkey) or gap (recall), so each gets the same number of examples."""
    if isinstance(task, PasskeyConfig):
        return [dataclasses.replace(task, distances=(d,)) for d in sorted(set(task.distances))]
    if isinstance(task, AssociativeRecallConfig):
        return [dataclasses.replace(task, gaps=(g,)) for g in sorted(set(task.gaps))]
    return [task]


@torch.no_grad()
def evaluate_task(
    model: MemoryModel,
    task: TaskConfig,
    *,
    per_value: int = 64,
    seed: int = 0,
    batch_size: int = 64,
    seg_len: int | None = None,
) -> dict[int, tuple[int, int]]:
    """``{distance: (correct, total)}`` on fresh examples (seed offset from training), streamed with memory."""
    seg_len = seg_len or model.cfg.seg_len
    was_training = model.training
    model.eval()
    counts: dict[int, list[int]] = {}
    rng = np.random.default_rng(1_000_003 + seed)  # never the training stream's generator
    configs = _eval_configs(task)
    n = per_value * (4 if isinstance(task, SelectiveCopyConfig) else 1)
    for cfg in configs:
        done = 0
        while done < n:
            b = min(batch_size, n - done)
            tokens, targets, distances = make_batch(cfg, b, rng)
            res = stream_task_batch(model, torch.from_numpy(tokens), torch.from_numpy(targets), seg_len=seg_len)
            mask = targets != IGNORE_INDEX
            correct = res.predictions.numpy()[mask] == targets[mask]
            for d, ok in zip(distances[mask].tolist(), correct.tolist()):
                c = counts.setdefault(int(d), [0, 0])
                c[0] += int(ok)
                c[1] += 1
            done += b
    model.train(was_training)
    return {d: (c[0], c[1]) for d, c in sorted(counts.items())}


def bin_counts(counts: dict[int, tuple[int, int]], width: int) -> dict[int, float]:
    """Accuracy per distance bin ``[k*width, (k+1)*width)``, keyed by the bin's centre; for tasks whose distances
    are spread out (selective copy) so each point of the plot averages enough answers."""
    bins: dict[int, list[int]] = {}
    for d, (ok, n) in counts.items():
        b = bins.setdefault(d // width, [0, 0])
        b[0] += ok
        b[1] += n
    return {k * width + width // 2: ok / n for k, (ok, n) in sorted(bins.items())}


def describe_model(cfg: ModelConfig) -> dict[str, Any]:
    """Attention cost and ranges of a model, as results.json records them."""
    r = temporal_range(cfg)
    return {
        "kind": "compressive" if cfg.uses_compression else "transformer-xl",
        "seg_len": cfg.seg_len,
        "mem_len": cfg.mem_len,
        "cmem_len": cfg.cmem_len,
        "compression_rate": cfg.compression_rate if cfg.uses_compression else None,
        "compression": cfg.compression if cfg.uses_compression else None,
        "compression_loss": cfg.compression_loss if cfg.uses_compression else None,
        "n_layers": cfg.n_layers,
        "d_model": cfg.d_model,
        "attention_cost": r.attention_cost,
        "max_range": r.max_range,
        # the last position of a segment sees n_s - 1 more tokens than the first, which the range counts
        "max_range_last_position": r.max_range + cfg.seg_len - 1,
        "single_layer_reach_last_position": cfg.mem_len + (cfg.compression_rate * cfg.cmem_len if cfg.uses_compression else 0) + cfg.seg_len - 1,
    }


def _history_summary(history: list[dict[str, Any]], points: int = 50) -> list[dict[str, Any]]:
    """At most ``points`` records (averaged over windows) so results.json stays small."""
    if not history:
        return []
    size = max(1, len(history) // points)
    out = []
    for i in range(0, len(history), size):
        chunk = history[i : i + size]
        out.append({
            "step": chunk[-1]["step"],
            "loss": float(np.mean([r["loss"] for r in chunk])),
            "accuracy": float(np.mean([r["accuracy"] for r in chunk])),
            "aux_loss": float(np.mean([r["aux_loss"] for r in chunk])),
        })  # fmt: skip
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
    }


def run_task(config: str | Path | TaskRunConfig, out_dir: str | Path, *, overrides: Sequence[str] = (), log: Log = print) -> dict[str, Any]:
    """``task train CONFIG``: one model on one task from a TOML file; writes ``OUT/result.json`` and a plot."""
    run = config if isinstance(config, TaskRunConfig) else load_task_run_config(config, overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = run_one(run, log=log)
    record["command"] = f"compressive-transformer task train {config}" + "".join(f" --set {o}" for o in overrides) + f" --out {out_dir}"
    (out / "result.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    from compressive_transformer.analysis.plots import plot_accuracy_by_distance

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
            "passkey": PasskeyConfig(seq_len=L, distances=_passkey_distances(s, L), n_filler=16, n_keys=16, n_values=16),
            "associative_recall": AssociativeRecallConfig(
                seq_len=L, n_pairs=pairs, gaps=tuple(sorted({s // 4, txl_reach // 2, txl_reach + s // 2, L - 3 * pairs - 2})), n_filler=16, n_keys=16, n_values=16
            ),
            "selective_copy": SelectiveCopyConfig(seq_len=L, n_tokens=copies, gap=s, n_filler=16, n_keys=1, n_values=16),
        }

    def model(self, name: str, vocab_size: int) -> ModelConfig:
        base = dict(
            vocab_size=vocab_size, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads, d_ff=self.d_ff,
            seg_len=self.seg_len, dropout=0.0, compression_rate=self.compression_rate,
        )  # fmt: skip
        k = self.seg_len
        if name == "txl":
            return ModelConfig(**base, mem_len=2 * k, cmem_len=0)
        if name == "ct":
            return ModelConfig(**base, mem_len=k, cmem_len=k, compression="conv", compression_loss="attention")
        if name.startswith("ct-"):
            fn, loss = _ablation_cell(name)
            return ModelConfig(**base, mem_len=k, cmem_len=k, compression=fn, compression_loss=loss)
        raise ConfigError(f"models: unknown {name!r}; use txl, ct or ct-<compression>-<loss> (e.g. ct-mean_pool-none)")

    def train(self, name: str, seed: int, *, ablation: bool) -> TaskTrainConfig:
        steps = self.ablation_steps if ablation else self.steps
        return TaskTrainConfig(
            steps=steps, batch_size=self.batch_size, lr=self.lr, warmup_steps=self.warmup_steps,
            eval_per_value=self.eval_per_value, seed=seed, curriculum_steps=min(self.curriculum_steps, steps),
        )  # fmt: skip


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
    "quick": Preset("quick", seg_len=8, seq_len=80, d_model=16, n_heads=2, d_ff=32, steps=3, ablation_steps=2,
                    batch_size=4, lr=3e-3, warmup_steps=1, eval_per_value=4, curriculum_steps=1),
    # the committed results: minutes per model on passkey on one CPU thread (lr 2e-3 and above stall at chance)
    "full": Preset("full", seg_len=32, seq_len=320, d_model=64, n_heads=4, d_ff=128, steps=800, ablation_steps=500,
                   batch_size=32, lr=1e-3, warmup_steps=40, eval_per_value=64, curriculum_steps=250),
}  # fmt: skip


def train_config(preset: Preset, *, seed: int, steps: int | None, ablation: bool) -> TaskTrainConfig:
    """The preset's training for a main model or an ablation cell; ``steps`` overrides its budget (the warm-up and
    the one-segment curriculum shrink with it: at most a tenth and a half of it)."""
    train = preset.train("", seed, ablation=ablation)
    if steps is None:
        return train
    return dataclasses.replace(
        train, steps=steps, warmup_steps=min(train.warmup_steps, max(steps // 10, 1)),
        curriculum_steps=min(train.curriculum_steps, steps // 2),
    )  # fmt: skip


def experiment_command(preset: str, out_dir: str | Path, tasks: Sequence[str], models: Sequence[str], seed: int, steps: int | None) -> str:
    cmd = f"compressive-transformer task long-range --preset {preset} --tasks {','.join(tasks)} --models {','.join(models)} --seed {seed}"
    if steps is not None:
        cmd += f" --budget {steps}"
    return cmd + f" --out {out_dir}"


def run_long_range(
    preset: str | Preset = "full",
    out_dir: str | Path = "benchmarks/long_range",
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
    with _locked_results(out) as results:  # fail early on a results file of another preset
        if results.get("preset") not in (None, p.name):
            raise ConfigError(f"{out / RESULTS_FILE}: holds results of preset {results['preset']!r}; use another --out for preset {p.name!r}")
    for task_name in tasks:
        for model_name in models:
            train = train_config(p, seed=seed, steps=budget, ablation=model_name.startswith("ct-"))
            log(f"{task_name} / {model_name}: {train.steps} steps, {describe_model(runs[model_name])['attention_cost']} query-key pairs per segment")
            record = run_one(TaskRunConfig(runs[model_name], all_tasks[task_name], train), log=log)
            record.update({"name": model_name, "command": command})
            with _locked_results(out) as results:  # other processes may be adding their runs to the same file
                results.update({"preset": p.name, "preset_config": dataclasses.asdict(p), "seed": seed})
                entries = [e for e in results.get("runs", []) if not (e["task"] == task_name and e["name"] == model_name)]
                results["runs"] = entries + [record]
            key = "accuracy_binned" if _binned(task_name) else "accuracy"
            log("  accuracy by distance: " + ", ".join(f"{d}: {a:.2f}" for d, a in record[key].items()))
    with _locked_results(out) as results:
        write_long_range_outputs(out, results)
    return results


@contextlib.contextmanager
def _locked_results(out: Path) -> Iterator[dict[str, Any]]:
    """Read results.json under an exclusive lock, let the caller change it, write it back atomically."""
    path = out / RESULTS_FILE
    fd = os.open(out, os.O_RDONLY)  # the directory itself is the lock: no stray lock file beside the results
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        results = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        before = json.dumps(results, sort_keys=True)
        yield results
        if json.dumps(results, sort_keys=True) != before:
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, path)
    finally:
        os.close(fd)


def write_long_range_outputs(out: Path, results: dict[str, Any]) -> None:
    """The plots (one per task: accuracy against distance with each model's range) and the markdown tables."""
    from compressive_transformer.analysis.plots import plot_accuracy_by_distance

    for task, entries in _by_task(results).items():
        main = [e for e in entries if not e["name"].startswith("ct-")]
        if main:
            plot_accuracy_by_distance(main, out / f"{task}.png", title=f"{task}: equal attention cost", binned=_binned(task))
        cells = [e for e in entries if e["name"].startswith("ct-")]
        if cells:
            plot_accuracy_by_distance(cells + [e for e in main if e["name"] == "txl"], out / f"{task}_ablation.png",
                                      title=f"{task}: compression fn x loss", binned=_binned(task))  # fmt: skip
    (out / "results.md").write_text(results_markdown(results), encoding="utf-8")


def _binned(task: str) -> bool:
    """Recall and copy answers spread over many distances: tables and plots pool them per segment-wide bin."""
    return task != "passkey"


def _split_accuracy(entry: dict[str, Any], txl_reach: int) -> tuple[float, float]:
    """Mean accuracy over answers within / beyond ``txl_reach``."""
    within, beyond = [0, 0], [0, 0]
    for d, (ok, n) in entry["counts"].items():
        side = within if int(d) <= txl_reach else beyond
        side[0] += ok
        side[1] += n
    return (within[0] / within[1] if within[1] else float("nan"), beyond[0] / beyond[1] if beyond[1] else float("nan"))


def _order(name: str) -> tuple[int, int]:
    """txl, ct, then the ablation cells in the order of ABLATION."""
    if name in ("txl", "ct"):
        return (0, ("txl", "ct").index(name))
    return (1, ABLATION_MODELS.index(name) if name in ABLATION_MODELS else len(ABLATION_MODELS))


def _by_task(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    by_task: dict[str, list[dict[str, Any]]] = {}
    for e in sorted(results.get("runs", []), key=lambda e: _order(e["name"])):
        by_task.setdefault(e["task"], []).append(e)
    return by_task


def results_markdown(results: dict[str, Any]) -> str:
    """Accuracy-by-distance tables per task and the ablation table (compression fn x loss)."""
    lines = [f"# Long-range tasks at equal attention cost (preset `{results.get('preset')}`, seed {results.get('seed')})", ""]
    by_task = _by_task(results)
    for task, entries in by_task.items():
        key = "accuracy_binned" if _binned(task) else "accuracy"
        dists = sorted({int(d) for e in entries for d in e[key]})
        lines += [f"## {task}", "", "accuracy by distance" + (" (bins of one segment, centres shown)" if key == "accuracy_binned" else ""), ""]
        lines.append("| model | attention cost | max range l(n_m + c n_cm) | steps | " + " | ".join(str(d) for d in dists) + " |")
        lines.append("|---|---|---|---|" + "---|" * len(dists))
        for e in entries:
            m = e["model"]
            row = [e["name"], str(m["attention_cost"]), str(m["max_range"]), str(e["train"]["steps"])]
            row += [f"{e[key][str(d)]:.2f}" if str(d) in e[key] else "" for d in dists]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
        cells = [e for e in entries if e["name"].startswith("ct-")]
        txl = next((e for e in entries if e["name"] == "txl"), None)
        main_ct = next((e for e in entries if e["name"] == "ct"), None)
        if cells and main_ct and not any(e["name"] == "ct-conv-attention" for e in cells):
            cells.append(main_ct)  # the main model is the conv x attention cell (at its own, larger budget)
        if cells:
            reach = txl["model"]["max_range_last_position"] if txl else cells[0]["model"]["seg_len"] * 5 - 1
            lines += [f"### ablation: compression fn x loss ({task})", "",
                      f"accuracy on answers within / beyond Transformer-XL's reach ({reach} tokens back from the answer)", "",
                      "| compression fn | compression loss | within | beyond | all | steps |", "|---|---|---|---|---|---|"]  # fmt: skip
            for e in cells + ([txl] if txl else []):
                w, b = _split_accuracy(e, reach)
                fn = e["model"]["compression"] or "(Transformer-XL, n_m = 2k)"
                loss = e["model"]["compression_loss"] or "-"
                lines.append(f"| {fn} | {loss} | {w:.2f} | {b:.2f} | {e['overall_accuracy']:.2f} | {e['train']['steps']} |")
            lines.append("")
    commands = sorted({e["command"] for e in results.get("runs", [])})
    lines += ["Produced by:", ""] + [f"    {c}" for c in commands] + [""]
    return "\n".join(lines)
