"""CompressiveTransformerLM: embedding, a stack of shared blocks with per-layer memories, and the LM head.

``cmem_len = 0`` is Transformer-XL and ``mem_len = cmem_len = 0`` a plain causal transformer. The model is free of
side effects: memory comes in as a :class:`MemoryState` and the next one goes out with the output.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch
from torch import Tensor, nn

from compressive_transformer.core.attention import (
    Kernel,
    KeyMask,
    KeyValueStore,
    Positions,
    Tables,
    make_positions,
    share_positions,
)
from compressive_transformer.core.compression import ConvDecoder, EvictionLoss, build_compressor
from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.dtypes import compute_dtype
from compressive_transformer.core.kernels import plan
from compressive_transformer.core.memory import (
    Eviction,
    LayerMemory,
    MemoryState,
    compressed_for_attention,
    empty_layer,
    plan_update,
    update_layer,
)
from compressive_transformer.core.models.block import Block, BlockOutput
from compressive_transformer.core.models.checks import check_batch_size, check_inputs, check_memory
from compressive_transformer.core.models.io import InputLayer, OutputLayer, dropout, init_weights
from compressive_transformer.core.models.weight_watch import DeclaresWrites
from compressive_transformer.core.registry import compression_loss_spec, compressor_spec


@dataclass
class LMOutput:
    logits: Tensor | None  # (B, T, vocab); None for a hidden-states-only continuous model
    loss: Tensor | None  # mean cross-entropy over targets != -100
    aux_loss: Tensor  # mean over layers of the compression loss; its gradient reaches only the compressor
    aux_losses: Tensor  # (n_layers,) detached per-layer compression loss (0 where nothing was compressed)
    memory: MemoryState
    hidden: Tensor  # (B, T, d_model) final hidden states
    attentions: list[Tensor] | None = None  # per layer (B, H, T, C + M + T) over [cmem; mem; segment]


class DecodingState(Protocol):
    """A decoder's state for one token (:class:`~compressive_transformer.core.models.decode.Rings`): the kernel and
    the mask over its keys, and per layer the store of keys and values the attention writes the token's into, the
    positional terms, and the push of the layer's attention input into its memory."""

    kernel: Kernel
    mask: KeyMask

    def layer(self, i: int) -> tuple[KeyValueStore, Tables]:
        """Layer ``i``'s keys and values and positional terms for this token."""
        ...

    def push(self, i: int, x: Tensor, weights: Tensor | None) -> None:
        """Layer ``i``'s attention input x (B, 1, d) into its memory (Algorithm 1's update at T = 1); weights: its
        attention weights where the compressor reads them (most_used)."""
        ...


@dataclass
class LayersOutput:
    h: Tensor  # (B, T, d) the last block's output
    memory: MemoryState | None  # None when decoding (the decoder's rings moved on in place)
    aux: Tensor | None  # (n_layers,) the compression loss of each layer (when asked for and something was compressed)
    attentions: list[Tensor]  # per layer attention weights (when asked for)


def label(cfg: ModelConfig) -> str:
    return "Compressive Transformer" if cfg.memory.cmem_len > 0 else "Transformer-XL"


