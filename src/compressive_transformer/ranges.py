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
