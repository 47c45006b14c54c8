"""Token-by-token decoding with static ring buffers: the fast path of generation.

``model(token, memory)`` is exact at T = 1 but generic: every token it builds masks and positions, concatenates keys
and values, and makes a new immutable state (~340 operator calls for 4 layers). A :class:`Decoder` keeps each layer's
memory states and their keys/values in preallocated rings that advance in place, so a token costs ~150 calls and
copies nothing but its own slot. It computes what the model computes (tests pin it against ``model.forward`` token by
token, memory included) and gives back a :class:`MemoryState` on request. Its update mirrors
:func:`~compressive_transformer.core.memory.update_layer` for one token (sharing its eviction rule), in place.

Ring layout per layer, along the slot axis: ``[compressed ring (C) | memory ring (R = capacity + 1)]``, one
buffer for the states and one for their keys/values, so one matmul reads every key. Slot order lives in the
positional tables instead: each is stored twice over, so the distances of every ring slot at any ring offset are a
contiguous view. Validity is one additive mask shared by all layers (every layer pushes the same positions).

The per-token work is one free function of tensors, :func:`advance`; with ``Decoder(..., compile=True)`` it runs under
``torch.compile`` (one static graph for every ring offset: ~35 kernels instead of ~150 operator calls; the first token
pays the compilation, ~15 s on a 2-core CPU).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from compressive_transformer.core.attention import additive_mask, make_positions
from compressive_transformer.core.kv_cache import KVCache
from compressive_transformer.core.memory import LayerMemory, MemoryState, evicted_count
from compressive_transformer.core.models.lm import CompressiveTransformerLM
from compressive_transformer.core.registry import compression_loss_spec, compressor_spec
from compressive_transformer.core.stamps import WriteWatch


def unsupported(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot be decoded with a :class:`Decoder` (then ``model.forward`` is used), or None."""
    cfg = getattr(model, "cfg", None)
    if not isinstance(model, CompressiveTransformerLM):
        return "only CompressiveTransformerLM has a ring-buffer decoder"
    if cfg.input_dim > 0 or cfg.vocab_size == 0:
        return "continuous inputs or no LM head"
    if cfg.positions.same_length:
        return "same_length windows"
    if cfg.uses_compression and cfg.positions.cmem != "separate":
        return "shared compressed positions (their distances move with the memory's fill)"
    if cfg.uses_compression and compressor_spec(cfg.compression.function).needs_usage:
        return f"{cfg.compression.function} compression (the attention usage of memory slots is tracked)"
    if cfg.uses_compression and compression_loss_spec(cfg.compression.loss).bptt:
        return "bptt compression (compression windows are tracked)"
    return None


def advance(
    model: CompressiveTransformerLM,
    tokens: Tensor,
    slot: Tensor,
    kv: list[Tensor],
    states: list[Tensor],
    mem_tables: list[Tensor],
    cmem_tables: list[Tensor | None],
    biases: list[Tensor],
    mask: Tensor,
) -> Tensor:
    """One token through every layer: writes its state and keys/values into ring slot ``slot`` (a (1,) index into
    the slot axis) of each layer's buffers and returns the next-token logits (B, V).

    tokens: (B,); kv[l]: (B, H, C + R, 2 dh); states[l]: (B, C + R, d); mem_tables[l] / cmem_tables[l]: the positional
    tables at the current ring offsets (B*H, dh, R) / (B*H, dh, C) or None; mask: (B, 1, 1, C + R) additive, the
    slot itself already allowed. A free function of tensors, so ``torch.compile`` traces one static graph for every
    ring offset (the offsets arrive as views, the slot as a tensor) and the buffers are only written in place."""
    B = tokens.shape[0]
    h = model.input(tokens)  # (B, d): 2-D all through, the cheapest linear calls; no dropout in eval mode
    layers = zip(model.blocks, kv, states, mem_tables, cmem_tables, biases)
    for block, kv_l, states_l, mem_table, cmem_table, bias in layers:
        attn = block.attn
        H, dh = attn.n_heads, attn.d_head
        n, S = H * dh, kv_l.shape[2]
        x = block.attn_input(h)
        qkv = F.linear(x, attn.qkv.weight)  # (B, 3n)
        # under autocast the products come in the autocast dtype; the rings keep theirs (states: the weights')
        kv_l.view(B, H, S, 2, dh).index_copy_(2, slot, attn.kv_heads(qkv[:, None, n:]).to(kv_l.dtype))
        states_l.index_copy_(1, slot, x[:, None].to(states_l.dtype))
        flat = kv_l.view(B * H, S, 2 * dh)
        q = torch.add(bias, qkv[:, :n].view(B, H, 1, dh), alpha=attn.scale).view(B * H, 3, dh)
        scores = torch.bmm(q[:, :1], flat[..., :dh].transpose(1, 2))  # (B*H, 1, C + R)
        C = S - mem_table.shape[-1]
        scores[..., C:].add_(torch.bmm(q[:, 1:2], mem_table))  # (``+=`` on a slice would also copy it back)
        if cmem_table is not None:
            scores[..., :C].add_(torch.bmm(q[:, 2:3], cmem_table))
        probs = torch.softmax(scores.view(B, H, 1, S).add_(mask), dim=-1)
        y = torch.bmm(probs.view(B * H, 1, S), flat[..., dh:])  # (B*H, 1, dh)
        h = block.finish(h, attn.out(y.view(B, n)))
    _, logits, _ = model.output(h, None)
    return logits


