"""Token-by-token decoding: the model's own layers at T = 1, over state the decoder keeps in ring buffers.

A step runs :meth:`CompressiveTransformerLM.layers` on one token: the same blocks, attention and kernels that training
runs. What generation needs to be fast the :class:`Decoder` derives from the weights and owns, and the model holds none
of it: per layer, rings of the memory's states, of the compressed memory's states and of their keys and values, which
a token writes one slot of in place (nothing is concatenated or copied whole); the positional tables at T = 1, projected
once and read in ring order; the scaled biases. The keys of a step are ``[compressed ring; memory ring]``, the memory
ring holding the memory's slots and the token's own; the mask (one for all layers: every layer pushes the same
positions) and the tables' rows say where each slot sits in the stream.

Algorithm 1's update at T = 1 follows :func:`~compressive_transformer.core.memory.update_layer`'s rule: the same count
of evicted states (:func:`~compressive_transformer.core.memory.evicted_count`), the same compression windows and
compressor call (:func:`~compressive_transformer.core.memory.compression_windows`,
:func:`~compressive_transformer.core.memory.compress_evicted`), on ring slots in place: the token's state enters the
slot the oldest one left, a group of c evicted states is compressed into the compressed ring's oldest slot. The
ring's slot positions are host ints; everything a step reads of them arrives as index tensors, so the step is one
function of tensors whose work depends only on how full memory is (c values once it is full). :meth:`Decoder.memory`
gives back the :class:`MemoryState` that ``model.forward`` would have made, slot for slot.

Because that state is derived from the weights, a decoder refuses to step once they change
(:class:`~.weight_watch.WriteWatch`). ``compile``: the step under ``torch.compile``; ``cuda_graphs``: the step (compiled
or not) replayed as a CUDA graph, captured on first use over one set of static buffers. A step's work depends only on
whether the token evicts (so two graphs serve a whole generation, however full memory is; shared positional streams
add one per fill value).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from compressive_transformer.core.attention import Kernel, KeyMask, Tables
from compressive_transformer.core.dtypes import compute_dtype
from compressive_transformer.core.graphs import StaticGraphs
from compressive_transformer.core.kernels import choose_kernel
from compressive_transformer.core.memory import (
    LayerMemory,
    MemoryState,
    compress_group,
    compressed_for_attention,
    compression_windows,
    evicted_count,
    push,
)
from compressive_transformer.core.models.checks import check_memory, check_step_tokens
from compressive_transformer.core.models.lm import CompressiveTransformerLM
from compressive_transformer.core.models.weight_watch import WriteWatch
from compressive_transformer.core.registry import KERNELS, Ref


def unsupported(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot be decoded with a :class:`Decoder` (then ``model.forward`` is used), or None."""
    cfg = getattr(model, "cfg", None)
    if not isinstance(model, CompressiveTransformerLM):
        return "only CompressiveTransformerLM has a token-by-token decoder"
    if cfg.input_dim > 0 or cfg.vocab_size == 0:
        return "continuous inputs or no LM head"
    return None


@dataclass
class LayerRing:
    """One layer's decoding state, written in place: ring slots of the compressed memory (C) and of the memory
    with the current token (R = memory capacity + 1)."""

    k: Tensor  # (B, H, C + R, dh) keys: the compressed ring, then the memory ring
    v: Tensor  # (B, H, C + R, dh) values
    mem: Tensor  # (B, R, d) the memory ring's states (the layer's attention inputs)
    cmem: Tensor  # (B, C, d) the compressed ring's states
    history: Tensor | None  # (B, h, d) the compressor's context: the last h evicted states, oldest first
    usage: Tensor | None  # (B, R) most_used: attention each memory slot received while in memory
    cmem_src: Tensor | None  # (B, C, window, d) bptt: the window behind each compressed slot


@dataclass
class RingState:
    """Every layer's rings and what all layers share (their slots' validity, in ring order)."""

    layers: list[LayerRing]
    valid: Tensor  # (B, C + R) bool: the slot holds a state of the row's current document
    history_mask: Tensor | None  # (B, h) bool


