"""Temporal range, theoretical next to empirical: how far back a change of one input token still changes the output.

The theoretical maximum is ``l x (n_m + c n_cm)`` (section 3.3), counted from the first query of a segment; the
probed output here is the last position of its segment, which sees ``n_s - 1`` tokens further, so both numbers are
reported. The empirical range uses perturbation rather than gradients, because memories are detached between
segments: the stream is fed segment by segment with memory carried, once as is and once per distance ``d`` with the
token ``d`` positions before the probe replaced, and the effect is the largest absolute change of the probe's log
probabilities. The analysis runs in float64 so that "no effect" is exactly zero, not float noise.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from compressive_transformer.core.context import temporal_range
from compressive_transformer.core.streaming import segments, stream


def default_distances(length: int, reach: int, seg_len: int, *, points: int = 24) -> list[int]:
    """About ``points`` distances spread over [1, length - 1], plus 16 steps across a segment either side of
    ``reach`` (every distance there when the segment is short); each distance costs one streamed row."""
    spread = np.unique(np.linspace(1, length - 1, num=min(points, length - 1)).round().astype(int))
    step = max(1, seg_len // 8)
    near = range(max(1, reach - seg_len), min(length - 1, reach + seg_len) + 1, step)
    return sorted(set(spread.tolist()) | set(near))


@torch.no_grad()
def _probe(model: torch.nn.Module, rows: torch.Tensor, seg_len: int) -> torch.Tensor:
    """Log-probabilities at the last position of each row, streaming (B, N) in segments from an empty memory."""
    out = None
    for step in stream(model, segments(rows, seg_len), batch_size=rows.shape[0], device=rows.device):
        out = step.out
    return F.log_softmax(out.logits[:, -1], dim=-1)


@torch.no_grad()
def empirical_temporal_range(
    model: torch.nn.Module,
    tokens: Sequence[int] | np.ndarray | torch.Tensor | None = None,
    *,
    length: int | None = None,
    distances: Sequence[int] | None = None,
    seg_len: int | None = None,
    tolerance: float = 1e-9,
    batch_size: int = 32,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> dict[str, Any]:
    """Effect on the final output of perturbing the input ``d`` tokens back, for each ``d``; the farthest ``d`` with
    an effect above ``tolerance`` is the empirical range, reported next to :func:`temporal_range`'s maximum.

    ``tokens``: the stream (default: ``length`` random tokens, ``length`` defaulting to the theoretical range plus
    two segments, rounded up to whole segments so the probe is the last position of a segment).
    """
    cfg = model.cfg
    if cfg.vocab_size < 2 or cfg.input_dim:
        raise ValueError("the perturbation analysis needs a token model with at least two token ids")
    seg_len = seg_len or cfg.seg_len
    theory = temporal_range(cfg).max_range
    gen = np.random.default_rng(seed)
    if tokens is None:
        length = length or seg_len * math.ceil((theory + 2 * seg_len) / seg_len)
        base = gen.integers(0, cfg.vocab_size, size=length)
    else:
        base = np.asarray(tokens.cpu().numpy() if isinstance(tokens, torch.Tensor) else tokens, dtype=np.int64)
        length = len(base)
    if length < 2:
        raise ValueError("the stream needs at least two tokens")
    offset = (length - 1) % seg_len  # the probe's position within its segment
    reach = theory + offset
    ds = sorted({int(d) for d in (distances if distances is not None else default_distances(length, reach, seg_len))})
    if not ds or ds[0] < 1 or ds[-1] > length - 1:
        raise ValueError(f"distances must lie in [1, {length - 1}]")

    was_training = model.training
    probe_model = copy.deepcopy(model).to(dtype).eval()
    device = next(probe_model.parameters()).device
    base_t = torch.as_tensor(base, dtype=torch.long, device=device)
    reference = _probe(probe_model, base_t[None], seg_len)[0]
    effects: list[float] = []
    for start in range(0, len(ds), batch_size):
        chunk = ds[start : start + batch_size]
        rows = base_t.repeat(len(chunk), 1)
        for r, d in enumerate(chunk):
            p = length - 1 - d
            rows[r, p] = (
                rows[r, p] + 1 + int(gen.integers(0, cfg.vocab_size - 1))
            ) % cfg.vocab_size  # always another id
        logp = _probe(probe_model, rows, seg_len)
        effects.extend((logp - reference).abs().amax(dim=-1).tolist())
    model.train(was_training)
    beyond = [d for d, e in zip(ds, effects) if e > tolerance]
    return {
        "distances": ds,
        "effects": effects,
        "tolerance": tolerance,
        "empirical_range": max(beyond) if beyond else 0,
        "theoretical_max_range": theory,
        "theoretical_reach": reach,
        "probe_offset_in_segment": offset,
        "length": length,
        "seg_len": seg_len,
        "mem_len": cfg.memory.mem_len,
        "cmem_len": cfg.memory.cmem_len,
        "compression_rate": cfg.compression.rate,
        "n_layers": cfg.n_layers,
    }


__all__ = ["default_distances", "empirical_temporal_range"]
