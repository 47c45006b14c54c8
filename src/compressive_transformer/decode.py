"""Token-by-token decoding with static ring buffers: the fast path of generation.

``model(token, memory)`` is exact at T = 1 but generic: every token it builds masks and positions, concatenates keys
and values, and makes a new immutable state (~340 operator calls for 4 layers). A :class:`Decoder` keeps each layer's
memory states and their keys/values in preallocated rings that advance in place, so a token costs ~150 calls and
copies nothing but its own slot. It computes what the model computes (tests pin it against ``model.forward`` token by
token, memory included) and gives back a :class:`MemoryState` on request. Its update mirrors
:func:`~compressive_transformer.memory.update_layer` for one token (sharing its eviction rule), in place.

Ring layout per layer, along the slot axis: ``[compressed ring (C) | memory ring (R = capacity + 1)]``, one
buffer for the states and one for their keys/values, so one matmul reads every key. Slot order lives in the
positional tables instead: each is stored twice over, so the distances of every ring slot at any ring offset are a
contiguous view. Validity is one additive mask shared by all layers (every layer pushes the same positions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from compressive_transformer.attention import additive_mask, make_positions
from compressive_transformer.memory import KVCache, LayerMemory, MemoryState, evicted_count
from compressive_transformer.models.lm import CompressiveTransformerLM


def unsupported(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot be decoded with a :class:`Decoder` (then ``model.forward`` is used), or None."""
    cfg = getattr(model, "cfg", None)
    if not isinstance(model, CompressiveTransformerLM):
        return "only CompressiveTransformerLM has a ring-buffer decoder"
    if cfg.input_dim > 0 or cfg.vocab_size == 0:
        return "continuous inputs or no LM head"
    if cfg.same_length:
        return "same_length windows"
    if cfg.uses_compression and cfg.cmem_positions != "separate":
        return "shared compressed positions (their distances move with the memory's fill)"
    if cfg.uses_compression and (cfg.compression == "most_used" or cfg.compression_loss == "bptt"):
        return "most_used / bptt compression (attention usage or compression windows are tracked)"
    return None


@dataclass
class _Rings:
    """One layer's views into the decoder's buffers, made once (the buffers are only ever written in place)."""

    biases: Tensor  # (H, 3, dh): u, v and the compressed stream's v, scaled
    keys: Tensor  # (B*H, dh, C + R)
    values: Tensor  # (B*H, C + R, dh)
    scores: Tensor  # (B*H, 1, C + R) score buffer, and its two column blocks:
    mem_scores: Tensor
    cmem_scores: Tensor
    kv_slots: list[Tensor]  # per memory ring slot: its keys/values (B, H, 2, dh)
    state_slots: list[Tensor]  # per memory ring slot: its state (B, d)
    mem_tables: list[Tensor]  # per ring offset a: the memory stream's projected positions (B*H, dh, R)
    cmem_tables: list[Tensor]  # per ring offset a: the compressed stream's (B*H, dh, C)