@dataclass(frozen=True)
class TokenIndex:
    """Where one token reads and writes in the rings, as index tensors (a step's tensors, never its ints)."""

    slot: Tensor  # (1,) the token's slot in the memory ring
    key: Tensor  # (1,) the token's key, C + slot
    span: Tensor  # (c + e,) memory-ring slots of the oldest occupied states: an evicted group and the e after it
    cslot: Tensor  # (1,) the compressed-ring slot a compression writes (the oldest)


@dataclass(frozen=True)
class Group:
    """The validity of the group of c states a token evicts and compresses (and of the e after it): the same for
    every layer, so made once per token."""

    span_valid: Tensor  # (B, c + e) bool
    valid: Tensor  # (B, 1) bool: the compressed slot is valid when the whole group was
    blank: Tensor  # (B, 1, 1) ~valid
    span_blank: Tensor  # (B, c + e, 1) ~span_valid


@dataclass(frozen=True)
class Geometry:
    """What a decoding step's work depends on besides its tensors (a compiled step is specialised on it)."""

    C: int  # compressed ring slots
    R: int  # memory ring slots: the memory's capacity and the token's own
    mem_len: int
    rate: int
    compressing: bool
    window: int  # same_length's window (0: none)
    dense: bool  # the kernel reads the additive mask (else KeyMask.allowed)
    gather: bool  # the tables' ring order gathered from index tensors (compiled or graphed steps) or given as views


def decode_step(
    model: CompressiveTransformerLM,
    g: Geometry,
    kernel: Kernel,
    inputs: tuple[Tensor, ...],
    state: RingState,
    n_evict: int,
    tables: list[Tables],
) -> tuple[Tensor, tuple[RingState, int, list[Tables]]]:
    """One token per row: ``model.layers`` over the rings, which it moves on in place; the next-token logits (B, V).
    inputs: the tokens (B, 1), the :class:`TokenIndex` tensors, the -inf mask a token opens, and arange(R + 1) - 1
    and arange(C + 1) (the ring slots as table rows); ``n_evict``: how many states the token evicts (0, 1 without
    compression, c with it: what the step's work depends on, not how full memory is); tables: the
    layers' tables at T = 1, in slot order to be gathered (``g.gather``) or already in ring order. A free function of
    the model and tensors, so one compiled step serves every decoder of the same model and geometry."""
    C, c = g.C, g.rate
    tokens, ix, blocked, ring, cring = inputs[0], TokenIndex(*inputs[1:5]), inputs[5], inputs[6], inputs[7]
    valid = state.valid.index_fill_(1, ix.key, True)  # the token's own key
    group = None
    if n_evict > 0 and g.compressing:  # one group of c at most (memory holds at most n_m + c - 1 states)
        span_valid = valid[:, C:].index_select(1, ix.span)  # (B, c + e)
        whole = span_valid[:, :c].all(dim=-1, keepdim=True)  # (B, 1)
        group = Group(span_valid, whole, ~whole.unsqueeze(-1), ~span_valid.unsqueeze(-1))
    allowed = valid
    if g.window:  # same_length: the memory slots at most `window` positions back, every compressed one
        allowed = valid & torch.cat([cring[:C] >= 0, (ix.slot - ring[1:]).remainder(g.R) <= g.window])
    dense = blocked.masked_fill(allowed[:, None, None], 0.0) if g.dense else None
    if g.gather:  # memory-ring slot s: distance (p - s) mod R, table row cap - distance; compressed: (s - pc) mod C
        rows = (ring - ix.slot).remainder(g.R)  # (R + 1,), the last a spare row the kernels' shift may read
        crows = (cring - ix.cslot).remainder(C) if C > 0 else None  # (C + 1,)
        tables = [Tables(t.r.index_select(1, rows), None if C == 0 else t.rc.index_select(1, crows), t.biases)
                  for t in tables]  # fmt: skip
    mask = KeyMask(allowed, C, dense=dense, self_in_valid=True)
    out = model.layers(model.input(tokens), None, None, decoding=_Token(model, state, ix, tables, kernel, mask, group))
    _, logits, _ = model.output(out.h, None)
    if n_evict > 0:  # the slots that left memory are no longer keys; a compressed one is valid if its group was
        valid.index_fill_(1, C + ix.span[:n_evict], False)
        if group is not None:
            valid.index_copy_(1, ix.cslot, group.valid)
            if state.history_mask is not None:
                state.history_mask.copy_(push(state.history_mask, group.span_valid[:, :c]))
    return logits[:, -1], (state, n_evict, tables)


