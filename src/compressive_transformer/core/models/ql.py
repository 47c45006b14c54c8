"""Transformer-QL: Transformer-XL layers at several temporal scales, pooling between scales, a
causal accumulation of every scale's output, and output layers.

Per scale i (0 = finest) a state summarises c**i tokens. The window n_w = n_s + n_m is the same at every scale: scale
i > 0 takes its segment (``seg`` states) from the pooled window ``concat(memory, segment)`` of the scale below and
keeps ``n_w - seg`` states of memory; each step shifts ``n_s / c**i`` states (the part of the window the next step
no longer covers) into memory. The accumulation layer averages, for each fine position p, the newest state of each
scale that ends at or before p, so no output reads a coarse state that summarises a future token.

Memory layout (``MemoryState.layers``): one entry per Transformer-XL layer (scales first, then output layers), then
one per scale holding that scale's recent outputs (read by the pooling and the accumulation), then the embedded
inputs of a segment that is not complete yet (so generation can go one token at a time).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from compressive_transformer.core.attention import make_positions, share_positions
from compressive_transformer.core.config import ModelConfig, require
from compressive_transformer.core.dtypes import compute_dtype
from compressive_transformer.core.kernels import plan
from compressive_transformer.core.memory import LayerMemory, MemoryState, empty_layer, update_layer
from compressive_transformer.core.models.block import Block
from compressive_transformer.core.models.checks import check_batch_size, check_inputs, check_memory
from compressive_transformer.core.models.io import InputLayer, OutputLayer, dropout, init_weights
from compressive_transformer.core.models.lm import LMOutput
from compressive_transformer.core.models.weight_watch import DeclaresWrites
from compressive_transformer.core.registry import COMPRESSION_LOSSES, COMPRESSORS, compressor_spec


@dataclass(frozen=True)
class Scale:
    seg: int  # states per segment
    mem: int  # memory states
    shift: int  # states shifted into memory per step (n_s / c**i)
    span: int  # tokens summarised by one state (c**i)


def ql_scales(*, seg_len: int, mem_len: int, compression_rate: int, n_scales: int) -> list[Scale]:
    """The segment/memory/shift geometry of every scale (section 2.3: n_s^{i+1} = min(n_w / c, n_s^i))."""
    c, window = compression_rate, seg_len + mem_len
    scales = [Scale(seg=seg_len, mem=mem_len, shift=seg_len, span=1)]
    for i in range(1, n_scales):
        seg = min(window // c, scales[-1].seg)
        scales.append(Scale(seg=seg, mem=window - seg, shift=seg_len // c**i, span=c**i))
    return scales


def label(cfg: ModelConfig) -> str:
    return "Transformer-QL"


def check_config(cfg: ModelConfig) -> None:
    """Transformer-QL's rules for a config, beyond the common ones (run by ``ModelConfig`` through the kinds table)."""
    p, c = "model.", cfg.compression.rate
    ql = cfg.ql
    require(
        len(ql.scales) > 0 and all(isinstance(n, int) and n >= 1 for n in ql.scales),
        p + "ql.scales",
        "give the Transformer-XL layers of each scale, finest first, each >= 1 (e.g. [2, 2])",
    )
    require(ql.output_layers >= 0, p + "ql.output_layers", "must be >= 0")
    total = sum(cfg.ql.scales) + cfg.ql.output_layers
    require(
        cfg.n_layers == total,
        p + "n_layers",
        f"Transformer-QL has sum(ql.scales) + ql.output_layers = {total} layers; set n_layers = {total}",
    )
    require(
        cfg.memory.cmem_len == 0,
        p + "memory.cmem_len",
        "Transformer-QL compresses between scales, not into a compressed memory; set cmem_len = 0",
    )
    pools = [name for name, spec in COMPRESSORS.items() if spec.scale_pool is not None]
    require(
        COMPRESSORS[cfg.compression.function].scale_pool is not None,
        p + "compression.function",
        f"Transformer-QL pools between scales; use {' or '.join(repr(n) for n in pools)} (with compression.loss = 'none')",
    )
    require(
        not COMPRESSION_LOSSES[cfg.compression.loss].trains,
        p + "compression.loss",
        "Transformer-QL's pooling has nothing to train; set 'none'",
    )
    require(
        cfg.compression.extra_width == 0,
        p + "compression.extra_width",
        "Transformer-QL pools with window c; set 0",
    )
    levels = len(cfg.ql.scales) - 1
    require(
        cfg.seg_len % (c**levels) == 0,
        p + "seg_len",
        f"must be divisible by compression.rate ** (len(ql.scales) - 1) = {c**levels} so every scale shifts whole states",
    )
    require(
        (cfg.seg_len + cfg.memory.mem_len) % c == 0,
        p + "memory.mem_len",
        f"seg_len + mem_len = {cfg.seg_len + cfg.memory.mem_len} must be divisible by compression.rate = {c}",
    )
    require(0.0 <= ql.droppath < 1.0, p + "ql.droppath", "must be in [0, 1)")


