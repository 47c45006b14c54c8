"""Explicit recurrent state: per-layer FIFO memory and compressed memory, and the one function that updates it.

Layout (per layer, fixed shapes so rows can be reset independently and ``torch.compile`` sees static sizes):

- ``mem``  (B, capacity, d): the layer's attention inputs, oldest slot first, right-aligned. Capacity is n_m plus, when
  compressing, c - 1 slots for evicted states that wait for a whole group of c before they are compressed (nothing is
  ever dropped), rounded up to align the keys (:data:`KEY_ALIGN`).
- ``cmem`` (B, n_cm, d): compressed slots, oldest first, right-aligned.
- ``history`` (B, h, d): the last h = ``Compressor.context`` states evicted from memory (h = 0 but for the dilated
  convolution, whose causal stack over the evicted stream reads them when it compresses the next group); zeros
  where no state of the row's current document has been evicted yet.
- ``*_mask`` (B, slots) bool: which slots hold a state of the row's current document.

Every row pushes the same number of positions per segment, so how many slots are occupied (``fill``) is the same
for all rows and is a plain int; validity per row lives in the masks. Eviction groups therefore depend only on how
many states the stream has pushed, never on how the stream was cut into segments.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch
from torch import Tensor

Compress = Callable[[Tensor, "Tensor | None"], Tensor]  # (windows (B,G,k,d), usage (B,G*c) | None) -> (B,G,d)


@dataclass(frozen=True)
class LayerMemory:
    """State of one layer. Only :func:`update_layer` creates a successor; nothing mutates it in place."""

    mem: Tensor  # (B, mem_capacity, d)
    mem_mask: Tensor  # (B, mem_capacity) bool
    cmem: Tensor  # (B, cmem_len, d)
    cmem_mask: Tensor  # (B, cmem_len) bool
    mem_len: int  # n_m: slots kept after eviction (capacity adds c - 1 pending slots when compressing, rounded up)
    fill: int  # occupied memory slots, the same for every row
    usage: Tensor | None = None  # (B, mem_capacity) attention received while in memory (most_used)
    cmem_src: Tensor | None = None  # (B, cmem_len, k, d) windows behind each compressed slot (bptt)
    young: tuple[int, ...] = ()  # bptt: compressed slots pushed by each of the last segments, newest last
    history: Tensor | None = None  # (B, h, d) the last h evicted states, oldest first (compressors with context)
    history_mask: Tensor | None = None  # (B, h) bool: which of them belong to the row's current document
    rate: int = 0  # compression rate of the model that made it (0: not recorded); a model refuses another rate

    @property
    def batch_size(self) -> int:
        return self.mem.shape[0]

    @property
    def cmem_len(self) -> int:
        return self.cmem.shape[1]

    @property
    def capacity(self) -> int:
        return self.mem.shape[1]

    @property
    def n_young(self) -> int:
        """Compressed slots that still carry the compressor's graph (recomputed from their windows)."""
        return min(sum(self.young), self.cmem_len)


ROW_TENSORS = (
    "mem",
    "mem_mask",
    "cmem",
    "cmem_mask",
    "usage",
    "cmem_src",
    "history",
    "history_mask",
)  # per-row state (dim 0 = batch row)


def is_row_tensor(name: str) -> bool:
    """Whether an entry of :meth:`MemoryState.to_tensors` holds one slice per batch row (rather than a counter)."""
    return name.rsplit(".", 1)[-1] in ROW_TENSORS