@functools.cache
def compiled_decode_step() -> Callable:
    """:func:`decode_step` under ``torch.compile``, made once per process: its graphs are guarded per model and
    geometry (two: with and without an eviction), so every later decoder of the same model reuses them."""
    compiled = torch.compile(decode_step, fullgraph=True)
    limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"

    def step(*args):  # each model and geometry adds its two graphs to the one code object's cache
        with torch._dynamo.config.patch(**{limit: max(getattr(torch._dynamo.config, limit), 64)}):
            return compiled(*args)

    return step


class _Store:
    """The attention's keys and values of one layer at one token: the token's written into its slot, all returned."""

    def __init__(self, ring: LayerRing, key: Tensor) -> None:
        self.ring, self.key = ring, key

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        ring = self.ring
        ring.k.index_copy_(2, self.key, _as(k, ring.k))
        ring.v.index_copy_(2, self.key, _as(v, ring.v))
        return ring.k, ring.v


def _as(t: Tensor, like: Tensor) -> Tensor:
    """``t`` in ``like``'s dtype (the rings keep theirs under autocast)."""
    return t if t.dtype == like.dtype else t.to(like.dtype)


class _Token:
    """One token's :class:`~compressive_transformer.core.models.lm.DecodingState`: what ``model.layers`` reads and
    where it pushes each layer's attention input."""

    def __init__(
        self,
        model: CompressiveTransformerLM,
        state: RingState,
        index: TokenIndex,
        tables: list[Tables],
        kernel: Kernel,
        mask: KeyMask,
        group: Group | None,
    ) -> None:
        self.model, self.state, self.index, self.tables = model, state, index, tables
        self.kernel, self.mask, self.group = kernel, mask, group

    def layer(self, i: int) -> tuple[_Store, Tables]:
        return _Store(self.state.layers[i], self.index.key), self.tables[i]

    def push(self, i: int, x: Tensor, weights: Tensor | None) -> None:
        """Algorithm 1 at T = 1 for layer i, in place: x (B, 1, d) into the token's slot; a due group of c evicted
        states (and e after it) compressed into the compressed ring's oldest slot, its key and value projected."""
        ring, ix, group, c = self.state.layers[i], self.index, self.group, self.model.cfg.compression.rate
        ring.mem.index_copy_(1, ix.slot, _as(x, ring.mem))
        old_usage = None
        if ring.usage is not None:  # the attention the memory slots got; the token's own slot starts unused
            ring.usage.add_(weights[:, :, 0, ring.cmem.shape[1] :].mean(1)).index_fill_(1, ix.slot, 0.0)
            if group is not None:
                old_usage = ring.usage.index_select(1, ix.span[:c])
        if group is None:
            return
        span = ring.mem.index_select(1, ix.span)  # (B, c + e, d)
        windows, history = compression_windows(span, c, c, ring.history, group.span_blank)
        if history is not None:
            ring.history.copy_(history)
        compressed = compress_group(windows, group.span_valid[:, :c], self.model.compressors[i], old_usage)
        new = compressed.masked_fill(group.blank, 0.0).to(ring.cmem.dtype)  # (B, 1, d)
        ring.cmem.index_copy_(1, ix.cslot, new)
        k, v = self.model.blocks[i].attn.keys_values(new)
        ring.k.index_copy_(2, ix.cslot, k.to(ring.k.dtype))
        ring.v.index_copy_(2, ix.cslot, v.to(ring.v.dtype))
        if ring.cmem_src is not None:
            ring.cmem_src.index_copy_(1, ix.cslot, windows.to(ring.cmem_src.dtype))


