"""The ``sdpa-bias`` kernel: ``F.scaled_dot_product_attention`` with the positional scores and the mask as its float
bias, so PyTorch's fused attention does the content scores, the softmax and the values. It computes the reference's
function without returning the attention weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from compressive_transformer.core.attention import AttentionInputs, rel_shift


def positional_bias(a: AttentionInputs) -> Tensor:
    """(B, H, T, K): the positional scores of the reference plus the additive mask."""
    K, C = a.k.shape[2], a.mask.n_cmem
    position = rel_shift(a.qv @ a.r.transpose(-1, -2), K - C)
    if C > 0:
        position = torch.cat([rel_shift(a.qc @ a.rc.transpose(-1, -2), C), position], dim=-1)
    return position + a.mask.dense


def sdpa_bias_attention(a: AttentionInputs) -> tuple[Tensor, None]:
    """SDPA does the content scores, the softmax and the values; the bias carries everything relative."""
    dt = a.qu.dtype
    bias = positional_bias(a).to(dt)
    y = F.scaled_dot_product_attention(a.qu, a.k, a.v, attn_mask=bias, dropout_p=a.dropout, scale=1.0)
    return y, None
