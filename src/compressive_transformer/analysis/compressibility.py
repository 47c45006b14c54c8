"""Compressibility of layers (the paper's Figure 2): the compression loss per layer, over training (from a run's
``metrics.jsonl``) and on a held-out stream (streamed now, memory carried).

A layer only counts on segments where it actually compressed something (its memory evicted a group of c), so an
empty compressed memory at the start of a stream does not pull its average towards zero.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from compressive_transformer.analysis.streaming import stream_batches
from compressive_transformer.core.registry import compression_loss_spec
from compressive_transformer.core.streaming import stream as stream_segments


def compressibility_over_training(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-layer compression loss against step, from metrics records (``aux_losses``: one value per layer)."""
    rows = [r for r in records if isinstance(r.get("aux_losses"), list) and "step" in r]
    n_layers = max((len(r["aux_losses"]) for r in rows), default=0)
    steps = [int(r["step"]) for r in rows]
    per_layer = [
        [float(r["aux_losses"][i]) if i < len(r["aux_losses"]) else math.nan for r in rows] for i in range(n_layers)
    ]
    return {"steps": steps, "per_layer": per_layer}


@torch.no_grad()
def held_out_compressibility(
    model: torch.nn.Module,
    stream: Any,
    *,
    batch_size: int = 4,
    seg_len: int | None = None,
    max_segments: int = 50,
) -> dict[str, Any]:
    """Mean compression loss per layer over the segments of ``stream`` in which that layer compressed.

    The value is the model's own auxiliary loss (attention reconstruction or auto-encoding, per its config); for
    compressors trained without a local loss (pooling, most-used, BPTT) there is none to report and ``per_layer``
    holds ``None``.
    """
    cfg = model.cfg
    if not cfg.uses_compression:
        return {"per_layer": [], "segments": [], "loss": cfg.compression.loss, "applicable": False}
    applicable = compression_loss_spec(cfg.compression.loss).local
    seg_len = seg_len or cfg.seg_len
    sums = [0.0] * cfg.n_layers
    counts = [0] * cfg.n_layers
    batches = stream_batches(stream, batch_size=batch_size, seg_len=seg_len, max_segments=max_segments)
    # the model skips its auxiliary losses when no gradient is wanted unless asked for them
    for step in stream_segments(model, batches, batch_size=batch_size, compression_loss=applicable):
        T = step.batch.tokens.shape[1]
        for i, (old, new) in enumerate(zip(step.memory.layers, step.out.memory.layers)):
            if old.fill + T - new.fill > 0:  # this layer evicted (and compressed) a group this segment
                sums[i] += float(step.out.aux_losses[i])
                counts[i] += 1
    per_layer = [s / c if c and applicable else None for s, c in zip(sums, counts)]
    return {"per_layer": per_layer, "segments": counts, "loss": cfg.compression.loss, "applicable": applicable}


__all__ = ["compressibility_over_training", "held_out_compressibility"]
