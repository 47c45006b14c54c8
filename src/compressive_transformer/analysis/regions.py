"""Attention by memory region (the paper's Figure 3): where, between compressed memory, memory and the current
segment, a trained model puts its attention, in buckets ordered oldest -> newest.

Keys of a layer are ordered ``[compressed memory (C); memory (M); segment (T)]``, each oldest first. Each region is
cut into ``buckets`` contiguous runs of slots (the authors use 6 per region, 18 in all); a bucket's value is the
average attention weight one (head, query, key) pair carries, over the pairs where the key could be read: a valid
slot of the *input* memory (partially filled memories leave their old slots out) or, in the segment, a key at or
before the query. A bucket that never held a readable key is NaN (``None`` in JSON).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from compressive_transformer.analysis.streaming import stream_batches
from compressive_transformer.core.streaming import stream as stream_segments

REGIONS = ("compressed", "memory", "segment")


def bucket_edges(n_slots: int, buckets: int) -> list[tuple[int, int]]:
    """``buckets`` contiguous [start, end) runs covering ``n_slots`` (sizes differ by at most one, as np.array_split);
    with fewer slots than buckets the trailing runs are empty."""
    if n_slots == 0:
        return []
    sizes = [n_slots // buckets + (1 if i < n_slots % buckets else 0) for i in range(buckets)]
    edges, start = [], 0
    for s in sizes:
        edges.append((start, start + s))
        start += s
    return edges


def readable_keys(cmem_mask: Tensor, mem_mask: Tensor, query_mask: Tensor) -> Tensor:
    """(B, T, C+M+T) bool: valid compressed / memory slots, and segment keys at or before the query (and real)."""
    B, T = query_mask.shape
    causal = torch.ones(T, T, dtype=torch.bool, device=query_mask.device).tril()  # key j <= query i
    seg = causal[None] & query_mask[:, None, :]  # (B, T, T)
    mem = torch.cat([cmem_mask, mem_mask], dim=1)[:, None, :].expand(B, T, -1)
    return torch.cat([mem, seg], dim=-1) & query_mask[:, :, None]


@dataclass
class RegionAccumulator:
    """Running sums of attention weight and of readable (head, query, key) pairs, per layer and key slot."""

    buckets: int = 6
    sums: list[Tensor] = field(default_factory=list)  # per layer (K,) float64
    counts: list[Tensor] = field(default_factory=list)  # per layer (K,) float64
    sizes: tuple[int, int, int] | None = None  # (C, M, T)

    def add(self, weights: list[Tensor], cmem_mask: Tensor, mem_mask: Tensor, query_mask: Tensor) -> None:
        """weights: per layer (B, H, T, C+M+T); masks of the input memory (B, C), (B, M) and the queries (B, T)."""
        C, M, T = cmem_mask.shape[1], mem_mask.shape[1], query_mask.shape[1]
        if self.sizes is None:
            self.sizes = (C, M, T)
            self.sums = [torch.zeros(C + M + T, dtype=torch.float64) for _ in weights]
            self.counts = [torch.zeros(C + M + T, dtype=torch.float64) for _ in weights]
        elif self.sizes != (C, M, T):
            raise ValueError(
                f"attention shapes changed from {self.sizes} to {(C, M, T)}; use one segment and memory length"
            )
        readable = readable_keys(cmem_mask, mem_mask, query_mask).to(torch.float64)  # (B, T, K)
        for i, w in enumerate(weights):
            H = w.shape[1]
            w = w.detach().to(torch.float64).cpu()
            self.sums[i] += (w * readable[:, None].cpu()).sum(dim=(0, 1, 2))
            self.counts[i] += readable.sum(dim=(0, 1)).cpu() * H

    def result(self) -> dict[str, Any]:
        """JSON-ready: per region its slot count and buckets; per layer and averaged, the bucket means."""
        if self.sizes is None:
            raise ValueError("no attention was accumulated")
        C, M, T = self.sizes
        spans = {"compressed": (0, C), "memory": (C, C + M), "segment": (C + M, C + M + T)}
        regions = [
            {"name": n, "slots": b - a, "buckets": len(bucket_edges(b - a, self.buckets))}
            for n, (a, b) in spans.items()
        ]

        def layer_buckets(s: Tensor, c: Tensor) -> dict[str, list[float | None]]:
            out: dict[str, list[float | None]] = {}
            for name, (a, b) in spans.items():
                vals = []
                for lo, hi in bucket_edges(b - a, self.buckets):
                    n = float(c[a + lo : a + hi].sum())
                    vals.append(float(s[a + lo : a + hi].sum()) / n if n > 0 else math.nan)
                out[name] = vals
            return out

        layers = [layer_buckets(s, c) for s, c in zip(self.sums, self.counts)]
        average = layer_buckets(sum(self.sums), sum(self.counts))
        region_share = []
        for s in self.sums:  # total weight each region receives, as a fraction (sums to 1 per layer)
            total = float(s.sum())
            region_share.append(
                {n: float(s[a:b].sum()) / total if total > 0 else math.nan for n, (a, b) in spans.items()}
            )
        return {
            "buckets_per_region": self.buckets,
            "regions": regions,
            "layers": [_nan_to_none(layer) for layer in layers],
            "average": _nan_to_none(average),
            "region_share": region_share,
            "pairs_counted": [float(c.sum()) for c in self.counts],
        }


def _nan_to_none(d: dict[str, list[float]]) -> dict[str, list[float | None]]:
    return {k: [None if (isinstance(x, float) and math.isnan(x)) else x for x in v] for k, v in d.items()}


def bucket_attention(
    weights: list[Tensor], cmem_mask: Tensor, mem_mask: Tensor, query_mask: Tensor | None = None, *, buckets: int = 6
) -> dict[str, Any]:
    """Bucket one forward's attention weights (see :class:`RegionAccumulator`)."""
    if query_mask is None:
        query_mask = torch.ones(weights[0].shape[0], weights[0].shape[2], dtype=torch.bool)
    acc = RegionAccumulator(buckets)
    acc.add(weights, cmem_mask.cpu(), mem_mask.cpu(), query_mask.cpu())
    return acc.result()


