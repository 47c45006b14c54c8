"""Relative-position multi-head attention over ``[compressed memory; memory; segment]``, as the papers write it.

For query i and key j the score is Transformer-XL's (Dai et al. 2019, section 3.3, with the u and v biases)

    s_ij = (q_i + u)·k_j  +  (q_i + v)·W_r R_{i-j}          (content + position)

scaled by 1/sqrt(d_h), where R holds sinusoidal encodings of the relative distance. The compressed memory has its
own positional stream (its own W_r and v, as the authors' code), or shares the regular one; a slot's distance counts
slots within its stream, so a key's positional term does not depend on how full memory is. Empty slots and future
keys are masked; ``same_length`` limits every query to the same number of earlier positions.

:func:`relative_attention` is that math in plain tensor code: the reference every kernel is tested against. The
module projects queries, keys, values and positions, and hands them as one :class:`AttentionInputs` to a kernel
(:mod:`compressive_transformer.core.kernels`), which is this reference or a faster function computing the same thing.
The module holds parameters only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.dtypes import compute_dtype


def sinusoid(distances: Tensor, d_model: int) -> Tensor:
    """Transformer-XL sinusoidal encodings of (float) distances: (L,) -> (L, d_model)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d_model, 2, device=distances.device, dtype=torch.float32) / d_model))
    angles = distances.float()[:, None] * inv_freq[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


# Tables get a multiple of 8 rows, so the CPU kernel's (H, B*T, dh) x (H, dh, L) positional matmul writes rows whose
# length BLAS tiles without a ragged edge (odd lengths such as 255 or 385 are markedly slower with MKL).
TABLE_ALIGN = 8


def aligned_rows(n: int) -> int:
    """The rows a table of ``n`` distances gets: ``n`` rounded up to a multiple of :data:`TABLE_ALIGN` (a benchmark
    that builds its tables with these sizes launches the kernels the model launches, specialised alike)."""
    return -(-n // TABLE_ALIGN) * TABLE_ALIGN


@dataclass(frozen=True)
class Positions:
    """The sinusoids of one forward, shared by all layers (each projects them with its own W_r). Rows run from the
    largest distance down: row m of ``mem`` is distance (M + T - 1) - m, so key j' of [memory; segment] is read by
    query i at row j' - i + T - 1 (M memory slots, T queries); ``cmem`` likewise for the compressed stream, whose
    distances start at ``offset`` + 1 (0 for a separate stream; the memory's fill when the streams are shared)."""

    mem: Tensor  # (>= M + T + 1, d): distances M+T-1 down to -1 or lower (rows past 0 are read only at masked keys)
    cmem: Tensor  # (>= C + T, d) or (0, d) without a compressed memory


def make_positions(
    *, seg_len: int, mem_capacity: int, cmem_len: int, cmem_offset: int, d_model: int, clamp_len: int, device, dtype
) -> Positions:
    """The two streams' sinusoids for ``seg_len`` queries over ``cmem_len`` + ``mem_capacity`` + ``seg_len`` keys."""

    def table(hi: int, lo: int) -> Tensor:  # distances hi, hi - 1, ... down to lo or lower, TABLE_ALIGN rows at a time
        rows = aligned_rows(hi + 1 - lo)
        dist = torch.arange(hi, hi - rows, -1, device=device, dtype=torch.float32)
        return sinusoid(dist.clamp(max=clamp_len) if clamp_len > 0 else dist, d_model).to(dtype)

    T = seg_len
    mem = table(mem_capacity + T - 1, -1)
    cmem = table(cmem_offset + cmem_len + T - 1, cmem_offset) if cmem_len > 0 else mem.new_zeros(0, d_model)
    return Positions(mem=mem, cmem=cmem)


@dataclass(frozen=True)
class KeyMask:
    """Which keys of ``[cmem; mem; segment]`` each query may read, in the form every kernel can use: the slots'
    validity and the rule. A compressed key is read when valid; a memory or segment key at distance
    d = (query's position) - (key's position) when valid, 0 <= d (causal) and, with ``window`` > 0, d <= window; a
    query always reads itself, so no row is empty. Kernels that want the whole pattern read :attr:`dense`."""

    valid: Tensor  # (B, K) bool: the slot holds a state of the row's current document
    n_cmem: int  # C: the first C keys are the compressed memory
    window: int = 0  # same_length: how many earlier memory + segment positions a query reads (0: all)
    dense: Tensor | None = None  # (B, 1, T, K) additive (0 / -inf) in the compute dtype, for kernels that read one
    self_in_valid: bool = False  # T = 1 with the query's own key not last (a decoder's ring): valid is the rule
    block: object | None = None  # a kernel's own form of the rule, made once per forward (FlexAttention's BlockMask)

    def allowed(self, T: int) -> Tensor:
        """(B, 1, T, K) bool: the rule applied to every query of a T-position segment."""
        B, K = self.valid.shape
        C, n = self.n_cmem, K - self.n_cmem
        if self.self_in_valid:
            return self.valid[:, None, None, :]
        if T == 1 and (self.window == 0 or self.window >= n - 1):  # one query: every key is past or itself
            allowed = self.valid.clone()
            allowed[:, -1] = True
            return allowed[:, None, None, :]
        i = torch.arange(T, device=self.valid.device)[:, None]
        j = torch.arange(n, device=self.valid.device)[None, :]
        dist = (n - T) + i - j  # (T, M + T)
        causal = (dist >= 0) & (dist <= self.window) if self.window > 0 else dist >= 0
        allowed = (self.valid[:, None, C:] & causal) | (dist == 0)  # (B, T, M + T)
        if C > 0:
            allowed = torch.cat([self.valid[:, None, :C].expand(B, T, C), allowed], dim=-1)
        return allowed.unsqueeze(1)

    def with_dense(self, T: int, dtype: torch.dtype) -> "KeyMask":
        """The same mask with :attr:`dense` filled in (0 where a key may be read, -inf elsewhere)."""
        blocked = torch.full((self.valid.shape[0], 1, T, self.valid.shape[1]), float("-inf"), dtype=dtype)
        return replace(self, dense=blocked.to(self.valid.device).masked_fill_(self.allowed(T), 0.0))


def key_mask(x_mask: Tensor, mem_mask: Tensor, cmem_mask: Tensor, *, window: int = 0) -> KeyMask:
    """The :class:`KeyMask` of a segment (x_mask (B, T)) over a layer's memory (mem_mask (B, M), cmem_mask (B, C))."""
    return KeyMask(torch.cat([cmem_mask, mem_mask, x_mask], dim=1), cmem_mask.shape[1], window)


@dataclass(frozen=True)
class AttentionInputs:
    """Everything a kernel needs, the biases and the 1/sqrt(d_h) scale already applied to the queries."""

    qu: Tensor  # (B, H, T, dh) (q + u) / sqrt(dh): against the keys
    qv: Tensor  # (B, H, T, dh) (q + v) / sqrt(dh): against the memory + segment stream's positions
    qc: Tensor | None  # (B, H, T, dh) (q + v_c) / sqrt(dh) against the compressed stream's; None when C = 0
    k: Tensor  # (B, H, K, dh) keys of [cmem; mem; segment], K = C + M + T
    v: Tensor  # (B, H, K, dh) values
    r: Tensor  # (H, Lm, dh) W_r R, rows as Positions.mem
    rc: Tensor | None  # (H, Lc, dh) W_rc R_c, rows as Positions.cmem; None when C = 0
    mask: KeyMask
    dropout: float = 0.0  # attention dropout in force (training only)


Kernel = Callable[[AttentionInputs], "tuple[Tensor, Tensor | None]"]  # -> y (B, H, T, dh), weights (B, H, T, K)?


def rel_shift(x: Tensor, n: int) -> Tensor:
    """One column per table row -> one column per key: (..., T, L) -> (..., T, n), out[..., i, j] = x[..., i, j - i +
    T - 1], so that key j' of a stream gets the encoding of its distance to query i (needs n <= L - 1). Rows are cut
    out of the flattened table with a stride of L - 1 (Transformer-XL's shift); entries a row reads past its end
    belong to future keys, which the mask removes."""
    *lead, T, L = x.shape
    flat = x.reshape(*lead, T * L)[..., T - 1 : T - 1 + T * (L - 1)]
    return flat.reshape(*lead, T, L - 1)[..., :n]


def relative_attention(a: AttentionInputs) -> tuple[Tensor, Tensor]:
    """The reference: softmax over the masked scores of :mod:`this module <.attention>`, then the values.
    Returns the output (B, H, T, dh) and the attention weights (B, H, T, K)."""
    T, K, C = a.qu.shape[2], a.k.shape[2], a.mask.n_cmem
    content = a.qu @ a.k.transpose(-1, -2)  # (B, H, T, K): (q + u)·k_j
    position = rel_shift(a.qv @ a.r.transpose(-1, -2), K - C)  # (B, H, T, M + T): (q + v)·W_r R_{i-j}
    if C > 0:
        position = torch.cat([rel_shift(a.qc @ a.rc.transpose(-1, -2), C), position], dim=-1)  # compressed first
    scores = (content + position).masked_fill(~a.mask.allowed(T), float("-inf"))
    weights = scores.softmax(dim=-1)
    dropped = F.dropout(weights, a.dropout) if a.dropout > 0 else weights
    return dropped @ a.v, weights


@dataclass
class AttentionOutput:
    y: Tensor  # (B, T, d)
    weights: Tensor | None  # (B, H, T, K) when the kernel gives them
    q: Tensor  # (B, H, T, dh) the queries (the reconstruction loss reuses them)
    k: Tensor  # (B, H, K, dh) keys of [cmem; mem; segment] (the reconstruction loss reuses the evicted ones)
    v: Tensor  # (B, H, K, dh) values


@dataclass(frozen=True)
class Tables:
    """A layer's positional terms: what :meth:`RelativeAttention.tables` makes of a :class:`Positions`, the projected
    tables and the biases (the same for every query of a forward, so a decoder makes them once)."""

    r: Tensor  # (H, Lm, dh)
    rc: Tensor | None  # (H, Lc, dh)
    biases: Tensor  # (2 or 3, 1, H, 1, dh): u, v and, with rc, v_c, times 1/sqrt(d_h)


class KeyValueStore(Protocol):
    """A decoder's keys and values of one layer's memory slots (what it keeps between tokens instead of the states)."""

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Take the segment's keys and values (B, H, T, dh) and return those of every key (B, H, K, dh), in the order
        the step's mask and tables give the keys."""
        ...


def share_positions(layers: Sequence["RelativeAttention"], mode: str) -> None:
    """Make every layer use the first layer's positional parameters: ``"biases"`` the u/v biases (and the compressed
    stream's v), Transformer-XL's default (``untie_r = False`` in its code); ``"all"`` also the projections W_r of the
    sinusoids. ``"none"`` keeps them per layer. The parameters are the same objects, so each gets one gradient summed
    over the layers and the optimiser and checkpoints see it once."""
    if mode == "none" or not layers:
        return
    first = layers[0]
    names = ("u", "v", "cv") + (("pos", "cpos") if mode == "all" else ())
    for layer in layers[1:]:
        for name in names:
            if getattr(first, name) is not None:
                setattr(layer, name, getattr(first, name))


class RelativeAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, H, dh = cfg.d_model, cfg.n_heads, cfg.head_dim
        self.n_heads, self.d_head = H, dh
        self.qkv = nn.Linear(d, 3 * H * dh, bias=False)
        self.pos = nn.Linear(d, H * dh, bias=False)  # W_r for memory + segment
        self.u = nn.Parameter(torch.zeros(H, dh))  # content bias
        self.v = nn.Parameter(torch.zeros(H, dh))  # position bias
        separate = cfg.uses_compression and cfg.positions.cmem == "separate"
        self.cpos = nn.Linear(d, H * dh, bias=False) if separate else None  # W_r of the compressed stream
        self.cv = nn.Parameter(torch.zeros(H, dh)) if separate else None
        self.out = nn.Linear(H * dh, d, bias=False)
        self.attn_dropout = cfg.attn_dropout
        self.scale = 1.0 / math.sqrt(dh)

    @property
    def w_q(self) -> Tensor:
        return self.qkv.weight[: self.n_heads * self.d_head]

    @property
    def w_k(self) -> Tensor:
        n = self.n_heads * self.d_head
        return self.qkv.weight[n : 2 * n]

    @property
    def w_v(self) -> Tensor:
        return self.qkv.weight[2 * self.n_heads * self.d_head :]

    def heads(self, t: Tensor) -> Tensor:
        """(B, S, H * dh) -> (B, H, S, dh)."""
        B, S, _ = t.shape
        return t.view(B, S, self.n_heads, self.d_head).transpose(1, 2)

    def tables(self, positions: Positions) -> Tables:
        """W_r R of each stream as (H, L, dh) (without a separate compressed stream its rows come from W_r), and the
        biases u, v (, v_c) scaled by 1/sqrt(d_h)."""
        H, dh = self.n_heads, self.d_head
        project = lambda proj, table: proj(table).view(-1, H, dh).transpose(0, 1)  # noqa: E731
        if positions.cmem.shape[0] == 0:
            return Tables(project(self.pos, positions.mem), None, self.scaled_biases(False))
        cpos = self.cpos if self.cpos is not None else self.pos
        return Tables(project(self.pos, positions.mem), project(cpos, positions.cmem), self.scaled_biases(True))

    def scaled_biases(self, compressed: bool) -> Tensor:
        """(2 or 3, 1, H, 1, dh): u, v and (``compressed``) the compressed stream's v, times 1/sqrt(d_h)."""
        biases = [self.u, self.v] + ([self.cv if self.cv is not None else self.v] if compressed else [])
        return (torch.stack(biases) * self.scale)[:, None, :, None, :]

    def keys_values(self, states: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of memory states (B, S, d): (B, H, S, dh) each (a decoder's, projected once per slot)."""
        n = self.n_heads * self.d_head
        k, v = F.linear(states, self.qkv.weight[n:]).split(n, dim=-1)
        return self.heads(k), self.heads(v)

    def forward(
        self,
        x: Tensor,
        memory: Sequence[Tensor] | KeyValueStore,
        tables: Tables,
        mask: KeyMask,
        kernel: Kernel,
    ) -> AttentionOutput:
        """x: (B, T, d) the layer's attention input; memory: its memory states in slot order, as consecutive parts
        (B, S_i, d) (compressed, then regular), whose keys and values are projected in one matmul and joined with the
        segment's in one buffer (keys and values side by side: one concatenation, not one each; no gradient flows
        into the memory rows but bptt's young compressed slots), or a decoder's :class:`KeyValueStore`;
        tables: :meth:`tables`."""
        B, T, _ = x.shape
        n, dt = self.n_heads * self.d_head, compute_dtype(x.device, x.dtype)
        as_dt = lambda t: t if t.dtype == dt else t.to(dt)  # noqa: E731  (autocast's cast, once for both uses)
        w = as_dt(self.qkv.weight)
        qkv = F.linear(as_dt(x), w)  # (B, T, 3 H dh)
        if isinstance(memory, (list, tuple)):
            q, kv_x = qkv.split([n, 2 * n], dim=-1)
            states = torch.cat(memory, dim=1) if len(memory) > 1 else memory[0]  # (B, S, d) [cmem; mem]
            kv = torch.cat([F.linear(as_dt(states), w[n:]), kv_x], dim=1)  # (B, K, 2 H dh): keys and values in one
            k, v = kv.view(B, -1, 2, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, K, dh)
            q = self.heads(q)
        else:
            q, k_x, v_x = qkv.view(B, T, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4).unbind(0)
            k, v = (as_dt(t) for t in memory.extend(k_x, v_x))
        queries = torch.add(as_dt(tables.biases), q, alpha=self.scale).unbind(0)  # (q + u) s, (q + v) s, (q + v_c) s
        compressed = tables.rc is not None
        inputs = AttentionInputs(
            qu=queries[0],
            qv=queries[1],
            qc=queries[2] if compressed else None,
            k=k,
            v=v,
            r=as_dt(tables.r),
            rc=as_dt(tables.rc) if compressed else None,
            mask=mask,
            dropout=self.attn_dropout if self.training else 0.0,
        )
        y, weights = kernel(inputs)
        y = self.out(y.transpose(1, 2).reshape(B, T, -1))
        return AttentionOutput(y=y, weights=weights, q=q, k=k, v=v)
