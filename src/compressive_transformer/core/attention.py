"""Relative-position multi-head attention over ``[compressed memory; memory; segment]``.

Scores follow Transformer-XL: ``(q + u)·k`` (content) plus ``(q + v)·W_r R_dist`` (position), with sinusoidal
encodings R of the relative distance. The compressed memory has its own positional stream (its own projection and v
bias, as the authors' code) or, optionally, shares the regular one. Distances come from slot order, so the same
distance gets the same positional term however full memory is.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from compressive_transformer.core.attention_backends import choose_backend, flex_relative_attention, positional_table
from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.dtypes import compute_dtype
from compressive_transformer.core.kv_cache import KVCache, SlotCache, spare_slots
from compressive_transformer.core.stamps import ContentStamp


def sinusoid(distances: Tensor, d_model: int) -> Tensor:
    """Transformer-XL sinusoidal encodings of (float) distances: (L,) -> (L, d_model)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d_model, 2, device=distances.device, dtype=torch.float32) / d_model))
    angles = distances.float()[:, None] * inv_freq[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


@dataclass
class AttentionOutput:
    y: Tensor  # (B, T, d)
    weights: Tensor | None  # (B, H, T, C+M+T) on the explicit path
    q: Tensor  # (B, H, T, dh) the queries (the reconstruction loss reuses them)
    k: Tensor  # (B, H, C+M+T, dh) keys of [cmem; mem; x] (a view; the reconstruction loss reuses the evicted ones)
    v: Tensor  # (B, H, C+M+T, dh) values
    cache: KVCache | None  # inference: keys | values per head of [cmem] and of [mem; x]; None with grads


@dataclass(frozen=True)
class Positions:
    """Sinusoids shared by all layers of one forward (each layer projects them with its own W_r)."""

    mem: Tensor  # (>= cap + T + 1, d): distances cap+T-1, cap+T-2, ... down to -1 or lower, for memory + segment keys
    cmem: Tensor  # (>= C + T - 1, d): distances offset+C+T-1, ... down to offset+1 or lower, for compressed keys
    key: tuple[int, ...] = ()  # identifies the tables (their distance ranges), for the inference-time cache


# Positional tables get a multiple of 8 columns, so the (H, B*T, dh) x (H, dh, W) positional matmul writes rows whose
# length the BLAS kernels tile without a ragged edge (odd widths such as 255 or 385 are markedly slower with MKL).
TABLE_ALIGN = 8


@functools.lru_cache(maxsize=64)
def _encodings(hi: int, lo: int, clamp_len: int, d_model: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """Encodings of distances hi, hi-1, ..., lo (constants, so each table is built once per shape)."""
    dist = torch.arange(hi, lo - 1, -1, device=device, dtype=torch.float32)  # descending
    if clamp_len > 0:
        dist = dist.clamp(max=clamp_len)
    return sinusoid(dist, d_model).to(dtype)


def make_positions(
    *, seg_len: int, mem_capacity: int, cmem_len: int, cmem_offset: int, d_model: int, clamp_len: int, device, dtype
) -> Positions:
    def enc(hi: int, lo: int) -> Tensor:
        return _encodings(hi, lo, clamp_len, d_model, torch.device(device), dtype)

    def aligned(hi: int, lo: int) -> Tensor:  # down to lo or further, a multiple of TABLE_ALIGN distances in all
        return enc(hi, hi + 1 - -(-(hi + 1 - lo) // TABLE_ALIGN) * TABLE_ALIGN)

    T = seg_len
    # One spare column (distance -1, always a masked future key) keeps the shifted view free of overlaps; the
    # columns past it are read only at blocked keys, if at all.
    mem = aligned(mem_capacity + T - 1, -1)
    cmem = aligned(cmem_offset + cmem_len + T - 1, cmem_offset + 1) if cmem_len > 0 else mem.new_zeros(0, d_model)
    return Positions(mem=mem, cmem=cmem, key=(mem_capacity, T, cmem_len, cmem_offset, clamp_len))


def attention_mask(x_mask: Tensor, mem_mask: Tensor, cmem_mask: Tensor, *, same_length_window: int = 0) -> Tensor:
    """Which keys of ``[cmem; mem; segment]`` each query may read: (B, 1, T, C+M+T) bool.

    Valid slots, no future key, and always the query itself (so a padded row is never empty). With
    ``same_length_window`` > 0 every query sees only that many previous positions of memory + segment.
    """
    B, T = x_mask.shape
    M = mem_mask.shape[1]
    i = torch.arange(T, device=x_mask.device)[:, None]
    j = torch.arange(M + T, device=x_mask.device)[None, :]
    dist = M + i - j  # (T, M+T) distance from query i to key j
    causal = dist >= 0
    if same_length_window > 0:
        causal = causal & (dist <= same_length_window)
    keys = torch.cat([mem_mask, x_mask], dim=1)  # (B, M+T)
    allowed = (keys[:, None, :] & causal) | (dist == 0)  # (B, T, M+T)
    if cmem_mask.shape[1] > 0:
        allowed = torch.cat([cmem_mask[:, None, :].expand(B, T, -1), allowed], dim=-1)
    return allowed.unsqueeze(1)


def additive_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """0 where a key may be read, -inf elsewhere: adding it is several times faster on CPU than a boolean fill."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def attention_backend(
    cfg: ModelConfig, device: torch.device, dtype: torch.dtype, *, need_weights: bool, training: bool
) -> str:
    """The backend (:mod:`~.attention_backends`) that runs this forward: ``cfg.attn_impl`` resolved for the device,
    the phase (gradients recorded or not), the compute dtype and whether attention weights are read."""
    grad = torch.is_grad_enabled()
    return choose_backend(
        cfg.attn_impl,
        device=device,
        grad=grad,
        dtype=compute_dtype(device, dtype),
        need_weights=need_weights or cfg.needs_attention_weights,
        dropout=cfg.attn_dropout if training else 0.0,
    )


def _shifted_view(raw: Tensor, n_keys: int) -> Tensor:
    """out[b, h, i, j] = raw[h, b, i, j + T - 1 - i] as a strided view of raw (H, B, T, W), no copy.

    Column m of raw holds distance (W - 1 - m) + const, so the view puts distance (i - j) + const at (i, j). Needs
    W - 1 >= n_keys (or T = 1) so that no two outputs share an element; entries that read past the end of a row are
    future keys, which the mask blocks.
    """
    H, B, T, W = raw.shape
    assert raw.is_contiguous() and (W - 1 >= n_keys or T == 1)
    return raw.as_strided((B, H, T, n_keys), (T * W, B * T * W, W - 1, 1), raw.storage_offset() + T - 1)


def _shifted_gradient(grad: Tensor, H: int, W: int, dtype: torch.dtype) -> Tensor:
    """The gradient of ``raw`` (H, B, T, W) from that of its shifted view (B, H, T, n): the view's entries, zero
    elsewhere. In each (h, b) plane the view's row i covers offsets [T - 1 + i (W - 1), ... + n); what it leaves are
    the first T - 1 offsets, a gap of W - 1 - n after each row and the last offset, so only those are zeroed rather
    than the whole buffer first (W - 1 - n is small: the tables' spare columns)."""
    B, _, T, n = grad.shape
    g_raw = grad.new_empty(H, B, T, W, dtype=dtype)
    _shifted_view(g_raw, n).copy_(grad)
    if W - 1 < n:  # T = 1 and W = n: the view is the whole buffer
        return g_raw
    planes = g_raw.view(H * B, T * W)
    planes[:, : T - 1].zero_()
    planes[:, -1:].zero_()
    if W - 1 > n:
        g_raw.as_strided((H * B, T, W - 1 - n), (T * W, W - 1, 1), g_raw.storage_offset() + T - 1 + n).zero_()
    return g_raw


class _Scores(torch.autograd.Function):
    """The attention scores before the softmax, written once into a (B * H, T, K) buffer: the positional term of every
    score plus the additive mask and, given queries ``qu`` and keys ``k``, the content term.

    scores[..., :C] = shift((q + v_c) W_rc R_c) and scores[..., C:] = shift((q + v) W_r R), plus ``mask`` (0 or -inf),
    plus (q + u) k^T. Composing this from autograd ops cost more than the matmuls on CPU (slice copies, a masked fill
    and their backward passes over (B, H, T, K)); here the forward is one matmul and one add per stream and one
    accumulating matmul, the backward one zeroed buffer, one strided copy and two matmuls per stream and two for the
    content. The keys' gradient is computed as grad^T (q + u), in the keys' own (B * H, K, dh) layout: autograd's
    (q + u)^T grad is its transpose, which cost a transposing copy as long as the matmul. The incoming gradient is
    used as is at blocked keys: after a softmax (or SDPA) it is exactly zero there.
    """

    @staticmethod
    def forward(ctx, qv, r, qc, rc, mask, C: int, qu, k) -> Tensor:  # type: ignore[override]
        out, qh, qch, ctx.dtype = _positional_bias(qv, r, qc, rc, mask, C)
        if qu is not None:
            qu, k = qu.to(out.dtype), k.to(out.dtype)
            out.baddbmm_(qu, k.transpose(1, 2))
        ctx.save_for_backward(qh, r, qch, rc, qu, k)
        ctx.C = C
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        qh, r, qch, rc, qu, k = ctx.saved_tensors
        H, (BH, T, K), C = r.shape[0], grad.shape, ctx.C
        B = BH // H
        grads = []
        for qh_, r_, cols in ((qh, r, slice(C, K)), (qch, rc, slice(0, C))):
            if qh_ is None:  # no compressed memory
                grads += [None, None]
                continue
            W, dt = r_.shape[-1], ctx.dtype
            g_raw = _shifted_gradient(grad.view(B, H, T, K)[..., cols], H, W, dt)
            g_raw, qh_, r_ = g_raw.view(H, B * T, W), qh_.to(dt), r_.to(dt)
            g_q = torch.bmm(g_raw, r_.transpose(1, 2)).view(H, B, T, -1).permute(1, 2, 0, 3)  # (B, T, H, dh)
            g_r = torch.bmm(qh_.transpose(1, 2), g_raw)  # (H, dh, W)
            grads += [g_q, g_r]
        g_qu = g_k = None
        if qu is not None:
            grad = grad.to(qu.dtype)
            g_qu = torch.bmm(grad, k)  # (B*H, T, dh)
            g_k = torch.bmm(grad.transpose(1, 2), qu)  # (B*H, K, dh)
        return grads[0], grads[1], grads[2], grads[3], None, None, g_qu, g_k


def _positional_bias(qv: Tensor, r: Tensor, qc: Tensor | None, rc: Tensor | None, mask: Tensor, C: int):
    """The positional part of :class:`_Scores`' forward: the bias, the head-major queries the backward needs, the
    matmuls' dtype (under autocast, the backward runs its matmuls in it too)."""
    B, T, H, dh = qv.shape
    K = mask.shape[-1]
    out = qv.new_empty(B * H, T, K)  # 3-D so the content matmul can accumulate into it (baddbmm_) in place
    bias = out.view(B, H, T, K)
    saved, dtype = [], out.dtype
    for q_, r_, cols, n in ((qv, r, slice(C, K), K - C), (qc, rc, slice(0, C), C)):
        if n == 0:
            saved.append(None)
            continue
        qh, raw = positional_table(q_, r_)  # (H, B, T, W) one column per distance
        torch.add(_shifted_view(raw, n), mask[..., cols], out=bias[..., cols])
        saved.append(qh)
        dtype = raw.dtype
        del raw  # before the next stream's matmul: lower peak memory
    return out, saved[0], saved[1], dtype


def attention_scores(
    qv: Tensor,
    r: Tensor,
    qc: Tensor | None,
    rc: Tensor | None,
    mask: Tensor,
    C: int,
    qu: Tensor | None = None,
    k: Tensor | None = None,
) -> Tensor:
    """(B * H, T, C+M+T) scores of ``[cmem; mem; segment]``: positional terms plus the additive ``mask`` and, given
    ``qu`` (B * H, T, dh) and ``k`` (B * H, K, dh), the content term; see :class:`_Scores` (qv/qc: (B, T, H, dh),
    r: (H, dh, >= M+T+1), rc: (H, dh, >= C+T-1) or None when C = 0; tables may have more columns than the keys need,
    see :func:`make_positions`). Without gradients (evaluation, generation) the autograd function's overhead is
    skipped."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (qv, r, qc, rc, qu, k)):
        return _Scores.apply(qv, r, qc, rc, mask, C, qu, k)
    out = _positional_bias(qv, r, qc, rc, mask, C)[0]
    if qu is None:
        return out
    kt = k.transpose(1, 2)
    # in place where the dtypes agree (keys from an fp32 cache under autocast do not)
    return out.baddbmm_(qu, kt) if out.dtype == qu.dtype == k.dtype else torch.baddbmm(out, qu, kt)


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
        # Inference only: W_r R for the position tables already seen, keyed on the projection's content stamp (so a
        # weight written by any means, a fused optimizer step included, can never be served an older projection).
        self._projected: dict[tuple, Tensor] = {}
        self._stamps = {"pos": ContentStamp(), "cpos": ContentStamp(), "kv": ContentStamp()}

    def _project_positions(self, proj: nn.Linear, stream: str, table: Tensor, key: tuple) -> Tensor:
        """W_r R as (H, dh, L). At inference the projection of a table is reused while the weight holds the same
        values (:class:`~.stamps.ContentStamp`), so a generated token does not re-project every distance."""
        H, dh = self.n_heads, self.d_head
        if self.training or torch.is_grad_enabled():
            return proj(table).view(-1, H, dh).permute(1, 2, 0)
        w, device = proj.weight, proj.weight.device.type
        amp = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None  # the product's dtype
        full_key = (id(proj), self._stamps[stream].current(w), table.dtype, amp) + key
        if full_key not in self._projected:
            if len(self._projected) >= 16:
                self._projected.clear()
            self._projected[full_key] = proj(table).view(-1, H, dh).permute(1, 2, 0).contiguous()
        return self._projected[full_key]

    def positional_streams(self, positions: Positions) -> tuple[Tensor, Tensor | None, Tensor]:
        """W_r R of memory + segment (H, dh, M+T+1); W_rc R_c of the compressed memory (H, dh, C+T-1), None without
        one; and the compressed stream's position bias (H, dh)."""
        r = self._project_positions(self.pos, "pos", positions.mem, ("mem",) + positions.key)
        cpos, stream, cv = (self.cpos, "cpos", self.cv) if self.cpos is not None else (self.pos, "pos", self.v)
        if positions.cmem.shape[0] == 0:
            return r, None, cv
        return r, self._project_positions(cpos, stream, positions.cmem, ("cmem",) + positions.key), cv

    @property
    def w_k(self) -> Tensor:
        n = self.n_heads * self.d_head
        return self.qkv.weight[n : 2 * n]

    @property
    def w_v(self) -> Tensor:
        return self.qkv.weight[2 * self.n_heads * self.d_head :]

    def project_kv(self, states: Tensor) -> Tensor:
        """Keys and values of memory states, (B, S, d) -> (B, H, S, 2 dh) (each head's key, then its value): what a
        memory's key/value cache holds. Head-major rows let the attention read keys and values as strided views."""
        B, S, _ = states.shape
        H, dh = self.n_heads, self.d_head
        return self.kv_heads(F.linear(states, self.qkv.weight[H * dh :])).reshape(B, H, S, 2 * dh)

    def kv_heads(self, kv: Tensor) -> Tensor:
        """(B, S, 2 H dh) projected keys then values -> (B, H, S, 2, dh) view: the cache's per-head layout."""
        B, S, _ = kv.shape
        return kv.view(B, S, 2, self.n_heads, self.d_head).permute(0, 3, 1, 2, 4)

    @property
    def kv_version(self) -> int:
        """The content stamp of the key/value weights: a memory's cached keys and values are used only while it is
        unchanged, however the weights were written (:class:`~.stamps.ContentStamp`)."""
        return self._stamps["kv"].current(self.qkv.weight[self.n_heads * self.d_head :])

    @property
    def w_q(self) -> Tensor:
        return self.qkv.weight[: self.n_heads * self.d_head]

    def forward(
        self,
        x: Tensor,
        mem: Tensor,
        cmem: Tensor,
        positions: Positions,
        mask: Tensor,
        *,
        need_weights: bool,
        kv_cache: KVCache | None = None,
        backend: str = "sdpa-bias",
    ) -> AttentionOutput:
        """x: (B, T, d) queries' inputs; mem: (B, M, d); cmem: (B, C, d); mask: (B, 1, T, C+M+T) additive, -inf
        where a query may not read a key (:func:`additive_mask`); kv_cache: keys and values of ``[cmem]`` and ``[mem]``
        from earlier steps (a valid cache of the current weights), or None to project them; need_weights: take the
        explicit path, which returns the weights; else ``backend`` (:mod:`~.attention_backends`) runs it."""
        B, T, d = x.shape
        M, C, H, dh = mem.shape[1], cmem.shape[1], self.n_heads, self.d_head
        n, K = H * dh, C + M + T
        cache = None
        if kv_cache is not None or not torch.is_grad_enabled():  # inference: the layout the cache keeps
            q = F.linear(x, self.w_q).view(B, T, H, dh)
            cache = self._extend_cache(x, mem, cmem, kv_cache)
            kv = torch.cat([cache.cmem.kv, cache.mem.kv], dim=2) if C > 0 else cache.mem.kv  # (B, H, K, 2 dh)
            k, v = kv.reshape(B * H, K, 2 * dh).split(dh, dim=-1)  # strided views, (B*H, K, dh) each
        else:
            q, k, v = self._project(x, cmem, mem)

        # Positional scores, scaled, plus the mask: the additive bias of the content scores.
        # Each biased, scaled query in one pass over q: (q + b) * s as b * s + s * q (the decoder's formula too).
        # Everything stays in the queries' dtype (bf16 under autocast): an fp32 bias or mask beside bf16 products would
        # promote the (B, H, T, K) buffers to fp32 and convert them back and forth, forward and backward.
        r, rc, cv = self.positional_streams(positions)
        s, dt = self.scale, q.dtype
        mask = mask.to(dt)  # no copy when the model made it in the compute dtype (:func:`compute_dtype`)
        qc = torch.add((cv * s).to(dt), q, alpha=s) if rc is not None else None
        qv = torch.add((self.v * s).to(dt), q, alpha=s)
        qu = torch.add((self.u * s).to(dt), q, alpha=s).transpose(1, 2)  # (B, H, T, dh)
        if need_weights:
            scores = attention_scores(qv, r, qc, rc, mask, C, qu.reshape(B * H, T, dh), k).view(B, H, T, K)
            # Without autograd the softmax overwrites the scores: no second (B, H, T, K) buffer.
            weights = torch.softmax(scores, dim=-1, out=None if torch.is_grad_enabled() else scores)
            del scores
            dropped = (
                F.dropout(weights, self.attn_dropout, True) if self.training and self.attn_dropout > 0 else weights
            )
            y = torch.bmm(dropped.view(B * H, T, K), v)  # (B*H, T, dh)
        elif backend == "flex":
            weights = None
            y = flex_relative_attention(qu, k.view(B, H, K, dh), v.view(B, H, K, dh), qv, r, qc, rc, mask, C)
        else:
            weights = None
            bias = attention_scores(qv, r, qc, rc, mask, C)  # (B * H, T, K)
            y = F.scaled_dot_product_attention(
                qu,
                k.view(B, H, K, dh),
                v.view(B, H, K, dh),
                attn_mask=bias.view(B, H, T, K),
                dropout_p=self.attn_dropout if self.training else 0.0,
                scale=1.0,
            )
        y = self.out(y.reshape(B, H, T, dh).transpose(1, 2).reshape(B, T, n))
        return AttentionOutput(
            y=y, weights=weights, q=q.transpose(1, 2), k=k.view(B, H, K, dh), v=v.view(B, H, K, dh), cache=cache
        )

    def _extend_cache(self, x: Tensor, mem: Tensor, cmem: Tensor, kv_cache: KVCache | None) -> KVCache:
        """Keys | values of ``[cmem]`` and of ``[mem; x]``: only x is projected when the memory's are cached, and
        written after them in their buffer (:meth:`SlotCache.extend`)."""
        T = x.shape[1]
        if kv_cache is None:
            return KVCache(
                cmem=SlotCache.of(self.project_kv(cmem), room=0),
                mem=SlotCache.of(self.project_kv(torch.cat([mem, x], dim=1)), room=spare_slots(T, mem.shape[1])),
                version=self.kv_version,
            )
        return KVCache(cmem=kv_cache.cmem, mem=kv_cache.mem.extend(self.project_kv(x)), version=kv_cache.version)

    def _project(self, x: Tensor, cmem: Tensor, mem: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Training: queries (B, T, H, dh) and the keys and values of ``[cmem; mem; x]``, head-major (B*H, K, dh).

        The weight is cast to the compute dtype once per call: under autocast every slice of it would be cast again
        at each use (a copy forward and another backward). x's queries, keys and values are one matmul. Keys and
        values come out of one concatenation straight into the head-major layout the batched matmuls read without a
        copy (oneDNN's bf16 kernels read a time-major view or its transpose ~4x slower). The memories are detached
        (apart from BPTT's recomputed slots), so they are projected apart from x and get no input gradient.
        """
        B, T, _ = x.shape
        H, dh = self.n_heads, self.d_head
        n = H * dh
        w = self.qkv.weight.to(compute_dtype(x.device, x.dtype))
        qkv = F.linear(x, w).view(B, T, 3, H, dh)
        parts = [F.linear(m, w[n:]).view(B, -1, 2, H, dh) for m in (cmem, mem) if m.shape[1] > 0] + [qkv[:, :, 1:]]
        # one concatenation each (their backward passes are views; one for both would stack or zero-fill gradients)
        k, v = (torch.cat([p[:, :, i].transpose(1, 2) for p in parts], dim=2) for i in (0, 1))  # (B, H, K, dh)
        K = k.shape[2]
        return qkv[:, :, 0], k.view(B * H, K, dh), v.view(B * H, K, dh)