@dataclass(frozen=True)
class MemoryState:
    """The model's whole recurrent state: one :class:`LayerMemory` per layer, passed into and out of ``forward``."""

    layers: tuple[LayerMemory, ...]

    @property
    def batch_size(self) -> int:
        return self.layers[0].batch_size

    def reset(self, rows: Tensor | Sequence[int]) -> "MemoryState":
        """The same state with ``rows`` emptied (a document boundary); other rows are untouched."""
        B = self.batch_size  # a mask of another length would fail inside torch, or (length 1) broadcast silently
        if isinstance(rows, Tensor) and rows.dtype == torch.bool:
            if tuple(rows.shape) != (B,):
                raise ValueError(f"rows: a mask needs one entry per memory row, shape ({B},); got {tuple(rows.shape)}")
        elif any(not -B <= int(r) < B for r in (rows.reshape(-1).tolist() if isinstance(rows, Tensor) else rows)):
            raise ValueError(f"rows: indices must be in [-{B}, {B}) for a memory of {B} rows; got {rows!r}")
        layer0 = self.layers[0]
        keep = torch.ones(layer0.batch_size, dtype=torch.bool, device=layer0.mem.device)
        if isinstance(rows, Tensor) and rows.dtype == torch.bool:
            keep = ~rows.to(keep.device)
        else:
            keep[
                torch.as_tensor(
                    list(rows) if not isinstance(rows, Tensor) else rows, dtype=torch.long, device=keep.device
                )
            ] = False
        return MemoryState(tuple(_reset_layer(layer, keep) for layer in self.layers))

    def select_rows(self, rows: slice) -> "MemoryState":
        """The state of some batch rows only (a process of a data-parallel run owns a block of rows)."""
        return MemoryState(tuple(_map_tensors(layer, lambda t: t[rows]) for layer in self.layers))

    def detach(self) -> "MemoryState":
        return MemoryState(tuple(_map_tensors(layer, Tensor.detach) for layer in self.layers))

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "MemoryState":
        """Move to ``device``; floating buffers also take ``dtype`` (masks stay bool)."""

        def move(t: Tensor) -> Tensor:
            return t.to(device=device, dtype=dtype if t.is_floating_point() else None)

        return MemoryState(tuple(_map_tensors(layer, move) for layer in self.layers))

    def to_tensors(self) -> dict[str, Tensor]:
        """Flat name -> tensor mapping (ints as 0-dim tensors) for safetensors checkpoints. Layers share their masks
        (one update plan per segment); each entry gets its own copy, as safetensors stores no shared memory."""
        out: dict[str, Tensor] = {}
        seen: set[int] = set()
        for i, layer in enumerate(self.layers):
            p = f"layers.{i}."
            for name in ROW_TENSORS:
                t = getattr(layer, name)
                if t is not None:
                    t = t.detach().contiguous()
                    shared = t.untyped_storage().data_ptr() in seen and t.numel() > 0
                    seen.add(t.untyped_storage().data_ptr())
                    out[p + name] = t.clone() if shared else t
            out[p + "mem_len"] = torch.tensor(layer.mem_len)
            out[p + "fill"] = torch.tensor(layer.fill)
            out[p + "young"] = torch.tensor(list(layer.young), dtype=torch.long)
            out[p + "rate"] = torch.tensor(layer.rate)
        return out

    @staticmethod
    def from_tensors(tensors: dict[str, Tensor]) -> "MemoryState":
        layers = []
        i = 0
        while f"layers.{i}.mem" in tensors:
            p = f"layers.{i}."
            layers.append(
                LayerMemory(
                    mem=tensors[p + "mem"],
                    mem_mask=tensors[p + "mem_mask"].bool(),
                    cmem=tensors[p + "cmem"],
                    cmem_mask=tensors[p + "cmem_mask"].bool(),
                    mem_len=int(tensors[p + "mem_len"]),
                    fill=int(tensors[p + "fill"]),
                    usage=tensors.get(p + "usage"),
                    cmem_src=tensors.get(p + "cmem_src"),
                    history=tensors.get(p + "history"),
                    history_mask=None if p + "history_mask" not in tensors else tensors[p + "history_mask"].bool(),
                    young=tuple(int(x) for x in tensors[p + "young"].tolist()),
                    rate=int(tensors[p + "rate"]) if p + "rate" in tensors else 0,
                )
            )
            i += 1
        if not layers:
            raise ValueError("no memory tensors found (expected keys like 'layers.0.mem')")
        return MemoryState(tuple(layers))


# Score rows of odd length (cmem_len + n_m + c - 1 + n_s = 387 keys in the reference model) made the CPU matmul that
# accumulates q k^T into them twice as slow as rows of 384 or 392; the extra pending slots are never valid.
KEY_ALIGN = 8


def memory_capacity(*, mem_len: int, cmem_len: int, compression_rate: int) -> int:
    """The memory's slots: ``mem_len`` plus room for the c - 1 states pending compression (only when compressing),
    rounded up so that the memory keys (cmem_len + capacity) are a multiple of :data:`KEY_ALIGN`."""
    pending = compression_rate - 1 if cmem_len > 0 else 0
    if pending:
        pending += -(cmem_len + mem_len + pending) % KEY_ALIGN
    return mem_len + pending


