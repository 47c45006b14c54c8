"""Temporal range and attention cost of a configuration (section 3.3 of the Compressive Transformer paper)."""

from __future__ import annotations

from dataclasses import dataclass

from compressive_transformer.config import ModelConfig


@dataclass(frozen=True)
class TemporalRange:
    max_range: int  # l x (n_m + c * n_cm): how far back the top layer can see, in input positions
    attention_cost: int  # query-key pairs per layer and head for one segment: n_s x (n_s + n_m + n_cm)
    memory_slots: int  # n_m + n_cm per layer

    def __str__(self) -> str:
        return (
            f"max temporal range {self.max_range} positions, attention cost {self.attention_cost} "
            f"query-key pairs per layer and head per segment, {self.memory_slots} memory slots per layer"
        )


def temporal_range(cfg: ModelConfig) -> TemporalRange:
    """l x (n_m + c n_cm) and the per-segment attention cost O(n_s^2 + n_s (n_m + n_cm)).

    A Transformer-XL (n_cm = 0) has l x n_m; with n_m = n_cm = n/2 and c = 3 the Compressive Transformer reaches
    twice as far at the same cost.
    """
    c = cfg.compression_rate if cfg.cmem_len > 0 else 0
    return TemporalRange(
        max_range=cfg.n_layers * (cfg.mem_len + c * cfg.cmem_len),
        attention_cost=cfg.seg_len * (cfg.seg_len + cfg.mem_len + cfg.cmem_len),
        memory_slots=cfg.mem_len + cfg.cmem_len,
    )


def range_report(cfg: ModelConfig) -> str:
    """What ``compressive-transformer range`` prints: the temporal range and attention cost of ``cfg``, and the
    context lengths (Transformer-QL paper, Appendix B) of the three models at the same window and depth."""
    from compressive_transformer.context import context_length, context_length_from_config

    lines = []
    if not cfg.is_ql:
        r = temporal_range(cfg)
        lines += [
            f"max temporal range: {r.max_range} positions "
            f"(l={cfg.n_layers} x (n_m={cfg.mem_len} + c={cfg.compression_rate} x n_cm={cfg.cmem_len}))",
            f"attention cost: {r.attention_cost} query-key pairs per layer and head per segment (n_s={cfg.seg_len})",
            f"memory slots per layer: {r.memory_slots}",
        ]
    n_s, memory = cfg.seg_len, cfg.mem_len + cfg.cmem_len
    rows = [("this config", context_length_from_config(cfg))]
    rows.append((f"Transformer-XL {n_s}/{memory}", context_length(model="transformer-xl", seg_len=n_s, mem_len=memory, n_layers=cfg.n_layers)))
    half, c = memory // 2, max(cfg.compression_rate, 2)
    rows.append(
        (
            f"Compressive Transformer {n_s}/{memory - half}/{half} c={c}",
            context_length(model="compressive", seg_len=n_s, mem_len=memory - half, cmem_len=half, compression_rate=c, n_layers=cfg.n_layers),
        )
    )
    lines.append(f"context length (min / max / average) at window n_s + memory = {n_s + memory}, {cfg.n_layers} layers:")
    lines += [f"  {name:<40} {ctx.min:>8} {ctx.max:>8} {ctx.average:>10g}" for name, ctx in rows]
    return "\n".join(lines)