def compress_into(
    model: CompressiveTransformerLM,
    span: Tensor,
    slot: Tensor,
    states: list[Tensor],
    kv: list[Tensor],
    mask: Tensor,
    history: list[Tensor],
    history_mask: list[Tensor],
) -> None:
    """Compress, in every layer, the buffer slots ``span`` ((c + e,) indices: the c evicted states, then e newer) into
    compressed slot ``slot`` ((1,) index), its keys/values included, and update the mask: the new slot is valid where
    the whole group was, the evicted slots no longer are. Buffers as in :func:`advance`; ``history`` /
    ``history_mask`` (per layer (B, h, d) / (B, h), empty lists when the compressor has no context) are the last h
    evicted states, read before the group and then moved on by it, in place."""
    B, rate = mask.shape[0], model.cfg.compression.rate
    evicted = span[:rate]
    span_valid = mask.view(B, -1).index_select(1, span) == 0  # (B, c + e)
    valid = span_valid[:, :rate].all(dim=-1, keepdim=True)  # (B, 1)
    for i, (block, compress, states_l, kv_l) in enumerate(zip(model.blocks, model.compressors, states, kv)):
        group = states_l.index_select(1, span)  # (B, c + e, d)
        if history:  # the stream before the group (as update_layer: invalid states read as zeros)
            group = torch.where(span_valid[..., None], group, 0.0)
            hist, h = history[i], history[i].shape[1]
            window = torch.cat([hist, group], dim=1)
            hist.copy_(window[:, rate : rate + h])
            history_mask[i].copy_(torch.cat([history_mask[i], span_valid[:, :rate]], dim=1)[:, rate : rate + h])
            group = window
        new = compress(group[:, None], None)  # (B, 1, d)
        new = torch.where(valid[..., None], new, 0.0)  # a group with an invalid state leaves an empty slot
        states_l.index_copy_(1, slot, new.to(states_l.dtype))
        kv_l.index_copy_(2, slot, block.attn.project_kv(new).to(kv_l.dtype))
    mask.index_copy_(3, slot, additive_mask(valid, mask.dtype).view(B, 1, 1, 1))
    mask.index_fill_(3, evicted, float("-inf"))


@functools.cache
def _compiled():
    """:func:`advance` and :func:`compress_into` under ``torch.compile``, made once per process: their graphs are
    cached (and guarded) per model structure, so later decoders of the same model reuse them; a second buffer
    geometry (batch, memory lengths) gets one graph with dynamic sizes for all further ones."""
    # The inputs are the decoder's own buffers, whose shapes it fixes: the per-call size asserts only cost time.
    options = {"size_asserts": False}
    return tuple(torch.compile(f, fullgraph=True, options=options) for f in (advance, compress_into))


