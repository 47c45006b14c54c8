"""The ``explicit`` kernel: the reference's scores written into one (B, H, T, K) buffer by a hand-written autograd
function, then an explicit softmax. Same function and outputs (weights included) as
:func:`~compressive_transformer.core.attention.relative_attention`, built for the CPU in eager mode, where composing
the scores from autograd ops cost more than the matmuls (slice copies, a masked fill and their backward passes over
(B, H, T, K)). It reads the positional tables through a strided view, which ``torch.compile`` cannot trace: compiled
models use the reference instead (:mod:`~compressive_transformer.core.kernels`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from compressive_transformer.core.attention import AttentionInputs


def _shifted_view(raw: Tensor, n_keys: int) -> Tensor:
    """out[b, h, i, j] = raw[h, b, i, j + T - 1 - i] as a strided view of raw (H, B, T, W), no copy: the rel_shift of
    the reference. Needs W - 1 >= n_keys (or T = 1) so that no two outputs share an element; entries that read past
    the end of a row are future keys, which the mask blocks."""
    H, B, T, W = raw.shape
    assert raw.is_contiguous() and (W - 1 >= n_keys or T == 1)
    return raw.as_strided((B, H, T, n_keys), (T * W, B * T * W, W - 1, 1), raw.storage_offset() + T - 1)


def _shifted_gradient(grad: Tensor, H: int, W: int, dtype: torch.dtype) -> Tensor:
    """The gradient of ``raw`` (H, B, T, W) from that of its shifted view (B, H, T, n): the view's entries, zero
    elsewhere. In each (h, b) plane the view's row i covers offsets [T - 1 + i (W - 1), ... + n); what it leaves are
    the first T - 1 offsets, a gap of W - 1 - n after each row and the last offset, so only those are zeroed rather
    than the whole buffer first (W - 1 - n is small: the tables' spare rows)."""
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


def _table(q: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    """q (B, H, T, dh), r (H, L, dh) -> the head-major queries (H, B * T, dh) and q·r for every row (H, B, T, L)."""
    B, H, T, dh = q.shape
    qh = q.transpose(0, 1).reshape(H, B * T, dh)
    return qh, torch.bmm(qh, r.transpose(1, 2)).view(H, B, T, -1)


def _positional_bias(qv: Tensor, r: Tensor, qc: Tensor | None, rc: Tensor | None, mask: Tensor, C: int):
    """The positional scores plus the additive mask in a new (B * H, T, K) buffer; with the head-major queries the
    backward needs and the matmuls' dtype (under autocast, the backward runs its matmuls in it too)."""
    B, H, T, _ = qv.shape
    K = mask.shape[-1]
    out = qv.new_empty(B * H, T, K)  # 3-D so the content matmul can accumulate into it (baddbmm_) in place
    bias = out.view(B, H, T, K)
    saved, dtype = [], out.dtype
    for q_, r_, cols, n in ((qv, r, slice(C, K), K - C), (qc, rc, slice(0, C), C)):
        if n == 0:
            saved.append(None)
            continue
        qh, raw = _table(q_, r_)
        torch.add(_shifted_view(raw, n), mask[..., cols], out=bias[..., cols])
        saved.append(qh)
        dtype = raw.dtype
        del raw  # before the next stream's matmul: lower peak memory
    return out, saved[0], saved[1], dtype


class _Scores(torch.autograd.Function):
    """scores = shift(qv·r) | shift(qc·rc) + mask + qu·k^T, into one (B * H, T, K) buffer. The forward is one matmul
    and one add per stream and one accumulating matmul; the backward one strided copy and two matmuls per stream and
    two for the content, the keys' gradient as grad^T qu in the keys' own (B * H, K, dh) layout (autograd's transpose
    of it cost a copy as long as the matmul). The incoming gradient is used as is at blocked keys: after a softmax it
    is exactly zero there."""

    @staticmethod
    def forward(ctx, qv, r, qc, rc, mask, C: int, qu, k) -> Tensor:  # type: ignore[override]
        out, qh, qch, ctx.dtype = _positional_bias(qv, r, qc, rc, mask, C)
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
            W, dt = r_.shape[1], ctx.dtype
            g_raw = _shifted_gradient(grad.view(B, H, T, K)[..., cols], H, W, dt).view(H, B * T, W)
            qh_, r_ = qh_.to(dt), r_.to(dt)
            g_q = torch.bmm(g_raw, r_).view(H, B, T, -1).transpose(0, 1)  # (B, H, T, dh)
            g_r = torch.bmm(g_raw.transpose(1, 2), qh_)  # (H, W, dh)
            grads += [g_q, g_r]
        grad = grad.to(qu.dtype)
        g_qu = torch.bmm(grad, k)  # (B*H, T, dh)
        g_k = torch.bmm(grad.transpose(1, 2), qu)  # (B*H, K, dh)
        return grads[0], grads[1], grads[2], grads[3], None, None, g_qu, g_k


def scores(a: AttentionInputs) -> Tensor:
    """(B, H, T, K) masked scores of the reference (positional + content + mask)."""
    B, H, T, dh = a.qu.shape
    K, C, mask = a.k.shape[2], a.mask.n_cmem, a.mask.dense
    qu, k = a.qu.reshape(B * H, T, dh), a.k.reshape(B * H, K, dh)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (a.qv, a.r, a.qc, a.rc, qu, k)):
        return _Scores.apply(a.qv, a.r, a.qc, a.rc, mask, C, qu, k).view(B, H, T, K)
    out = _positional_bias(a.qv, a.r, a.qc, a.rc, mask, C)[0]  # without gradients: no autograd function's overhead
    kt = k.transpose(1, 2)
    # in place where the dtypes agree (keys from an fp32 copy under autocast do not)
    out = out.baddbmm_(qu, kt) if out.dtype == qu.dtype == k.dtype else torch.baddbmm(out, qu, kt)
    return out.view(B, H, T, K)


def one_query_scores(a: AttentionInputs) -> Tensor:
    """:func:`scores` for one query (T = 1, a decoding step): key j of a stream reads row j of its table, no shift,
    so the scores are two small matmuls and one accumulating one, in plain tensor code."""
    B, H, _, dh = a.qu.shape
    K, C = a.k.shape[2], a.mask.n_cmem
    position = torch.matmul(a.qv, a.r[:, : K - C].transpose(1, 2))  # (B, H, 1, M + 1)
    if C > 0:
        position = torch.cat([torch.matmul(a.qc, a.rc[:, :C].transpose(1, 2)), position], dim=-1)
    bias = (position + a.mask.dense).view(B * H, 1, K)
    return torch.baddbmm(bias, a.qu.reshape(B * H, 1, dh), a.k.reshape(B * H, K, dh).transpose(1, 2)).view(B, H, 1, K)


def explicit_attention(a: AttentionInputs) -> tuple[Tensor, Tensor]:
    """The reference's output and weights, from :func:`scores`; without autograd the softmax overwrites the scores
    (no second (B, H, T, K) buffer)."""
    B, H, T, dh = a.qu.shape
    K = a.k.shape[2]
    s = one_query_scores(a) if T == 1 else scores(a)
    weights = torch.softmax(s, dim=-1, out=None if torch.is_grad_enabled() else s)
    dropped = F.dropout(weights, a.dropout) if a.dropout > 0 else weights
    y = torch.bmm(dropped.view(B * H, T, K), a.v.reshape(B * H, K, dh).to(dropped.dtype))
    return y.view(B, H, T, dh), weights
