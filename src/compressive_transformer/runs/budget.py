"""Refuse lengths that cannot fit in memory before anything is allocated.

A typo such as ``seg_len = 1000000`` would otherwise ask torch for terabytes deep inside the first forward pass (a
traceback, after the run directory was made). :func:`check_fits` compares a *lower bound* of what one forward pass
needs (the memories plus one layer's attention scores) with the device's total memory, so it only refuses what
cannot possibly work and never a config that merely runs close to the limit.
"""

from __future__ import annotations

import os

import torch

from compressive_transformer.core.config import ConfigError, ModelConfig

GiB = 1 << 30


def device_memory_bytes(device: torch.device) -> int | None:
    """Total memory of ``device`` (RAM for the CPU), or None where it cannot be read."""
    try:
        if device.type == "cuda":
            return torch.cuda.get_device_properties(device).total_memory
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError, RuntimeError):
        return None


def forward_bytes(
    cfg: ModelConfig, *, batch_size: int, seg_len: int, mem_len: int, cmem_len: int, element_size: int = 4
) -> int:
    """A lower bound of the bytes one forward pass holds: every layer's memory and compressed memory, the segment's
    hidden states, and one layer's attention scores (B x H x T x (T + M + C))."""
    B, T, d, L = batch_size, seg_len, cfg.d_model, cfg.n_layers
    memories = B * L * (mem_len + cmem_len) * d
    hidden = B * T * d * 2
    scores = B * cfg.n_heads * T * (T + mem_len + cmem_len)
    a = cfg.adaptive  # an adaptive softmax scores its head for every position, a tail only at its own targets
    width = a.cutoffs[0] + len(a.cutoffs) if a is not None and a.cutoffs else cfg.vocab_size
    logits = B * T * max(width, 1)
    return (memories + hidden + scores + logits) * element_size


def check_fits(
    cfg: ModelConfig,
    *,
    batch_size: int,
    seg_len: int,
    mem_len: int,
    cmem_len: int,
    device: torch.device,
    key: str = "model.seg_len",
) -> None:
    """One-line :class:`ConfigError` naming ``key`` when the lower bound exceeds the device's memory."""
    total = device_memory_bytes(device)
    need = forward_bytes(cfg, batch_size=batch_size, seg_len=seg_len, mem_len=mem_len, cmem_len=cmem_len)
    if total is not None and need > total:
        raise ConfigError(
            f"{key}: batch {batch_size} x seg_len {seg_len} with mem_len {mem_len} and cmem_len {cmem_len} needs at least "
            f"{need / GiB:,.1f} GiB for one forward pass, more than the {total / GiB:,.1f} GiB of {device.type}; lower the lengths or the batch size"
        )
