"""A deliberately naive reference of Algorithm 1: memories as Python lists of per-position states, one row.

It reuses the model's own blocks and compressors but none of its memory bookkeeping (buffers, masks, fill counts,
right alignment), so agreement with the model pins the memory contract itself.
"""

from __future__ import annotations

import torch

from compressive_transformer.core.attention import key_mask, make_positions, relative_attention
from compressive_transformer.core.models import CompressiveTransformerLM


@torch.no_grad()
def reference_logits(model: CompressiveTransformerLM, tokens: torch.Tensor, seg_sizes: list[int]) -> torch.Tensor:
    """Feed ``tokens`` (1, N) in segments of ``seg_sizes``; return the logits (1, N, V)."""
    cfg = model.cfg
    c, e = cfg.compression.rate, cfg.compression.extra_width
    mems: list[list[torch.Tensor]] = [[] for _ in range(cfg.n_layers)]
    cmems: list[list[torch.Tensor]] = [[] for _ in range(cfg.n_layers)]
    evicted: list[list[torch.Tensor]] = [[] for _ in range(cfg.n_layers)]  # every state that left memory, in order
    outputs, pos = [], 0
    for T in seg_sizes:
        seg = tokens[:, pos : pos + T]
        pos += T
        h = model.input(seg)
        positions = make_positions(
            seg_len=T,
            mem_capacity=len(mems[0]),
            cmem_len=len(cmems[0]),
            cmem_offset=len(mems[0]) if cfg.positions.cmem == "shared" else 0,
            d_model=cfg.d_model,
            clamp_len=cfg.positions.clamp_len,
            device=h.device,
            dtype=h.dtype,
        )
        for i, block in enumerate(model.blocks):
            mem = torch.stack(mems[i], 0)[None] if mems[i] else h.new_zeros(1, 0, cfg.d_model)
            cmem = torch.stack(cmems[i], 0)[None] if cmems[i] else h.new_zeros(1, 0, cfg.d_model)
            ones = lambda t: torch.ones(t.shape[:2], dtype=torch.bool)  # noqa: E731
            window = cfg.memory.mem_len if cfg.positions.same_length else 0
            mask = key_mask(ones(h), ones(mem), ones(cmem), window=window)
            result = block(h, [cmem, mem], block.attn.tables(positions), mask, relative_attention)
            out, attn_in = result.h, result.attn_in
            fifo = mems[i] + list(attn_in[0])
            if cfg.memory.cmem_len > 0:
                while len(fifo) - cfg.memory.mem_len >= c:  # a whole group of c has left memory: compress it
                    h_ctx = model.compressors[i].context  # the dilated stack reads the evicted stream before the group
                    before = ([h.new_zeros(cfg.d_model)] * h_ctx + evicted[i])[len(evicted[i]) :]
                    window = torch.stack(before + fifo[: c + e], 0)[None, None]  # (1, 1, h + c + e, d)
                    cmems[i].append(model.compressors[i](window, None)[0, 0])
                    evicted[i] += fifo[:c]
                    fifo = fifo[c:]
                cmems[i] = cmems[i][-cfg.memory.cmem_len :]
            else:
                fifo = fifo[max(len(fifo) - cfg.memory.mem_len, 0) :] if cfg.memory.mem_len else []
            mems[i] = fifo
            h = out
        outputs.append(model.output(h, None)[1])
    return torch.cat(outputs, dim=1)
