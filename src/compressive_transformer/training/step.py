"""How a run's training step is put together, in one place for the trainer and the benchmarks that time it: the
optimizer, under autocast the kept low-precision weight copies the forward reads, DDP across processes,
``train.compile``'s ``torch.compile`` and ``train.cuda_graphs``' captured update.

``train.compile`` and ``train.cuda_graphs`` combine: the forward (and through AOT autograd its backward) is compiled
without any CUDA graph of inductor's own (the default mode, not ``reduce-overhead``), the fused attention stays one
opaque custom op inside it, and the whole update around the compiled forward (losses, backward, clipping, fused
Adam, the refreshed weight copies) is captured by :class:`~compressive_transformer.training.captured.CapturedUpdate`.
The first update at each shape runs eagerly, which compiles; the capture comes at the second, once compiled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

from compressive_transformer.core.config import TrainConfig
from compressive_transformer.core.dtypes import amp_dtype
from compressive_transformer.core.models import MemoryModel
from compressive_transformer.training.captured import CapturedUpdate, capture_reason, make_capturable
from compressive_transformer.training.low_precision import LowPrecisionWeights, WithLowPrecisionWeights


def compile_model(module: torch.nn.Module) -> torch.nn.Module:
    """``torch.compile`` with the AOT-autograd cache off: with torch 2.13 on CPU, a warm cache replays an aliased
    output of the attention graph with garbage sizes (tests/test_compile.py fails on every run after the first)."""
    import torch._functorch.config as functorch_config

    functorch_config.enable_autograd_cache = False
    return torch.compile(module)


def build_optimizer(model: MemoryModel, t: TrainConfig) -> torch.optim.Adam:
    """Adam with one param group for the model and one for the compressor (its lr is scaled by
    ``train.compressor_lr_scale``). ``lr_scale`` rides along in each group so the schedule can set both."""
    trainable = lambda group: [p for p in model.parameters_of(group) if p.requires_grad]  # noqa: E731 - not frozen
    groups = [{"params": trainable("model"), "name": "model", "lr_scale": 1.0}] if trainable("model") else []
    compressor = trainable("compressor")
    if compressor:
        groups.append({"params": compressor, "name": "compressor", "lr_scale": t.compressor_lr_scale})
    return adam(groups, lr=t.lr_start, betas=tuple(t.betas), eps=t.eps, weight_decay=t.weight_decay)


def adam(params: Iterable, **kwargs) -> torch.optim.Adam:
    """Adam with the fused kernel (one pass over all parameters; its step is 3-4x faster than the default on CPU)
    where this torch and the parameters' device have it, else the default implementation."""
    params = list(params)
    try:
        return torch.optim.Adam(params, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, **kwargs)


@dataclass
class TrainingStep:
    """The parts of a run's step: ``forward`` is what the step calls in the model's place."""

    forward: torch.nn.Module
    optimizer: torch.optim.Optimizer
    low_precision: LowPrecisionWeights | None  # the kept copies under autocast (refreshed by every update)
    captured: CapturedUpdate | None  # train.cuda_graphs where this run allows it
    eager_reason: str | None  # why train.cuda_graphs trains eagerly, when it was asked for and does


def training_step(
    model: MemoryModel,
    t: TrainConfig,
    device: torch.device,
    amp: str,
    *,
    distributed: bool = False,
    optimizer: torch.optim.Optimizer | None = None,
) -> TrainingStep:
    """The step of a run training ``model`` (on ``device``) by ``t`` in precision ``amp`` (resolved: none, bf16,
    fp16); ``optimizer``: another than :func:`build_optimizer`'s (a benchmark giving every implementation the same)."""
    dtype = amp_dtype(amp)
    wrapped: torch.nn.Module = model
    low_precision = LowPrecisionWeights(model, dtype) if dtype is not None else None
    if low_precision is not None:
        wrapped = WithLowPrecisionWeights(wrapped, low_precision)
    if distributed:  # gradients are averaged over ranks; every parameter takes part in every step
        wrapped = torch.nn.parallel.DistributedDataParallel(wrapped)
    forward = compile_model(wrapped) if t.compile else wrapped
    optimizer = optimizer if optimizer is not None else build_optimizer(model, t)
    captured, reason = None, None
    if t.cuda_graphs:
        reason = capture_reason(device, amp, distributed)
        if reason is None:
            make_capturable(optimizer)
            captured = CapturedUpdate(forward, optimizer, amp=amp, grad_clip=t.grad_clip, weights=low_precision)
    return TrainingStep(forward, optimizer, low_precision, captured, reason)


__all__ = ["TrainingStep", "adam", "build_optimizer", "compile_model", "training_step"]
