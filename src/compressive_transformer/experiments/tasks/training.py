"""Training and evaluating a model on a generated long-range task, streamed segment by segment.

Every example is fed in segments of ``n_s`` tokens with memory carried from segment to segment (never the whole
sequence in one window) and emptied between examples (a fresh memory per batch of examples). The loss is the
cross-entropy at answer positions only, plus the auxiliary compression loss; accuracy is measured per distance on
fresh examples drawn from a seed the training stream never uses. The schedule and the optimizer are the trainer's
(:func:`~compressive_transformer.training.schedule.learning_rate`, :func:`~compressive_transformer.training.trainer.build_optimizer`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from compressive_transformer.core.config import (
    ConfigError,
    Log,
    ModelConfig,
    TrainConfig,
    apply_run_overrides,
    from_dict,
    load_toml,
)
from compressive_transformer.core.models import MemoryModel
from compressive_transformer.core.registry import compression_loss_spec
from compressive_transformer.core.streaming import Segment, segments, stream
from compressive_transformer.experiments.tasks.generators import (
    IGNORE_INDEX,
    AssociativeRecallConfig,
    PasskeyConfig,
    SelectiveCopyConfig,
    TaskConfig,
    make_batch,
    task_config,
)
from compressive_transformer.training.schedule import learning_rate
from compressive_transformer.training.trainer import build_optimizer


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------------------------
# configuration of one (model, task) run


@dataclass(frozen=True)
class TaskTrainConfig:
    """Optimisation of one model on one generated task: the trainer's schedule, optimizer and clipping
    (:meth:`schedule` is the :class:`TrainConfig` they read, which also validates these numbers) at sizes that suit
    the tasks, plus the two things only tasks have (evaluation examples, the one-segment curriculum)."""

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
        self.schedule()  # the trainer's own checks of steps, batch size, learning rates, warm-up and clipping
        if self.eval_per_value < 1:
            raise ConfigError("train.eval_per_value: must be >= 1")
        if not 0 <= self.curriculum_steps <= self.steps:
            raise ConfigError("train.curriculum_steps: must lie in [0, steps]")
        if self.lr_start <= 0:
            raise ConfigError("train.lr_start: must be > 0 (the warm-up starts there)")

    def schedule(self) -> TrainConfig:
        """The trainer's TrainConfig with these numbers, so :func:`schedule.learning_rate` is reused as is."""
        return TrainConfig(
            seed=self.seed,
            steps=self.steps,
            batch_size=self.batch_size,
            lr=self.lr,
            lr_start=self.lr_start,
            lr_final=self.lr_final,
            warmup_steps=min(self.warmup_steps, self.steps),
            grad_clip=self.grad_clip,
            device="cpu",
            progress=False,
        )


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
    raw = apply_run_overrides(load_toml(path), list(overrides))
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
        model=ModelConfig.from_raw(model_raw),
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
    return cfg.uses_compression and compression_loss_spec(cfg.compression.loss).local


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
    for step in stream(
        model, parts, batch_size=B, device=tokens.device, eval_mode=False, with_targets=True, grad=graph
    ):
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
        raise ConfigError(
            f"train.curriculum_steps: {task.n_tokens} tokens to copy do not fit in one segment of {seg_len}"
        )
    return dataclasses.replace(task, seq_len=seg_len, gap=0)


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
    optimizer = build_optimizer(model, sched)  # the trainer's: model and compressor groups
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
        grad_norm = float(
            torch.nn.utils.clip_grad_norm_(params, train.grad_clip if train.grad_clip > 0 else float("inf"))
        )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mask = tgt != IGNORE_INDEX
        acc = float((res.predictions[mask] == tgt[mask]).float().mean())
        loss = res.nll / max(res.answers, 1)
        if not math.isfinite(loss):
            raise RuntimeError(f"the task loss became {loss} at step {step + 1}; lower train.lr")
        record = {
            "step": step + 1,
            "loss": loss,
            "accuracy": acc,
            "aux_loss": res.aux_loss,
            "aux_losses": res.aux_losses,
            "lr": lr,
            "grad_norm": grad_norm,
            "seconds": time.perf_counter() - start,
        }
        history.append(record)
        if (step + 1) % log_every == 0 or step + 1 == train.steps:
            log(
                f"  step {step + 1}/{train.steps} loss {loss:.3f} acc {acc:.3f} aux {res.aux_loss:.4f} ({record['seconds']:.0f} s)"
            )
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


__all__ = [
    "Log",
    "StreamResult",
    "TaskRunConfig",
    "TaskTrainConfig",
    "bin_counts",
    "evaluate_task",
    "load_task_run_config",
    "one_segment_version",
    "stream_task_batch",
    "train_task",
]
