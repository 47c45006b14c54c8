"""Learning-rate schedule of the Compressive Transformer paper: linear warmup, then cosine decay to a floor.

A pure function of the update index, so a resumed run needs nothing but the step count to continue it exactly.
"""

from __future__ import annotations

import math

from compressive_transformer.core.config import TrainConfig


def learning_rate(cfg: TrainConfig, step: int) -> float:
    """Learning rate of update ``step`` (0-based): ``lr_start`` -> ``lr`` linearly, then cosine down to ``lr_final``."""
    if step < cfg.warmup_steps:
        return cfg.lr_start + (cfg.lr - cfg.lr_start) * step / cfg.warmup_steps
    decay_steps = cfg.decay_steps or max(cfg.steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / decay_steps, 1.0)
    return cfg.lr_final + (cfg.lr - cfg.lr_final) * 0.5 * (1.0 + math.cos(math.pi * progress))


def schedule_too_short(cfg: TrainConfig) -> str | None:
    """A one-line note where the warmup takes the whole run, so the rate never reaches ``lr`` (a run shortened by
    ``--set train.steps=...`` keeps the config's warmup); None where the schedule reaches its peak."""
    if cfg.warmup_steps < cfg.steps:
        return None
    last = learning_rate(cfg, cfg.steps - 1)
    return (
        f"note: train.warmup_steps = {cfg.warmup_steps} is not below train.steps = {cfg.steps}: the learning rate "
        f"only rises, to {last:.2e} at the last update, never reaching train.lr = {cfg.lr:.2e}; lower "
        f"train.warmup_steps (e.g. --set train.warmup_steps={cfg.steps // 10}) to train at the peak rate"
    )