class Decoder:
    """Advances ``memory`` one token at a time for ``model`` (in eval mode, weights unchanged while decoding)."""

    def __init__(self, model: CompressiveTransformerLM, memory: MemoryState) -> None:
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
        self.rate, self.extra = cfg.compression_rate, cfg.compression_extra_width
        self.p, self.pc = self.cap, 0  # next ring slot of the memory ring and of the compressed ring
        attn0 = model.blocks[0].attn
        self.H, self.dh = attn0.n_heads, attn0.d_head
        C, R = self.C, self.R

        ref = first.mem
        with torch.no_grad():
            self.states: list[Tensor] = []  # per layer (B, C + R, d)
            self.kv: list[Tensor] = []  # per layer (B, H, C + R, 2 dh)
            for block, layer in zip(model.blocks, memory.layers):
                attn = block.attn
                states = torch.cat([layer.cmem, layer.mem, ref.new_zeros(self.B, 1, ref.shape[-1])], dim=1)
                cache = layer.usable_kv(attn.kv_version)
                kv = cache.kv if cache is not None else attn.project_kv(states[:, : C + self.cap])
                self.states.append(states)
                self.kv.append(torch.cat([kv, kv.new_zeros(self.B, self.H, 1, 2 * self.dh)], dim=2))
            allowed = torch.cat([first.cmem_mask, first.mem_mask, first.mem_mask.new_zeros(self.B, 1)], dim=1)
            self.mask = additive_mask(allowed, ref.dtype).view(self.B, 1, 1, C + R)

            # Positional tables at T = 1: memory distances cap .. 0 (and a spare -1), compressed C .. 1.
            positions = make_positions(
                seg_len=1, mem_capacity=self.cap, cmem_len=C, cmem_offset=0, d_model=cfg.d_model,
                clamp_len=cfg.clamp_len, device=ref.device, dtype=ref.dtype,
            )  # fmt: skip
            # Doubled tables: column m holds distance (-m) mod R (mod C, plus 1, for the compressed ring), so with the
            # current token at ring slot p the view [a, a + R), a = (-p) mod R, gives every ring slot its distance.
            m_mem = torch.arange(2 * R, device=ref.device)
            m_cmem = torch.arange(2 * C, device=ref.device)
            per_row = lambda t: t.expand(self.B, *t.shape).reshape(self.B * self.H, *t.shape[1:])  # noqa: E731
            self.rings: list[_Rings] = []
            for block, kv, states in zip(model.blocks, self.kv, self.states):
                attn = block.attn
                r, rc, cv = attn.positional_streams(positions)
                mem_table = per_row(r[:, :, self.cap - (-m_mem) % R])  # (B*H, dh, 2R)
                cmem_table = per_row(rc[:, :, C - 1 - (-m_cmem) % C]) if rc is not None else None  # (B*H, dh, 2C)
                flat = kv.view(self.B * self.H, C + R, 2 * self.dh)
                scores = flat.new_empty(self.B * self.H, 1, C + R)
                self.rings.append(
                    _Rings(
                        biases=torch.stack([attn.u, attn.v, cv], dim=1) * attn.scale,
                        keys=flat[..., : self.dh].transpose(1, 2), values=flat[..., self.dh :], scores=scores,
                        mem_scores=scores[..., C:], cmem_scores=scores[..., :C],
                        kv_slots=[kv[:, :, C + j].view(self.B, self.H, 2, self.dh) for j in range(R)],
                        state_slots=[states[:, C + j] for j in range(R)],
                        mem_tables=[mem_table[..., a : a + R] for a in range(R)],
                        cmem_tables=[cmem_table[..., a : a + C] for a in range(C)] if cmem_table is not None else [],
                    )
                )  # fmt: skip

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row, tokens: (B,) ids; returns the next-token logits (B, V)."""
        model, B, C, R, H, dh, p = self.model, self.B, self.C, self.R, self.H, self.dh, self.p
        n = H * dh
        a_mem = (-p) % R
        a_cmem = (1 - self.pc) % C if C > 0 else 0  # the newest compressed slot is pc - 1
        self.mask[..., C + p] = 0.0  # the token itself
        h = model.input(tokens.view(B))  # (B, d): 2-D all through, the cheapest linear calls; no dropout in eval mode
        for block, v in zip(model.blocks, self.rings):
            attn = block.attn
            x = block.attn_input(h)
            qkv = F.linear(x, attn.qkv.weight)  # (B, 3n)
            v.kv_slots[p].copy_(attn.kv_heads(qkv[:, None, n:])[:, :, 0])
            v.state_slots[p].copy_(x)
            q = torch.add(v.biases, qkv[:, :n].view(B, H, 1, dh), alpha=attn.scale).view(B * H, 3, dh)
            scores = torch.bmm(q[:, :1], v.keys, out=v.scores)  # (B*H, 1, C + R)
            v.mem_scores += torch.bmm(q[:, 1:2], v.mem_tables[a_mem])
            if C > 0:
                v.cmem_scores += torch.bmm(q[:, 2:3], v.cmem_tables[a_cmem])
            scores.view(B, H, 1, C + R).add_(self.mask)
            torch.softmax(scores, dim=-1, out=scores)
            y = torch.bmm(scores, v.values)  # (B*H, 1, dh)
            h = block.finish(h, attn.out(y.view(B, n)))
        _, logits, _ = model.output(h, None)
        self._push()
        return logits

    def _push(self) -> None:
        """Algorithm 1's memory update for one pushed token, in place: evict the oldest states when a whole group of
        c has overflowed n_m (one state at a time without compression) and compress them into the next ring slot.
        One token at a time, at most one group is ever due (the memory holds at most n_m + c - 1 states)."""
        C, R, c = self.C, self.R, self.rate
        written, total = self.p, self.fill + 1
        self.p = (written + 1) % R
        n_evict = evicted_count(total, self.mem_len, c, C > 0)
        self.fill = total - n_evict
        if n_evict == 0:
            return
        oldest = (written - total + 1) % R
        span = self._ring_slots(oldest, n_evict + (self.extra if C > 0 else 0))  # the evicted, then e newer
        evicted = slice(span.start, span.start + n_evict) if isinstance(span, slice) else span[:n_evict]
        if C > 0:
            slot = self.pc
            valid = (self.mask[:, 0, 0, evicted] == 0).all(dim=-1)  # (B,) the whole group was valid
            all_valid = bool(valid.all())
            for block, states, kv, compress in zip(self.model.blocks, self.states, self.kv, self.model.compressors):
                new = compress(states[:, span].view(self.B, 1, -1, states.shape[-1]), None)[:, 0]  # (B, d)
                if not all_valid:
                    new = new.masked_fill(~valid.unsqueeze(-1), 0.0)
                states[:, slot] = new
                kv[:, :, slot] = block.attn.project_kv(new[:, None])[:, :, 0]
            self.mask[:, 0, 0, slot] = additive_mask(valid, self.mask.dtype)
            self.pc = (slot + 1) % C
        self.mask[:, 0, 0, evicted] = float("-inf")

    def _ring_slots(self, first: int, n: int) -> slice | Tensor:
        """Buffer positions of memory ring slots first, first + 1, ... (n of them): a slice unless the ring wraps."""
        if first + n <= self.R:
            return slice(self.C + first, self.C + first + n)
        return self.C + (first + torch.arange(n, device=self.mask.device)) % self.R

    def memory(self) -> MemoryState:
        """The model's memory after the tokens fed so far (with its key/value cache), as ``model.forward`` returns it."""
        C, R, cap = self.C, self.R, self.cap
        dev = self.mask.device
        mem_idx = C + (self.p - cap + torch.arange(cap, device=dev)) % R  # slot order, oldest first
        cmem_idx = (self.pc + torch.arange(C, device=dev)) % C
        order = torch.cat([cmem_idx, mem_idx])
        allowed = self.mask[:, 0, 0, order] == 0  # (B, C + cap)
        layers = []
        for block, states, kv in zip(self.model.blocks, self.states, self.kv):
            s = states[:, order].masked_fill(~allowed.unsqueeze(-1), 0.0)
            layers.append(
                LayerMemory(
                    mem=s[:, C:], mem_mask=allowed[:, C:], cmem=s[:, :C], cmem_mask=allowed[:, :C],
                    mem_len=self.mem_len, fill=self.fill,
                    kv=KVCache.of(kv[:, :, cmem_idx], kv[:, :, mem_idx], version=block.attn.kv_version),
                )
            )  # fmt: skip
        return MemoryState(tuple(layers))
