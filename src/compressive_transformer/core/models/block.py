"""The one transformer block every model of the family shares: relative attention over memory, then an MLP.

``norm="post"`` is Algorithm 1 (residual, then layer norm; memory stores the block input). ``norm="pre"`` normalises
before each sublayer and memory stores the normalised input, as the authors' code does. ``gating`` replaces the
residual additions with GTrXL's GRU-style gates (pre-norm only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from compressive_transformer.core.attention import (
    AttentionOutput,
    Kernel,
    KeyMask,
    KeyValueStore,
    RelativeAttention,
    Tables,
)
from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.models.io import dropout


class GRUGate(nn.Module):
    """g(x, y) = (1 - z) * x + z * tanh(W_g y + U_g (r * x)); the bias b_g > 0 starts it close to the identity."""

    def __init__(self, d_model: int, gate_bias: float) -> None:
        super().__init__()
        self.w = nn.Linear(d_model, 3 * d_model, bias=False)  # W_r, W_z, W_g applied to the sublayer output y
        self.u = nn.Linear(d_model, 2 * d_model, bias=False)  # U_r, U_z applied to the stream x
        self.u_g = nn.Linear(d_model, d_model, bias=False)
        self.gate_bias = gate_bias

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        wr, wz, wg = self.w(y).chunk(3, dim=-1)
        ur, uz = self.u(x).chunk(2, dim=-1)
        r = torch.sigmoid(wr + ur)
        z = torch.sigmoid(wz + uz - self.gate_bias)
        h = torch.tanh(wg + self.u_g(r * x))
        return (1 - z) * x + z * h


@dataclass
class BlockOutput:
    h: Tensor  # (B, T, d) block output
    attn_in: Tensor  # (B, T, d) the attention input, which memory stores
    attn: AttentionOutput  # weights (explicit path), queries, keys/values of [cmem; mem; segment]


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.pre_norm = cfg.norm == "pre"
        self.attn = RelativeAttention(cfg)
        self.ff = nn.Sequential(nn.Linear(d, cfg.d_ff), nn.ReLU(), dropout(cfg.dropout), nn.Linear(cfg.d_ff, d))
        self.norm1 = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(d, eps=cfg.layer_norm_eps)
        self.drop = dropout(cfg.dropout)
        self.gate1 = GRUGate(d, cfg.gate_bias) if cfg.gating else None
        self.gate2 = GRUGate(d, cfg.gate_bias) if cfg.gating else None

    def forward(
        self, h: Tensor, memory: Sequence[Tensor] | KeyValueStore, tables: Tables, mask: KeyMask, kernel: Kernel
    ) -> BlockOutput:
        """h: (B, T, d); memory, tables, mask, kernel: see :meth:`RelativeAttention.forward`."""
        attn_in = self.attn_input(h)
        attn = self.attn(attn_in, memory, tables, mask, kernel)
        return BlockOutput(h=self.finish(h, attn.y), attn_in=attn_in, attn=attn)

    def attn_input(self, h: Tensor) -> Tensor:
        """What the attention reads (and memory stores): h itself (post-norm) or its layer norm (pre-norm)."""
        return self.norm1(h) if self.pre_norm else h

    def finish(self, h: Tensor, y: Tensor) -> Tensor:
        """The rest of the block after the attention's output y: residuals (or gates), norms and the MLP."""
        a = self.drop(y)
        if self.gate1 is not None:
            a = self.gate1(h, F.relu(a))
            return self.gate2(a, F.relu(self.drop(self.mlp(self.norm2(a)))))
        if self.pre_norm:
            a = h + a
            return a + self.drop(self.mlp(self.norm2(a)))
        a = self.norm1(h + a)
        return self.norm2(a + self.drop(self.mlp(a)))

    def mlp(self, a: Tensor) -> Tensor:
        """``self.ff`` as direct calls on its weights: at batch 1 the four module calls of the Sequential cost about
        as much as its two small matmuls (generation measured 7% faster per token)."""
        fc1, _, drop, fc2 = self.ff
        return F.linear(drop(F.relu(F.linear(a, fc1.weight, fc1.bias))), fc2.weight, fc2.bias)