class CompressiveTransformerLM(DeclaresWrites, nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.input = InputLayer(cfg)
        self.drop = dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        share_positions([b.attn for b in self.blocks], cfg.positions.share)
        self.output = OutputLayer(cfg, self.input)

        trained = cfg.uses_compression and compressor_spec(cfg.compression.function).trainable
        self.compressors = (
            nn.ModuleList(build_compressor(cfg) for _ in range(cfg.n_layers)) if cfg.uses_compression else None
        )
        self.decoders = (
            nn.ModuleList(ConvDecoder(d, cfg.compression.rate) for _ in range(cfg.n_layers))
            if trained and compression_loss_spec(cfg.compression.loss).decoder
            else None
        )
        self.apply(lambda m: init_weights(m, cfg.init_std))

    # ---------------------------------------------------------------------------------------------------------

    def parameters_of(self, group: str) -> list[nn.Parameter]:
        """``"compressor"``: the compression networks and the auto-encoder's decoders; ``"model"``: everything else."""
        compressor_ids = {id(p) for m in (self.compressors, self.decoders) if m is not None for p in m.parameters()}
        if group == "compressor":
            return [p for p in self.parameters() if id(p) in compressor_ids]
        if group == "model":
            return [p for p in self.parameters() if id(p) not in compressor_ids]
        raise ValueError(f"unknown parameter group {group!r}; use 'model' or 'compressor'")

    def full_precision_reads(self) -> list[nn.Parameter]:
        """The weights the model reads outside a matmul, in full precision under autocast too: the key/value weights
        the attention-reconstruction loss projects the compressed memory with (training keeps low-precision copies
        of the other matmul weights, :mod:`compressive_transformer.training.low_precision`)."""
        return [block.attn.qkv.weight for block in self.blocks] if self.compressors is not None else []

    def init_memory(
        self,
        batch_size: int,
        *,
        mem_len: int | None = None,
        cmem_len: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> MemoryState:
        """Empty memories; ``mem_len``/``cmem_len`` may differ from training (no parameter depends on them)."""
        check_batch_size(batch_size)
        cfg = self.cfg
        mem_len = cfg.memory.mem_len if mem_len is None else mem_len
        cmem_len = cfg.memory.cmem_len if cmem_len is None else cmem_len
        if mem_len < 0 or cmem_len < 0:
            raise ValueError(f"memory lengths must be >= 0, got mem_len={mem_len}, cmem_len={cmem_len}")
        if cmem_len > 0 and not cfg.uses_compression:
            raise ValueError("this model was built without compression (cmem_len=0); it cannot use a compressed memory")
        if cmem_len > 0 and mem_len < cfg.compression.extra_width:
            raise ValueError(f"mem_len={mem_len} is shorter than compression_extra_width={cfg.compression.extra_width}")
        param = next(self.parameters())
        device = param.device if device is None else device
        dtype = param.dtype if dtype is None else dtype
        comp = self.compressors[0] if self.compressors is not None else None
        layer = lambda: empty_layer(  # noqa: E731
            batch_size,
            cfg.d_model,
            mem_len=mem_len,
            cmem_len=cmem_len,
            compression_rate=cfg.compression.rate,
            window=comp.window if comp is not None else 1,
            track_usage=cmem_len > 0 and compressor_spec(cfg.compression.function).needs_usage,
            keep_windows=cmem_len > 0 and compression_loss_spec(cfg.compression.loss).bptt,
            context=comp.context if comp is not None else 0,
            device=device,
            dtype=dtype,
        )
        layers = tuple(layer() for _ in range(cfg.n_layers))
        if cfg.memory.init == "zeros":
            layers = tuple(self._zero_input_memory(state, block) for state, block in zip(layers, self.blocks))
        return MemoryState(layers)

    @staticmethod
    def _zero_input_memory(state: LayerMemory, block: Block) -> LayerMemory:
        """``memory.init = "zeros"``: every slot valid and holding what the layer stores for a zero input (zeros, or
        the pre-norm's bias), as the first segment sees it in `transformers`' Transformer-XL."""
        with torch.no_grad():
            slot = block.attn_input(state.mem.new_zeros(state.mem.shape[-1]))  # (d,)
        return replace(
            state,
            mem=slot.expand_as(state.mem).clone(),
            mem_mask=torch.ones_like(state.mem_mask),
            fill=state.capacity,
        )

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
        """inputs: (B, T) token ids, or (B, T, input_dim) floats in continuous mode; targets: (B, T), -100 = ignore;
        input_mask: (B, T) bool, False for padding (never attended to by real tokens, never valid in memory);
        compression_loss: compute the auxiliary losses (default: only when gradients are enabled — evaluation and
        generation skip the work; analyses of compressibility ask for them)."""
        cfg = self.cfg
        check_inputs(cfg, inputs, targets, input_mask)
        B, T = inputs.shape[:2]
        if memory is None:
            memory = self.init_memory(B, device=inputs.device)
        param = next(self.parameters())
        check_memory(
            cfg, memory, batch_size=B, n_layers=cfg.n_layers, dtype=param.dtype, device=param.device, compressive=True
        )
        if input_mask is None:
            input_mask = torch.ones(B, T, dtype=torch.bool, device=inputs.device)
        want_aux = torch.is_grad_enabled() if compression_loss is None else compression_loss
        out = self.layers(
            self.drop(self.input(inputs)), memory, input_mask.bool(), need_weights=need_weights, want_aux=want_aux
        )
        h, logits, loss = self.output(out.h, targets)
        aux_losses = out.aux if out.aux is not None else h.new_zeros(cfg.n_layers)
        return LMOutput(
            logits=logits,
            loss=loss,
            aux_loss=aux_losses.mean(),
            aux_losses=aux_losses.detach(),
            memory=out.memory,
            hidden=h,
            attentions=out.attentions if need_weights else None,
        )

    def layers(
        self,
        h: Tensor,
        memory: MemoryState | None,
        input_mask: Tensor | None,
        *,
        need_weights: bool = False,
        want_aux: bool = False,
        decoding: DecodingState | None = None,
    ) -> LayersOutput:
        """The blocks over their memories and Algorithm 1's update of each: what :meth:`forward` and the
        token-by-token :class:`~compressive_transformer.core.models.decode.Decoder` share. h: (B, T, d) embedded
        inputs; decoding: a decoder's state for one token (its keys, values, tables and memory rings, moved on in
        place; ``memory`` and ``input_mask`` are then unused). The mask arithmetic of the keys and of the memory
        update is done once per segment: every layer pushes the same positions and resets the same rows."""
        cfg = self.cfg
        if decoding is None:
            first = memory.layers[0]
            p = cfg.positions
            window = first.mem_len - p.same_length_self if p.same_length else 0
            kernel, mask = plan(
                cfg, input_mask, first, window=window, h=h, need_weights=need_weights, training=self.training
            )
            positions = self.positions(first, h.shape[1], device=h.device, dtype=compute_dtype(h.device, h.dtype))
            slots = plan_update(
                first,
                input_mask,
                compression_rate=cfg.compression.rate,
                extra_width=cfg.compression.extra_width,
                compressing=first.cmem_len > 0 and self.compressors is not None,
            )
        else:
            kernel, mask = decoding.kernel, decoding.mask
        bptt = cfg.compression.bptt_horizon if compression_loss_spec(cfg.compression.loss).bptt else 0
        new_layers, evictions, attentions = [], [], []
        for i, block in enumerate(self.blocks):
            compress = self.compressors[i] if self.compressors is not None else None
            if decoding is not None:
                store, tables = decoding.layer(i)
                out = block(h, store, tables, mask, kernel)
                decoding.push(i, out.attn_in, out.attn.weights)
            else:
                state = memory.layers[i]
                cmem = compressed_for_attention(state, compress)
                out = block(h, [cmem, state.mem], block.attn.tables(positions), mask, kernel)
                usage = self._usage(out.attn.weights, input_mask, state) if state.usage is not None else None
                new_state, eviction = update_layer(
                    state,
                    out.attn_in,
                    input_mask,
                    compression_rate=cfg.compression.rate,
                    extra_width=cfg.compression.extra_width,
                    compress=compress,
                    attn_usage=usage,
                    bptt_horizon=bptt,
                    plan=slots,
                )
                new_layers.append(new_state)
                if want_aux:
                    evictions.append(self._evicted(out, eviction, state.cmem_len))
            if need_weights:
                attentions.append(out.attn.weights)
            h = out.h
            del out  # this layer's attention buffers are not kept while the next layer runs
        aux = self._compression_losses(evictions, input_mask) if want_aux and decoding is None else None
        return LayersOutput(h, MemoryState(tuple(new_layers)) if decoding is None else None, aux, attentions)

    def positions(self, first: LayerMemory, seg_len: int, *, device, dtype) -> Positions:
        """The relative positions of a ``seg_len``-query segment over memories shaped as ``first``."""
        p = self.cfg.positions
        return make_positions(
            seg_len=seg_len,
            mem_capacity=first.capacity,
            cmem_len=first.cmem_len,
            cmem_offset=first.fill if p.cmem == "shared" else 0,
            d_model=self.cfg.d_model,
            clamp_len=p.clamp_len,
            device=device,
            dtype=dtype,
        )

    @staticmethod
    def _usage(weights: Tensor, input_mask: Tensor, state: LayerMemory) -> Tensor:
        """Attention each memory slot received in this segment, averaged over heads and real queries: (B, M)."""
        C, M = state.cmem_len, state.capacity
        valid_q = input_mask[:, None, :, None].to(weights.dtype)  # (B, 1, T, 1)
        return ((weights[..., C : C + M] * valid_q).sum(2) / valid_q.sum(2).clamp(min=1)).mean(1).detach()

    def _evicted(self, out: BlockOutput, eviction: Eviction | None, n_cm: int) -> tuple | None:
        """What the compression loss reads of one layer's eviction (None when nothing was compressed or the loss is
        not local): its queries, the evicted slots' keys and values, the eviction."""
        if eviction is None or not compression_loss_spec(self.cfg.compression.loss).local:
            return None
        first = n_cm + eviction.start  # the evicted slots' place in this step's [cmem; mem; x] keys/values
        old = slice(first, first + eviction.old.shape[1])
        return out.attn.q, out.attn.k[:, :, old], out.attn.v[:, :, old], eviction

    def _compression_losses(self, evicted: list[tuple | None], input_mask: Tensor) -> Tensor | None:
        """The local compression loss of every layer, (n_layers,), computed for all layers at once (every layer
        evicts the same positions and shares the masks); None when no layer compressed anything this segment."""
        if not evicted or evicted[0] is None:
            return None
        loss = compression_loss_spec(self.cfg.compression.loss)
        queries, keys, values, evictions = zip(*evicted)
        first, n = evictions[0], self.blocks[0].attn.n_heads * self.blocks[0].attn.d_head
        weights = torch.stack([block.attn.qkv.weight for block in self.blocks])  # (L, 3 H d_h, d)
        return loss.compute(
            EvictionLoss(
                queries=torch.stack(queries),
                query_mask=input_mask,
                old=torch.stack([e.old for e in evictions]),
                old_keys=torch.stack(keys),
                old_values=torch.stack(values),
                old_mask=first.group_mask,  # the evicted states of whole valid groups
                compressed=torch.stack([e.compressed for e in evictions]),
                compressed_mask=first.compressed_mask,
                w_k=weights[:, n : 2 * n],
                w_v=weights[:, 2 * n :],
                decoders=list(self.decoders) if loss.decoder else None,
            )
        )
