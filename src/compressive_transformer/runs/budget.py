"""Refuse sizes and lengths that cannot fit in memory before anything is allocated.

A typo such as ``seg_len = 1000000`` would otherwise ask torch for terabytes deep inside the first forward pass (a
traceback, after the run directory was made). :func:`check_fits` compares a *lower bound* of what one forward pass
needs (the memories plus one layer's attention scores) with the device's total memory, so it only refuses what
cannot possibly work and never a config that merely runs close to the limit. :func:`check_model_size` does the same
for the parameters a config's sizes make (a config, a run's or an export's, or one being imported).
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


# bytes each parameter holds at least: its fp32 weight (loading a model); with its gradient and Adam's two moments
# (training); beside the source checkpoint's copy of it (importing)
WEIGHT_BYTES, TRAINING_BYTES, IMPORT_BYTES = 4, 16, 8
LAYER_OBJECT_BYTES = 4096  # far less than the Python objects of one layer's modules (a lower bound of a layer's cost)


def parameters_lower_bound(cfg: ModelConfig) -> int:
    """A lower bound of the parameters of the model ``cfg`` describes, from its sizes alone (nothing is built): per
    layer a d_model x d_ff matrix (the feed-forward's first; WaveNet's skip convolution) and the attention's four
    d_model x n_heads*d_head projections (WaveNet: its gated convolution, 4 d_model^2), plus the input embedding (an
    adaptive one cluster by cluster)."""
    d = cfg.d_model
    mixing = 4 * d * d if cfg.is_wavenet else 4 * d * cfg.n_heads * cfg.head_dim
    per_layer = d * cfg.d_ff + mixing
    if cfg.input_dim > 0:
        embedding = cfg.input_dim * d
    elif cfg.adaptive is not None and cfg.adaptive.cutoffs:
        edges = (0, *cfg.adaptive.cutoffs, max(cfg.vocab_size, cfg.adaptive.cutoffs[-1]))
        dims = cfg.adaptive.cluster_dims(d)
        embedding = sum((hi - lo) * w for lo, hi, w in zip(edges, edges[1:], dims))
    else:
        embedding = cfg.vocab_size * d
    return cfg.n_layers * per_layer + embedding


def check_model_size(
    cfg: ModelConfig, *, device: torch.device, bytes_per_parameter: int = WEIGHT_BYTES, key: str = "model"
) -> None:
    """One-line :class:`ConfigError` naming ``key`` when the model ``cfg`` describes cannot fit in the memory of
    ``device`` (its parameters at ``bytes_per_parameter`` each, with its layers' Python objects): checked from the
    config's arithmetic before anything is allocated, so ``d_model = 10**6`` or ``n_layers = 10**9`` stops at once
    instead of asking torch for terabytes or building layers until the machine runs out."""
    total = device_memory_bytes(device)
    n = parameters_lower_bound(cfg)
    need = n * bytes_per_parameter + cfg.n_layers * LAYER_OBJECT_BYTES
    if total is not None and need > total:
        vocabulary = f" and a vocabulary of {cfg.vocab_size}" if cfg.vocab_size else ""
        raise ConfigError(
            f"{key}: d_model {cfg.d_model}, d_ff {cfg.d_ff}, {cfg.n_layers} layers{vocabulary} make at least {n:,} "
            f"parameters, {need / GiB:,.1f} GiB here, more than the {total / GiB:,.1f} GiB of {device.type} memory; "
            "lower the sizes"
        )


def check_fits(
    cfg: ModelConfig,
    *,
    batch_size: int,
    seg_len: int,
    mem_len: int,
    cmem_len: int,
    device: torch.device,
    key: str = "model.seg_len",
    batch_key: str | None = None,
) -> None:
    """One-line :class:`ConfigError` when the lower bound exceeds the device's memory, naming ``batch_key`` (default:
    ``train.`` or ``eval.batch_size`` beside ``key``) when one row would fit and so the batch is what does not, else
    ``key`` (the lengths)."""
    total = device_memory_bytes(device)
    need = forward_bytes(cfg, batch_size=batch_size, seg_len=seg_len, mem_len=mem_len, cmem_len=cmem_len)
    if total is None or need <= total:
        return
    batch_key = batch_key or ("eval.batch_size" if key.startswith("eval.") else "train.batch_size")
    row = forward_bytes(cfg, batch_size=1, seg_len=seg_len, mem_len=mem_len, cmem_len=cmem_len)
    if batch_size > 1 and row <= total:
        raise ConfigError(
            f"{batch_key}: a batch of {batch_size} x seg_len {seg_len} needs at least {need / GiB:,.1f} GiB for one "
            f"forward pass, more than the {total / GiB:,.1f} GiB of {device.type}; lower {batch_key} (about "
            f"{max(int(total // row), 1):,} rows fit)"
        )
    raise ConfigError(
        f"{key}: batch {batch_size} x seg_len {seg_len} with mem_len {mem_len} and cmem_len {cmem_len} needs at least "
        f"{need / GiB:,.1f} GiB for one forward pass, more than the {total / GiB:,.1f} GiB of {device.type}; lower the lengths or the batch size"
    )