def empty_layer(
    batch_size: int,
    d_model: int,
    *,
    mem_len: int,
    cmem_len: int,
    compression_rate: int,
    window: int,
    track_usage: bool,
    keep_windows: bool,
    context: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> LayerMemory:
    """A layer memory with no valid slot. Pending-eviction room (c - 1 slots) exists only when compressing; it is
    rounded up so that the memory keys (cmem_len + capacity) are a multiple of :data:`KEY_ALIGN`. ``window`` is the
    compressor's :attr:`~compressive_transformer.core.compression.Compressor.window` and ``context`` its context h (the
    evicted states it reads before each group, kept in ``history``)."""
    capacity = memory_capacity(mem_len=mem_len, cmem_len=cmem_len, compression_rate=compression_rate)
    kw = dict(device=device, dtype=dtype)
    return LayerMemory(
        mem=torch.zeros(batch_size, capacity, d_model, **kw),
        mem_mask=torch.zeros(batch_size, capacity, dtype=torch.bool, device=device),
        cmem=torch.zeros(batch_size, cmem_len, d_model, **kw),
        cmem_mask=torch.zeros(batch_size, cmem_len, dtype=torch.bool, device=device),
        mem_len=mem_len,
        fill=0,
        usage=torch.zeros(batch_size, capacity, **kw) if track_usage else None,
        cmem_src=torch.zeros(batch_size, cmem_len, window, d_model, **kw) if keep_windows else None,
        rate=compression_rate if cmem_len > 0 else 0,
        history=torch.zeros(batch_size, context, d_model, **kw) if cmem_len > 0 and context > 0 else None,
        history_mask=torch.zeros(batch_size, context, dtype=torch.bool, device=device)
        if cmem_len > 0 and context > 0
        else None,
    )


@dataclass(frozen=True)
class SlotUpdate:
    """What one segment does to a layer's slots, apart from the states themselves: how many leave memory and are
    compressed, and every validity mask that follows. Every layer pushes the same positions and has the same rows
    reset, so it is the same for all layers: :func:`plan_update` makes it once per segment (from the first layer's
    memory) and :func:`update_layer` moves each layer's states by it."""

    n_evict: int  # states that leave memory (whole groups of c when compressing)
    start: int  # where the oldest occupied slot sits in [mem; x]
    fill: int  # occupied memory slots afterwards
    mem_mask: Tensor  # (B, cap) the next memory's validity
    blank: Tensor  # (B, cap, 1) ~mem_mask: the next memory's slots, zeroed
    cmem_mask: Tensor  # (B, C) the next compressed memory's validity
    old_mask: Tensor | None = None  # (B, G*c) the evicted states' validity (None: nothing compressed)
    compressed_mask: Tensor | None = None  # (B, G) a compressed slot is valid when its whole group was
    compressed_blank: Tensor | None = None  # (B, G, 1) ~compressed_mask
    group_mask: Tensor | None = None  # (B, G*c) the evicted states of the valid groups (what the losses read)
    span_blank: Tensor | None = None  # (B, G*c + e, 1) the invalid states of the compressor's span (with context)
    history_mask: Tensor | None = None  # (B, h) the next history's validity (compressors with context)


def plan_update(
    state: LayerMemory, x_mask: Tensor, *, compression_rate: int, extra_width: int, compressing: bool
) -> SlotUpdate:
    """The :class:`SlotUpdate` of pushing a segment with validity ``x_mask`` (B, T) into memories shaped as
    ``state``; ``compressing``: evicted states are compressed (in whole groups of c) rather than dropped."""
    B, T = x_mask.shape
    c, cap = compression_rate, state.capacity
    combined_mask = torch.cat([state.mem_mask, x_mask], dim=1)  # (B, cap + T)
    total = state.fill + T
    n_evict = evicted_count(total, state.mem_len, c, compressing)
    fill = total - n_evict  # <= mem_len + c - 1 <= capacity
    start = cap + T - total
    occupied = torch.arange(cap, device=x_mask.device) >= cap - fill  # (cap,)
    mem_mask = combined_mask[:, T:] & occupied  # the newest cap slots (an explicit index: cap may be 0)
    plan = SlotUpdate(n_evict, start, fill, mem_mask, ~mem_mask.unsqueeze(-1), state.cmem_mask)
    if not (compressing and n_evict > 0):
        return plan
    old_mask = combined_mask[:, start : start + n_evict]
    compressed_mask = old_mask.view(B, n_evict // c, c).all(dim=-1)
    history = state.history_mask is not None
    return replace(
        plan,
        cmem_mask=push(state.cmem_mask, compressed_mask),
        old_mask=old_mask,
        compressed_mask=compressed_mask,
        compressed_blank=~compressed_mask.unsqueeze(-1),
        group_mask=compressed_mask.repeat_interleave(c, dim=1),
        span_blank=~combined_mask[:, start : start + n_evict + extra_width, None] if history else None,
        history_mask=push(state.history_mask, old_mask) if history else None,
    )


@dataclass(frozen=True)
class Eviction:
    """What one update evicted and compressed, for the auxiliary compression losses."""

    old: Tensor  # (B, G*c, d) evicted states, detached
    start: int  # where they sat in [mem; x] (so their keys/values from this step's attention can be reused)
    old_mask: Tensor  # (B, G*c) bool
    compressed: Tensor  # (B, G, d) f_c(old), still attached to the compressor's parameters
    compressed_mask: Tensor  # (B, G) bool: a slot is valid when its whole group was valid
    group_mask: Tensor  # (B, G*c) bool: the evicted states of the valid groups


def update_layer(
    state: LayerMemory,
    x: Tensor,
    x_mask: Tensor,
    *,
    compression_rate: int,
    extra_width: int,
    compress: Compress | None,
    attn_usage: Tensor | None = None,
    bptt_horizon: int = 0,
    plan: SlotUpdate | None = None,
) -> tuple[LayerMemory, Eviction | None]:
    """Algorithm 1, lines 8-11: push the layer inputs ``x``, evict the oldest states, compress them in groups of c.
    Each group's window is preceded by the h states evicted before it (``history``, for a compressor with context h),
    and ``history`` moves on to the newest h evicted states (invalid ones read as zeros).

    x: (B, T, d) the layer's attention inputs for this segment; x_mask: (B, T) False for padding.
    attn_usage: (B, capacity) attention the memory slots received in this segment (most_used only).
    plan: the segment's :func:`plan_update` (made here when not given; a caller updating several layers makes it
    once for all of them).
    """
    B, T, _ = x.shape
    c = compression_rate
    compressing = state.cmem_len > 0 and compress is not None
    if plan is None:
        plan = plan_update(state, x_mask, compression_rate=c, extra_width=extra_width, compressing=compressing)
    combined = torch.cat([state.mem, x.detach()], dim=1)  # (B, cap + T, d), the occupied region is the right end

    usage = None
    if state.usage is not None:
        mem_usage = state.usage + (attn_usage if attn_usage is not None else 0.0)
        usage_all = torch.cat([mem_usage, mem_usage.new_zeros(B, T)], dim=1)  # new slots start unused
        usage = usage_all[:, T:] * plan.mem_mask

    cmem, cmem_src, young, history = state.cmem, state.cmem_src, state.young, state.history
    eviction = None
    if plan.old_mask is not None:
        start, n = plan.start, plan.n_evict
        span = combined[:, start : start + n + extra_width]  # the evicted states and the e after them
        windows, history = compression_windows(span, n, c, history, plan.span_blank)
        old_usage = None if usage is None else usage_all[:, start : start + n]
        compressed = compress_group(windows, plan.old_mask, compress, old_usage)
        eviction = Eviction(span[:, :n], start, plan.old_mask, compressed, plan.compressed_mask, plan.group_mask)
        cmem = push(cmem, compressed.detach().masked_fill(plan.compressed_blank, 0.0))
        if cmem_src is not None:
            cmem_src = push(cmem_src, windows)
    if cmem_src is not None:  # only BPTT tracks how recent each compressed slot is
        young = (young + (plan.n_evict // c if eviction is not None else 0,))[-max(bptt_horizon, 1) :]

    new_state = replace(
        state,
        mem=combined[:, T:].masked_fill(plan.blank, 0.0),  # the newest cap slots; unoccupied or invalid ones zeroed
        mem_mask=plan.mem_mask,
        cmem=cmem,
        cmem_mask=plan.cmem_mask,
        fill=plan.fill,
        usage=usage,
        cmem_src=cmem_src,
        young=young,
        history=history,
        history_mask=plan.history_mask if plan.old_mask is not None else state.history_mask,
    )
    return new_state, eviction


def push(fifo: Tensor, new: Tensor) -> Tensor:
    """A FIFO (B, n, ...) after ``new`` (B, g, ...) entered at its new end and as many left at its old end: a new
    contiguous tensor (a slice of a concatenation would keep the longer buffer's strides, which vary from step to step
    and would make ``torch.compile`` specialise on each)."""
    n, g = fifo.shape[1], new.shape[1]
    return torch.cat([fifo[:, g:], new], dim=1) if g <= n else new[:, g - n :].contiguous()


def compression_windows(
    span: Tensor, n_evict: int, c: int, history: Tensor | None, span_blank: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """The compressor's input windows for ``n_evict`` evicted states, span (B, n_evict + e, d): them and the e newer
    ones after them. G = n_evict / c windows of c states, each preceded by h states of context (``history``, zeros
    where invalid: ``span_blank`` (B, n_evict + e, 1) marks the span's invalid states) and followed by e newer ones;
    and the history that follows (the newest h evicted states). Returns windows (B, G, h + c + e, d)."""
    if history is not None:  # the stream before the group: the last h evicted states, then these, zero if invalid
        h = history.shape[1]
        span = torch.cat([history, span.masked_fill(span_blank, 0.0)], dim=1)  # (B, h + G*c + e, d)
        history = span[:, n_evict : n_evict + h].contiguous()  # the newest h evicted (or, while few, earlier) states
    windows = span.unfold(1, span.shape[1] - n_evict + c, c).transpose(2, 3)  # (B, G, h + c + e, d)
    return windows, history


def compress_group(windows: Tensor, old_mask: Tensor, compress: Compress, old_usage: Tensor | None) -> Tensor:
    """f_c of each window (Algorithm 1, line 10): (B, G, d), attached to the compressor. old_mask: (B, G*c) the
    evicted states' validity; old_usage: (B, G*c) the attention they received (most_used), invalid ones never picked."""
    if old_usage is not None:
        old_usage = old_usage.masked_fill(~old_mask, float("-inf"))
    return compress(windows, old_usage)


def evicted_count(occupied: int, mem_len: int, compression_rate: int, compressing: bool) -> int:
    """How many of the ``occupied`` slots (after a push) leave memory: everything beyond n_m, in whole groups of c
    when compressing (the rest waits in the c - 1 pending slots)."""
    overflow = max(occupied - mem_len, 0)
    return (overflow // compression_rate) * compression_rate if compressing else overflow


def compressed_for_attention(state: LayerMemory, compress: Compress | None) -> Tensor:
    """The compressed memory a layer attends to. Under BPTT the young slots are recomputed from their windows so the
    task loss reaches the compressor; otherwise the stored (detached) slots."""
    n = state.n_young
    if state.cmem_src is None or compress is None or n == 0:
        return state.cmem
    fresh = compress(state.cmem_src[:, -n:], None).masked_fill(~state.cmem_mask[:, -n:].unsqueeze(-1), 0.0)  # (B, n, d)
    return torch.cat([state.cmem[:, : state.cmem_len - n], fresh], dim=1)


def _reset_layer(layer: LayerMemory, keep: Tensor) -> LayerMemory:
    def zero_rows(t: Tensor | None) -> Tensor | None:
        if t is None:
            return None
        shape = (keep.shape[0],) + (1,) * (t.dim() - 1)
        return t * keep.view(shape).to(t.dtype)

    return replace(
        layer,
        mem=zero_rows(layer.mem),
        mem_mask=layer.mem_mask & keep.unsqueeze(1),
        cmem=zero_rows(layer.cmem),
        cmem_mask=layer.cmem_mask & keep.unsqueeze(1),
        usage=zero_rows(layer.usage),
        cmem_src=zero_rows(layer.cmem_src),
        history=zero_rows(layer.history),
        history_mask=None if layer.history_mask is None else layer.history_mask & keep.unsqueeze(1),
    )


def _map_tensors(layer: LayerMemory, fn: Callable[[Tensor], Tensor]) -> LayerMemory:
    return replace(
        layer,
        mem=fn(layer.mem),
        mem_mask=fn(layer.mem_mask),
        cmem=fn(layer.cmem),
        cmem_mask=fn(layer.cmem_mask),
        usage=None if layer.usage is None else fn(layer.usage),
        cmem_src=None if layer.cmem_src is None else fn(layer.cmem_src),
        history=None if layer.history is None else fn(layer.history),
        history_mask=None if layer.history_mask is None else fn(layer.history_mask),
    )