class Decoder:
    """Advances ``memory`` one token at a time for ``model`` in eval mode.

    Its rings, tables and keys/values are derived from the weights when it is made, so it is scoped to them: after any
    write to the weights (an optimizer step of any ``torch.optim`` optimizer, fused or not, a ``load_state_dict``, an
    in-place op, or ``model.weights_changed()`` after a hand-made ``.data`` write) ``step`` raises; make a new Decoder
    from :meth:`memory`. ``compile``: each step under ``torch.compile`` (two graphs: tokens that evict and tokens that
    do not; the first tokens pay the compilation); ``cuda_graphs``: each step replayed as a CUDA graph."""

    def __init__(
        self, model: CompressiveTransformerLM, memory: MemoryState, *, compile: bool = False, cuda_graphs: bool = False
    ) -> None:
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"no decoder for this model: {reason}; use model(...) one token at a time")
        if model.training:
            raise ValueError("decode in eval mode: call model.eval() first")
        param = next(model.parameters())
        rows = memory.batch_size if isinstance(memory, MemoryState) else 0
        check_memory(
            model.cfg,
            memory,
            batch_size=rows,
            n_layers=len(model.blocks),
            dtype=param.dtype,
            device=param.device,
            compressive=True,
        )
        self.model, cfg = model, model.cfg
        first = memory.layers[0]
        self.B, self.C, self.cap, self.mem_len = first.batch_size, first.cmem_len, first.capacity, first.mem_len
        self.R = self.cap + 1
        self.rate, self.extra = cfg.compression.rate, cfg.compression.extra_width
        self.compressing = self.C > 0 and model.compressors is not None
        self.fill, self.p, self.pc, self.young = first.fill, self.cap, 0, first.young  # p: the next token's slot
        self.window = first.mem_len - cfg.positions.same_length_self if cfg.positions.same_length else 0
        device = self.state_device = first.mem.device
        self.dtype = compute_dtype(device, first.mem.dtype)
        spec = KERNELS[_decoding_kernel(cfg, device, self.dtype, compile)]
        self.kernel = spec.run.resolve() if isinstance(spec.run, Ref) else spec.run
        self.dense = spec.dense_mask  # the kernel reads the additive mask (else KeyMask.allowed)
        self._tables: dict[int, list[Tables]] = {}  # per compressed-stream offset (the fill, for shared positions)
        # compiled or graphed steps gather the tables' rows in ring order from index tensors; eager steps read them as
        # views of tables laid out twice over (a view per ring position: no copy)
        self._gather = compile or cuda_graphs
        self._views: dict[tuple[int, str, int], list] = {}  # eager: the tables' slices per ring position
        with torch.no_grad():
            self.state = self._rings(memory)
            self._indices = self._index_tensors(device)
            # arange(R + 1) - 1 and arange(C + 1): the ring slots (and a spare) as table rows, less the token's slot
            self._ring = torch.arange(self.R + 1, device=device) - 1
            self._cring = torch.arange(self.C + 1, device=device)
        self._neg_inf: dict[torch.dtype, Tensor] = {}
        self._tables_for(self.fill)  # made now rather than in the first token
        self._watch = WriteWatch(model.parameters())
        self.geometry = Geometry(self.C, self.R, self.mem_len, self.rate, self.compressing, self.window, self.dense,
                                 self._gather)  # fmt: skip
        step = compiled_decode_step() if compile else decode_step
        self._step = lambda inputs, state, n_evict, tables: step(
            model, self.geometry, self.kernel, inputs, state, n_evict, tables
        )
        self._graphs = StaticGraphs(lambda inputs, state: self._step(inputs, *state)) if cuda_graphs else None

    # ----------------------------------------------------------------------------------------------------------
    # the state, from a MemoryState and back

    def _rings(self, memory: MemoryState) -> RingState:
        """The rings of ``memory``: memory slot j in ring slot j (the token's slot, ``cap``, empty), compressed slot j
        in compressed ring slot j; keys and values projected once."""
        model, B = self.model, self.B
        comps = list(model.compressors) if model.compressors is not None else [None] * len(model.blocks)
        layers = []
        for block, layer, comp in zip(model.blocks, memory.layers, comps):
            mem = torch.cat([layer.mem, layer.mem.new_zeros(B, 1, layer.mem.shape[-1])], dim=1)  # (B, R, d)
            kv = block.attn.keys_values(torch.cat([compressed_for_attention(layer, comp), mem], dim=1))
            usage = None if layer.usage is None else torch.cat([layer.usage, layer.usage.new_zeros(B, 1)], dim=1)
            layers.append(
                LayerRing(
                    k=kv[0].contiguous(),
                    v=kv[1].contiguous(),
                    mem=mem,
                    cmem=layer.cmem.clone(),
                    history=None if layer.history is None else layer.history.clone(),
                    usage=usage,
                    cmem_src=None if layer.cmem_src is None else layer.cmem_src.clone(),
                )
            )
        first = memory.layers[0]
        valid = torch.cat([first.cmem_mask, first.mem_mask, first.mem_mask.new_zeros(B, 1)], dim=1)
        history_mask = None if first.history_mask is None else first.history_mask.clone()
        return RingState(layers, valid, history_mask)

    def memory(self) -> MemoryState:
        """The model's memory after the tokens fed so far, as ``model.forward`` returns it (slot order, unoccupied and
        invalid slots zeroed)."""
        C, R, cap, dev = self.C, self.R, self.cap, self.state.valid.device
        with torch.no_grad():
            mem_order = (self.p + 1 + torch.arange(cap, device=dev)) % R  # oldest first
            cmem_order = (self.pc + torch.arange(C, device=dev)) % C
            valid = self.state.valid
            mem_mask, cmem_mask = valid[:, C:][:, mem_order], valid[:, :C][:, cmem_order]
            keep = lambda t, m: t.masked_fill(~m.unsqueeze(-1), 0.0)  # noqa: E731
            layers = []
            for ring in self.state.layers:
                layers.append(
                    LayerMemory(
                        mem=keep(ring.mem[:, mem_order], mem_mask),
                        mem_mask=mem_mask.clone(),
                        cmem=keep(ring.cmem[:, cmem_order], cmem_mask),
                        cmem_mask=cmem_mask.clone(),
                        mem_len=self.mem_len,
                        fill=self.fill,
                        usage=None if ring.usage is None else ring.usage[:, mem_order] * mem_mask,
                        cmem_src=None if ring.cmem_src is None else ring.cmem_src[:, cmem_order],
                        young=self.young,
                        history=None if ring.history is None else ring.history.clone(),
                        history_mask=None if self.state.history_mask is None else self.state.history_mask.clone(),
                        rate=self.rate if C > 0 else 0,
                    )
                )
        return MemoryState(tuple(layers))

    # ----------------------------------------------------------------------------------------------------------
    # per token

    def _index_tensors(self, device) -> dict[str, list[Tensor]]:
        """The index tensors of every ring position, made once: per memory-ring slot, per compressed-ring slot, per
        oldest occupied slot."""
        C, R, width = self.C, self.R, self.rate + self.extra
        one = lambda i: torch.tensor([i], dtype=torch.long, device=device)  # noqa: E731
        return {
            "slot": [one(p) for p in range(R)],
            "key": [one(C + p) for p in range(R)],
            "span": [(oldest + torch.arange(width, device=device)) % R for oldest in range(R)],
            "cslot": [one(pc) for pc in range(C)] or [one(0)],
        }

    def _index(self) -> TokenIndex:
        ix, p = self._indices, self.p
        oldest = (p - self.fill) % self.R  # of the fill + 1 states once the token's is in
        return TokenIndex(ix["slot"][p], ix["key"][p], ix["span"][oldest], ix["cslot"][self.pc])

    def _tables_for(self, fill: int) -> list[Tables]:
        """Each layer's tables at T = 1 in slot order, for memories filled to ``fill``: they depend on it only when the
        two positional streams are shared (the compressed stream's distances then start past the memory's)."""
        model = self.model
        key = fill if model.cfg.positions.cmem == "shared" else 0
        if key not in self._tables:
            ring = self.state.layers[0]
            first = LayerMemory(
                mem=ring.mem[:, : self.cap],
                mem_mask=self.state.valid[:, self.C : self.C + self.cap],
                cmem=ring.cmem,
                cmem_mask=self.state.valid[:, : self.C],
                mem_len=self.mem_len,
                fill=fill,
            )
            with torch.no_grad():
                positions = model.positions(first, 1, device=ring.mem.device, dtype=self.dtype)
                tables = [block.attn.tables(positions) for block in model.blocks]
                if not self._gather:  # row j of a doubled table holds row j mod R (mod C): ring order is a slice of it
                    twice = lambda t, n: t[:, torch.arange(2 * n + 1, device=t.device) % n]  # noqa: E731
                    tables = [Tables(twice(t.r, self.R), None if t.rc is None else twice(t.rc, self.C), t.biases)
                              for t in tables]  # fmt: skip
                self._tables[key] = tables
        return self._tables[key]

    def _ring_tables(self, fill: int) -> list[Tables]:
        """Eager steps: each layer's tables in ring order for this token, slices of the doubled tables (see
        :func:`decode_step`: memory-ring slot s reads row (s - p - 1) mod R, compressed-ring slot s row (s - pc) mod C),
        each slice made once per ring position."""
        tables, R, C = self._tables_for(fill), self.R, self.C
        key = fill if self.model.cfg.positions.cmem == "shared" else 0
        if (key, "r", self.p) not in self._views:
            o = (-self.p - 1) % R
            self._views[key, "r", self.p] = [t.r[:, o : o + R + 1] for t in tables]
        if (key, "rc", self.pc) not in self._views:
            oc = (-self.pc) % max(C, 1)
            self._views[key, "rc", self.pc] = [None if t.rc is None else t.rc[:, oc : oc + C + 1] for t in tables]
        r, rc = self._views[key, "r", self.p], self._views[key, "rc", self.pc]
        return [Tables(r[i], rc[i], t.biases) for i, t in enumerate(tables)]

    def _blocked(self) -> Tensor:
        """(B, 1, 1, C + R) -inf in the compute dtype in force, which a token's dense mask opens where keys may be read."""
        device = self.state.valid.device
        dtype = compute_dtype(device, self.dtype)
        if dtype not in self._neg_inf:
            shape = (self.B, 1, 1, self.state.valid.shape[1])
            self._neg_inf[dtype] = torch.full(shape, float("-inf"), dtype=dtype, device=device)
        return self._neg_inf[dtype]

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row, tokens: (B,) ids; returns the next-token logits (B, V). Tokens of another
        shape, type or device, or ids outside the vocabulary, are a one-line ``ValueError``."""
        if self._watch.written:
            raise RuntimeError("the model's weights changed while decoding; make a new Decoder from decoder.memory()")
        check_step_tokens(self.model.cfg, tokens, batch_size=self.B, device=self.state_device)
        n_evict = evicted_count(self.fill + 1, self.mem_len, self.rate, self.compressing)
        compressed = self.compressing and n_evict > 0
        ix = self._index()
        inputs = (tokens.reshape(-1, 1), ix.slot, ix.key, ix.span, ix.cslot, self._blocked(), self._ring, self._cring)
        tables = self._tables_for(self.fill) if self._gather else self._ring_tables(self.fill)
        state = (self.state, n_evict, tables)
        if self._graphs is not None:
            logits, (self.state, _, _) = self._graphs(inputs, state)
            logits = logits.clone()  # a static buffer: the next replay overwrites it
        else:
            logits, (self.state, _, _) = self._step(inputs, *state)
        self.fill += 1 - n_evict
        self.p = (self.p + 1) % self.R
        if compressed:
            self.pc = (self.pc + 1) % self.C
        if self.state.layers[0].cmem_src is not None:  # only BPTT tracks how recent each compressed slot is
            bptt = self.model.cfg.compression.bptt_horizon
            self.young = (self.young + (int(compressed),))[-max(bptt, 1) :]
        return logits


def _decoding_kernel(cfg, device: torch.device, dtype: torch.dtype, compile: bool) -> str:
    """The kernel of a decoding step: the configured one where it reads the mask a ring needs (the dense mask, or
    :meth:`KeyMask.allowed` as the reference does) and, compiled, traces; else the reference."""
    name = choose_kernel(
        cfg.attn_impl, device=device, need_weights=cfg.needs_attention_weights, dropout=0.0, dtype=dtype
    )
    spec = KERNELS[name]
    if (compile and not spec.traceable) or not (spec.dense_mask or name == "reference"):
        return "reference"
    return name