class TransformerQL(DeclaresWrites, nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if not cfg.is_ql:
            raise ValueError("TransformerQL needs [model.ql] (its scales: Transformer-XL layers per scale)")
        self.cfg = cfg
        self.input = InputLayer(cfg)
        self.drop = dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        share_positions([b.attn for b in self.blocks], cfg.positions.share)
        self.output = OutputLayer(cfg, self.input)
        self.apply(lambda m: init_weights(m, cfg.init_std))

    @property
    def n_scales(self) -> int:
        return len(self.cfg.ql.scales)

    def parameters_of(self, group: str) -> list[nn.Parameter]:
        """Pooling has no parameters: everything is ``"model"``; ``"compressor"`` is empty."""
        if group == "compressor":
            return []
        if group == "model":
            return list(self.parameters())
        raise ValueError(f"unknown parameter group {group!r}; use 'model' or 'compressor'")

    def geometry(self, mem_len: int | None = None, seg_len: int | None = None) -> list[Scale]:
        cfg = self.cfg
        return ql_scales(
            seg_len=cfg.seg_len if seg_len is None else seg_len,
            mem_len=cfg.memory.mem_len if mem_len is None else mem_len,
            compression_rate=cfg.compression.rate,
            n_scales=self.n_scales,
        )

    def init_memory(
        self,
        batch_size: int,
        *,
        mem_len: int | None = None,
        cmem_len: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> MemoryState:
        check_batch_size(batch_size)
        cfg = self.cfg
        if cmem_len:
            raise ValueError("Transformer-QL has no compressed memory; leave cmem_len unset or 0")
        mem_len = cfg.memory.mem_len if mem_len is None else mem_len
        if mem_len < 0 or (cfg.seg_len + mem_len) % cfg.compression.rate:
            raise ValueError(f"mem_len={mem_len}: seg_len + mem_len must be divisible by {cfg.compression.rate}")
        param = next(self.parameters())
        kw = dict(device=param.device if device is None else device, dtype=param.dtype if dtype is None else dtype)

        def layer(n: int) -> LayerMemory:
            return empty_layer(
                batch_size,
                cfg.d_model,
                mem_len=n,
                cmem_len=0,
                compression_rate=1,
                window=1,
                track_usage=False,
                keep_windows=False,
                **kw,
            )

        scales = self.geometry(mem_len)
        blocks = [layer(s.mem) for s, n in zip(scales, cfg.ql.scales) for _ in range(n)]
        blocks += [layer(mem_len) for _ in range(cfg.ql.output_layers)]
        outputs = [layer(s.mem) for s in scales]
        return MemoryState(tuple(blocks + outputs + [layer(cfg.seg_len)]))

    # ---------------------------------------------------------------------------------------------------------

    def forward(
        self,
        inputs: Tensor,
        memory: MemoryState | None = None,
        targets: Tensor | None = None,
        *,
        input_mask: Tensor | None = None,
        need_weights: bool = False,
        compression_loss: bool | None = None,
    ) -> LMOutput:
        """Any T: whole segments of ``seg_len`` advance the memories; a trailing partial segment is answered from
        a padded segment and its inputs are kept until the segment is complete. Pooling between scales has no
        auxiliary loss, so ``compression_loss`` changes nothing here (it exists so both models take one call)."""
        cfg = self.cfg
        check_inputs(cfg, inputs, targets, input_mask)
        B, T = inputs.shape[:2]
        memory = self.init_memory(B, device=inputs.device) if memory is None else memory
        param = next(self.parameters())
        check_memory(
            cfg,
            memory,
            batch_size=B,
            n_layers=cfg.n_layers + self.n_scales + 1,
            dtype=param.dtype,
            device=param.device,
            compressive=False,
        )
        mask = torch.ones(B, T, dtype=torch.bool, device=inputs.device) if input_mask is None else input_mask.bool()
        pending = memory.layers[-1]
        S, P = pending.capacity, pending.fill
        x = torch.cat([pending.mem[:, S - P :], self.input(inputs)], dim=1)  # (B, P + T, d)
        x_mask = torch.cat([pending.mem_mask[:, S - P :], mask], dim=1)
        scales = self.geometry(memory.layers[cfg.n_layers].mem_len, S)
        states, outs, attentions = list(memory.layers[:-1]), [], None
        n_full = (P + T) // S
        for k in range(n_full):
            h, states, attentions = self._segment(
                x[:, k * S : (k + 1) * S], x_mask[:, k * S : (k + 1) * S], states, scales, need_weights
            )
            outs.append(h)
        rest = P + T - n_full * S
        if rest:  # answer the partial segment from a padded one, without advancing any memory
            pad = x.new_zeros(B, S - rest, x.shape[-1])
            seg = torch.cat([x[:, n_full * S :], pad], dim=1)
            seg_mask = torch.cat([x_mask[:, n_full * S :], pad.new_zeros(B, S - rest, dtype=torch.bool)], dim=1)
            h, _, attentions = self._segment(seg, seg_mask, states, scales, need_weights)
            outs.append(h[:, :rest])
        keep = torch.arange(S, device=x.device) >= S - rest
        # Pending inputs are held detached, like every memory: the call that completes their segment trains on them
        # without reaching back into this call's graph.
        tail = torch.cat([x.new_zeros(B, S, x.shape[-1]), x[:, n_full * S :].detach()], dim=1)[:, -S:]
        tail_mask = torch.cat([x_mask.new_zeros(B, S), x_mask[:, n_full * S :]], dim=1)[:, -S:] & keep
        new_pending = replace(
            pending, mem=tail.masked_fill(~tail_mask.unsqueeze(-1), 0.0), mem_mask=tail_mask, fill=rest
        )

        hidden, logits, loss = self.output(torch.cat(outs, dim=1)[:, P:], targets)
        zeros = hidden.new_zeros(cfg.n_layers)
        return LMOutput(
            logits=logits,
            loss=loss,
            aux_loss=zeros.sum(),
            aux_losses=zeros,
            memory=MemoryState(tuple(states) + (new_pending,)),
            hidden=hidden,
            attentions=attentions if need_weights else None,
        )

    def _segment(
        self, h: Tensor, mask: Tensor, states: list[LayerMemory], scales: list[Scale], need_weights: bool
    ) -> tuple[Tensor, list[LayerMemory], list[Tensor]]:
        """One full segment (B, n_s, d) through every scale, the accumulation and the output layers."""
        cfg, c = self.cfg, self.cfg.compression.rate
        pool = compressor_spec(cfg.compression.function).scale_pool  # config validation made sure there is one
        new = list(states)
        attentions: list[Tensor] = []
        windows: list[tuple[Tensor, Tensor]] = []  # per scale: its outputs [memory; segment] and their validity
        x, x_mask, layer = self.drop(h), mask, 0
        for i, (scale, n_blocks) in enumerate(zip(scales, cfg.ql.scales)):
            if i > 0:  # pool the window of the scale below in groups of c; keep the newest `seg` states
                below, below_mask = windows[-1]
                B, W, d = below.shape
                pooled = below.view(B, W // c, c, d)
                pooled = pool(pooled)
                x, x_mask = pooled[:, -scale.seg :], below_mask.view(B, W // c, c).all(-1)[:, -scale.seg :]
            x = self._blocks(range(layer, layer + n_blocks), x, x_mask, new, scale.shift, attentions, need_weights)
            layer += n_blocks
            out_state = states[cfg.n_layers + i]
            windows.append((torch.cat([out_state.mem, x], dim=1), torch.cat([out_state.mem_mask, x_mask], dim=1)))
            new[cfg.n_layers + i], _ = update_layer(
                out_state,
                x[:, : scale.shift],
                x_mask[:, : scale.shift],
                compression_rate=1,
                extra_width=0,
                compress=None,
            )
        x = self._accumulate(windows, scales, mask)
        x = self._blocks(range(layer, cfg.n_layers), x, mask, new, scales[0].shift, attentions, need_weights)
        return x, new, attentions

    def _blocks(
        self,
        layers: range,
        x: Tensor,
        x_mask: Tensor,
        states: list[LayerMemory],
        shift: int,
        attentions: list[Tensor],
        need_weights: bool,
    ) -> Tensor:
        """Transformer-XL layers of one scale; each shifts the first ``shift`` states of its input into memory."""
        if len(layers) == 0:
            return x
        first = states[layers[0]]
        positions = make_positions(
            seg_len=x.shape[1],
            mem_capacity=first.capacity,
            cmem_len=0,
            cmem_offset=0,
            d_model=self.cfg.d_model,
            clamp_len=self.cfg.positions.clamp_len,
            device=x.device,
            dtype=compute_dtype(x.device, x.dtype),
        )
        window = first.mem_len if self.cfg.positions.same_length else 0
        kernel, mask = plan(
            self.cfg, x_mask, first, window=window, h=x, need_weights=need_weights, training=self.training
        )
        for li in layers:
            state, attn = states[li], self.blocks[li].attn
            out = self.blocks[li](x, [state.cmem, state.mem], attn.tables(positions), mask, kernel)
            states[li], _ = update_layer(
                state, out.attn_in[:, :shift], x_mask[:, :shift], compression_rate=1, extra_width=0, compress=None
            )
            if need_weights:
                attentions.append(out.attn.weights)
            x = out.h
        return x

    def _accumulate(self, windows: list[tuple[Tensor, Tensor]], scales: list[Scale], mask: Tensor) -> Tensor:
        """Average, per fine position p, the newest state of each scale that ends at or before p (droppath in
        training: with probability p a row keeps only the scales from j on, j uniform over 2..l)."""
        B, S = mask.shape
        p = torch.arange(S, device=mask.device)
        picked, valid = [], []
        for (seq, seq_mask), scale in zip(windows, scales):
            back = torch.div(S - 1 - p + scale.span - 1, scale.span, rounding_mode="floor")  # states before the newest
            idx = seq.shape[1] - 1 - back  # (S,) index into [memory; segment]
            picked.append(seq[:, idx])  # (B, S, d)
            valid.append(seq_mask[:, idx])  # (B, S)
        states = torch.stack(picked, dim=2)  # (B, S, n_scales, d)
        weight = torch.stack(valid, dim=2).to(states.dtype)  # (B, S, n_scales)
        if self.training and self.cfg.ql.droppath > 0 and len(scales) > 1:
            u = torch.rand(B, device=mask.device)
            first_kept = torch.where(
                u < self.cfg.ql.droppath,
                (u * (len(scales) - 1) / self.cfg.ql.droppath).floor().long() + 1,
                torch.zeros_like(u, dtype=torch.long),
            )  # (B,)
            kept = (torch.arange(len(scales), device=mask.device)[None, :] >= first_kept[:, None]).to(states.dtype)
            dropped = weight * kept[:, None, :]
            weight = torch.where(dropped.sum(-1, keepdim=True) > 0, dropped, weight)  # never leave a position empty
        weight = weight / weight.sum(-1, keepdim=True).clamp(min=1)
        return (states * weight.unsqueeze(-1)).sum(dim=2)