@torch.no_grad()
def attention_by_region(
    model: torch.nn.Module,
    stream: Any,
    *,
    batch_size: int = 4,
    seg_len: int | None = None,
    mem_len: int | None = None,
    cmem_len: int | None = None,
    max_segments: int = 50,
    warmup_segments: int | None = None,
    buckets: int = 6,
) -> dict[str, Any]:
    """Stream ``stream`` through ``model`` with memory carried and average its attention by region and bucket.

    The first ``warmup_segments`` batches (default: enough to fill memory and compressed memory) only fill memory,
    so the averages describe a model with full memories, as in the paper; partially filled rows still count only
    their valid slots.
    """
    cfg = model.cfg
    seg_len = seg_len or cfg.seg_len
    first = model.init_memory(1, mem_len=mem_len, cmem_len=cmem_len).layers[0]  # the lengths this stream reads
    if warmup_segments is None:
        warmup_segments = math.ceil((first.mem_len + cfg.compression.rate * first.cmem_len) / seg_len)
    acc = RegionAccumulator(buckets)
    batches = stream_batches(
        stream, batch_size=batch_size, seg_len=seg_len, max_segments=max_segments + warmup_segments
    )
    i = -1
    for i, step in enumerate(
        stream_segments(model, batches, batch_size=batch_size, mem_len=mem_len, cmem_len=cmem_len, need_weights=True)
    ):
        if i >= warmup_segments:
            layer0 = step.memory.layers[0]
            acc.add(step.out.attentions, layer0.cmem_mask.cpu(), layer0.mem_mask.cpu(), step.batch.input_mask.cpu())
    if acc.sizes is None:
        raise ValueError(
            f"the stream has no segment after the {warmup_segments} warm-up segments; give a longer stream or fewer warm-up segments"
        )
    result = acc.result()
    result["segments"] = max(0, i + 1 - warmup_segments)
    result["warmup_segments"] = warmup_segments
    return result


def bucket_table(result: dict[str, Any]) -> str:
    """Markdown: one row per layer and the average, one column per bucket (c1..c6 m1..m6 s1..s6)."""
    regions = [r for r in result["regions"] if r["buckets"] > 0]
    cols = [f"{r['name'][0]}{b + 1}" for r in regions for b in range(r["buckets"])]
    lines = ["| layer | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]

    def row(name: str, d: dict[str, list[float | None]]) -> str:
        vals = [d[r["name"]][b] for r in regions for b in range(r["buckets"])]
        return f"| {name} | " + " | ".join("-" if v is None else f"{v:.4f}" for v in vals) + " |"

    lines += [row(str(i), layer) for i, layer in enumerate(result["layers"])] + [row("mean", result["average"])]
    return "\n".join(lines)


__all__ = [
    "REGIONS",
    "RegionAccumulator",
    "attention_by_region",
    "bucket_attention",
    "bucket_edges",
    "bucket_table",
    "readable_keys",
]