class Decoder:
    """Advances ``memory`` one token at a time for ``model`` in eval mode.

    Its positional tables, biases and key/value ring are derived from the weights when it is made, so it is scoped to
    them: after any write to the weights (an optimizer step of any ``torch.optim`` optimizer, fused or not, a
    ``load_state_dict``, an in-place op, or ``model.weights_changed()`` after a hand-made ``.data`` write) ``step``
    raises; make a new Decoder from :meth:`memory`, whose keys and values the model then projects anew."""

    def __init__(self, model: CompressiveTransformerLM, memory: MemoryState, *, compile: bool = False) -> None:
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"no ring-buffer decoder for this model: {reason}; use model(...) one token at a time")
        if model.training:
            raise ValueError("decode in eval mode: call model.eval() first")
        self.model, cfg = model, model.cfg
        first = memory.layers[0]
        self.B, self.C, self.cap = first.batch_size, first.cmem_len, first.capacity
        self.R = self.cap + 1  # the memory and the current token
        self.mem_len, self.fill = first.mem_len, first.fill
        self.rate, self.extra = cfg.compression.rate, cfg.compression.extra_width
        self.p, self.pc = self.cap, 0  # next ring slot of the memory ring and of the compressed ring
        attn0 = model.blocks[0].attn
        self.H, self.dh = attn0.n_heads, attn0.d_head
        C, R = self.C, self.R

        ref = first.mem
        with torch.no_grad():
            self.states: list[Tensor] = []  # per layer (B, C + R, d)
            self.kv: list[Tensor] = []  # per layer (B, H, C + R, 2 dh)
            self.kv_stamps: list[int] = []  # per layer: the key/value weights' content stamp the ring was made with
            for block, layer in zip(model.blocks, memory.layers):
                attn = block.attn
                states = torch.cat([layer.cmem, layer.mem, ref.new_zeros(self.B, 1, ref.shape[-1])], dim=1)
                cache = layer.usable_kv(attn.kv_version)
                kv = cache.kv if cache is not None else attn.project_kv(states[:, : C + self.cap])
                self.kv_stamps.append(attn.kv_version)
                self.states.append(states)
                self.kv.append(torch.cat([kv, kv.new_zeros(self.B, self.H, 1, 2 * self.dh)], dim=2))
            allowed = torch.cat([first.cmem_mask, first.mem_mask, first.mem_mask.new_zeros(self.B, 1)], dim=1)
            self.mask = additive_mask(allowed, ref.dtype).view(self.B, 1, 1, C + R)

            # Positional tables at T = 1: memory distances cap .. 0 (and a spare -1), compressed C .. 1.
            positions = make_positions(
                seg_len=1,
                mem_capacity=self.cap,
                cmem_len=C,
                cmem_offset=0,
                d_model=cfg.d_model,
                clamp_len=cfg.positions.clamp_len,
                device=ref.device,
                dtype=ref.dtype,
            )
            # Doubled tables: column m holds distance (-m) mod R (mod C, plus 1, for the compressed ring), so with the
            # current token at ring slot p the view [a, a + R), a = (-p) mod R, gives every ring slot its distance.
            m_mem = torch.arange(2 * R, device=ref.device)
            m_cmem = torch.arange(2 * C, device=ref.device)
            per_row = lambda t: t.expand(self.B, *t.shape).reshape(self.B * self.H, *t.shape[1:])  # noqa: E731
            mem_tables, cmem_tables = [], []  # per layer (B*H, dh, 2R) / (B*H, dh, 2C) or None
            self.biases: list[Tensor] = []  # per layer (H, 3, dh): u, v and the compressed stream's v, scaled
            for block in model.blocks:
                attn = block.attn
                r, rc, cv = attn.positional_streams(positions)
                mem_tables.append(per_row(r[:, :, self.cap - (-m_mem) % R]))
                cmem_tables.append(per_row(rc[:, :, C - 1 - (-m_cmem) % C]) if rc is not None else None)
                self.biases.append(torch.stack([attn.u, attn.v, cv], dim=1) * attn.scale)
            # Tables, biases and the key/value ring are derived from the weights as they are now.
            self._watch = WriteWatch(model.parameters())
            # Every layer's table views at each ring offset, and each slot's index: a step only looks them up.
            self.mem_views = [[t[..., a : a + R] for t in mem_tables] for a in range(R)]
            self.cmem_views = [
                [t[..., a : a + C] if t is not None else None for t in cmem_tables] for a in range(max(C, 1))
            ]
            dev = ref.device
            self.slots = [torch.tensor([C + j], device=dev) for j in range(R)]
            self.cslots = [torch.tensor([j], device=dev) for j in range(C)]
            width = self.rate + self.extra  # the evicted group and e newer states, from each oldest ring slot
            self.spans = [C + (j + torch.arange(width, device=dev)) % R for j in range(R)] if C > 0 else []
            # The dilated convolution's evicted stream (copies: the decoder writes them in place).
            self.history = [layer.history.clone() for layer in memory.layers if layer.history is not None]
            self.history_mask = [layer.history_mask.clone() for layer in memory.layers if layer.history is not None]
        self._advance, self._compress = _compiled() if compile else (advance, compress_into)

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row, tokens: (B,) ids; returns the next-token logits (B, V)."""
        C, R, p = self.C, self.R, self.p
        if self._watch.written:
            raise RuntimeError("the model's weights changed while decoding; make a new Decoder from decoder.memory()")
        a_mem = (-p) % R
        a_cmem = (1 - self.pc) % C if C > 0 else 0  # the newest compressed slot is pc - 1
        self.mask[..., C + p] = 0.0  # the token itself
        logits = self._advance(
            self.model,
            tokens.view(self.B),
            self.slots[p],
            self.kv,
            self.states,
            self.mem_views[a_mem],
            self.cmem_views[a_cmem],
            self.biases,
            self.mask,
        )
        self._push()
        return logits

    def _push(self) -> None:
        """Algorithm 1's memory update for one pushed token, in place: evict the oldest states when a whole group of
        c has overflowed n_m (one state at a time without compression) and compress them into the next ring slot.
        One token at a time, at most one group is ever due (the memory holds at most n_m + c - 1 states)."""
        C, R = self.C, self.R
        written, total = self.p, self.fill + 1
        self.p = (written + 1) % R
        n_evict = evicted_count(total, self.mem_len, self.rate, C > 0)
        self.fill = total - n_evict
        if n_evict == 0:
            return
        oldest = (written - total + 1) % R
        if C == 0:
            self.mask[..., C + oldest] = float("-inf")
            return
        self._compress(
            self.model,
            self.spans[oldest],
            self.cslots[self.pc],
            self.states,
            self.kv,
            self.mask,
            self.history,
            self.history_mask,
        )
        self.pc = (self.pc + 1) % C

    def memory(self) -> MemoryState:
        """The model's memory after the tokens fed so far (with its key/value cache), as ``model.forward`` returns it."""
        C, R, cap = self.C, self.R, self.cap
        dev = self.mask.device
        mem_idx = C + (self.p - cap + torch.arange(cap, device=dev)) % R  # slot order, oldest first
        cmem_idx = (self.pc + torch.arange(C, device=dev)) % C
        order = torch.cat([cmem_idx, mem_idx])
        allowed = self.mask[:, 0, 0, order] == 0  # (B, C + cap)
        layers = []
        history = self.history or [None] * len(self.states)
        history_mask = self.history_mask or [None] * len(self.states)
        for states, kv, stamp, hist, hist_mask in zip(self.states, self.kv, self.kv_stamps, history, history_mask):
            s = states[:, order].masked_fill(~allowed.unsqueeze(-1), 0.0)
            layers.append(
                LayerMemory(
                    mem=s[:, C:],
                    mem_mask=allowed[:, C:],
                    cmem=s[:, :C],
                    cmem_mask=allowed[:, :C],
                    mem_len=self.mem_len,
                    fill=self.fill,
                    rate=self.model.cfg.compression.rate if C > 0 else 0,
                    history=None if hist is None else hist.clone(),
                    history_mask=None if hist_mask is None else hist_mask.clone(),
                    # tagged with the weights the ring was made with: after a write, the model projects anew
                    kv=KVCache.of(kv[:, :, cmem_idx], kv[:, :, mem_idx], version=stamp),
                )
            )
        return MemoryState(tuple(layers))
