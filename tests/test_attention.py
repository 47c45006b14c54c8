"""Relative attention against the formula computed one score at a time, and positional invariance."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_config

from compressive_transformer.core.attention import (
    RelativeAttention,
    _shifted_view,
    additive_mask,
    attention_mask,
    attention_scores,
    make_positions,
    sinusoid,
)


def setup(C=3, M=5, T=4, shared=False, same_length=False, seed=0):
    torch.manual_seed(seed)
    cfg = tiny_config(cmem_positions="shared" if shared else "separate", same_length=same_length)
    attn = RelativeAttention(cfg).double()
    for p in attn.parameters():
        torch.nn.init.normal_(p, 0, 0.3)
    d = cfg.d_model
    x, mem, cmem = (torch.randn(1, n, d, dtype=torch.float64) for n in (T, M, C))
    return cfg, attn, x, mem, cmem


def naive_weights(cfg, attn, x, mem, cmem, *, fill, mask_mem=None):
    """score(i, j) = (q_i + u) k_j + (q_i + v) W_r R(dist(i, j)), written out one pair at a time."""
    H, dh = cfg.n_heads, cfg.head_dim
    T, M, C = x.shape[1], mem.shape[1], cmem.shape[1]
    keys = torch.cat([cmem, mem, x], 1)[0]
    q = (x[0] @ attn.w_q.t()).view(T, H, dh)
    k = (keys @ attn.w_k.t()).view(-1, H, dh)
    shared = attn.cpos is None
    out = torch.full((H, T, C + M + T), float("-inf"), dtype=torch.float64)
    for h in range(H):
        for i in range(T):
            for j in range(C + M + T):
                if j < C:  # compressed slot: its own stream (or the shared one, after the occupied memory)
                    dist = i + (C - j) + (fill if shared else 0)
                    w_r, v = (attn.pos, attn.v) if shared else (attn.cpos, attn.cv)
                else:
                    dist = M + i - (j - C)
                    w_r, v = attn.pos, attn.v
                    if dist < 0 or (mask_mem is not None and j - C < M and not mask_mem[j - C]):
                        continue
                r = w_r(sinusoid(torch.tensor([float(dist)]), cfg.d_model).double())[0].view(H, dh)
                s = (q[i, h] + attn.u[h]) @ k[j, h] + (q[i, h] + v[h]) @ r[h]
                out[h, i, j] = s / math.sqrt(dh)
    return torch.softmax(out, -1)


def call(attn, cfg, x, mem, cmem, mem_mask, fill, need_weights=True):
    T, M, C = x.shape[1], mem.shape[1], cmem.shape[1]
    pos = make_positions(
        seg_len=T,
        mem_capacity=M,
        cmem_len=C,
        cmem_offset=fill if attn.cpos is None else 0,
        d_model=cfg.d_model,
        clamp_len=0,
        device="cpu",
        dtype=torch.float64,
    )
    ones = lambda n: torch.ones(1, n, dtype=torch.bool)  # noqa: E731
    window = M if cfg.positions.same_length else 0
    mask = additive_mask(attention_mask(ones(T), mem_mask, ones(C), same_length_window=window), x.dtype)
    out = attn(x, mem, cmem, pos, mask, need_weights=need_weights)
    return out.y, out.weights


@pytest.mark.parametrize("shared", [False, True])
def test_scores_match_the_formula(shared):
    cfg, attn, x, mem, cmem = setup(shared=shared)
    _, w = call(attn, cfg, x, mem, cmem, torch.ones(1, 5, dtype=torch.bool), fill=5)
    torch.testing.assert_close(w[0], naive_weights(cfg, attn, x, mem, cmem, fill=5), rtol=1e-10, atol=1e-12)


def test_partly_filled_memory_matches_the_formula():
    cfg, attn, x, mem, cmem = setup()
    mask = torch.tensor([[False, False, True, True, True]])
    _, w = call(attn, cfg, x, mem, cmem, mask, fill=3)
    torch.testing.assert_close(
        w[0], naive_weights(cfg, attn, x, mem, cmem, fill=3, mask_mem=mask[0]), rtol=1e-10, atol=1e-12
    )


def test_same_distance_same_positional_term_however_full_memory_is():
    """Adding older valid slots must not change how the existing keys compare (log-weight differences)."""
    cfg, attn, x, mem, cmem = setup()
    full = torch.ones(1, 5, dtype=torch.bool)
    part = torch.tensor([[False, False, False, True, True]])
    _, w_full = call(attn, cfg, x, mem, cmem, full, fill=5)
    _, w_part = call(attn, cfg, x, mem, cmem, part, fill=2)
    keys = list(range(3)) + [3 + 3, 3 + 4] + list(range(8, 12))  # cmem, the two common memory slots, segment
    for i in range(4):
        visible = [k for k in keys if k < 8 + i + 1]
        lf, lp = w_full[0, :, i, visible].log(), w_part[0, :, i, visible].log()
        torch.testing.assert_close(lf - lf[:, -1:], lp - lp[:, -1:], rtol=1e-9, atol=1e-9)


def test_fused_kernel_matches_explicit_weights():
    cfg, attn, x, mem, cmem = setup()
    mask = torch.tensor([[False, True, True, True, True]])
    a, _ = call(attn, cfg, x, mem, cmem, mask, fill=4, need_weights=True)
    b, none = call(attn, cfg, x, mem, cmem, mask, fill=4, need_weights=False)
    assert none is None
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_same_length_gives_every_query_the_same_window():
    cfg, attn, x, mem, cmem = setup(same_length=True)
    _, w = call(attn, cfg, x, mem, cmem, torch.ones(1, 5, dtype=torch.bool), fill=5)
    visible = (w[0, 0, :, 3:] > 0).sum(-1)  # over memory + segment
    assert visible.tolist() == [6, 6, 6, 6]  # itself and the 5 (= mem_len) positions before it


def test_clamp_len_caps_the_distance():
    dist = torch.arange(10, -6, -1).float()  # one spare column at distance -1, then on to 16 columns (TABLE_ALIGN)
    pos = make_positions(
        seg_len=3, mem_capacity=8, cmem_len=0, cmem_offset=0, d_model=8, clamp_len=4, device="cpu", dtype=torch.float32
    )
    torch.testing.assert_close(pos.mem, sinusoid(dist.clamp(max=4), 8))


def naive_positional_bias(qv, r, qc, rc, mask, C):
    """bias[b, h, i, j] one entry at a time: the distance of key j from query i picks the column of its table."""
    B, T, H, _ = qv.shape
    K = mask.shape[-1]
    out = torch.empty(B, H, T, K, dtype=qv.dtype)
    for i in range(T):
        for j in range(K):
            q_, r_, col = (qc, rc, j + T - 1 - i) if j < C else (qv, r, (j - C) + T - 1 - i)
            if col >= r_.shape[-1]:  # a future key past the end of the table: masked in every real use
                out[:, :, i, j] = float("-inf")
                continue
            out[:, :, i, j] = torch.einsum("bhd,hd->bh", q_[:, i], r_[:, :, col]) + mask[:, 0, i, j, None]
    return out


@pytest.mark.parametrize("pad", [0, 5])  # tables wider than the keys need (make_positions aligns them)
@pytest.mark.parametrize("B,T,C,M", [(2, 4, 3, 5), (1, 1, 2, 3), (2, 3, 0, 4), (1, 5, 4, 0)])
@pytest.mark.parametrize("content", [False, True])  # the positional bias alone, or the whole scores
def test_scores_are_the_formula_with_an_exact_gradient(B, T, C, M, pad, content):
    torch.manual_seed(0)
    H, dh = 2, 3
    K = C + M + T
    kw = dict(dtype=torch.float64, requires_grad=True)
    qv, qc = torch.randn(B, T, H, dh, **kw), torch.randn(B, T, H, dh, **kw)
    r, rc = torch.randn(H, dh, M + T + 1 + pad, **kw), torch.randn(H, dh, C + T - 1 + pad, **kw)
    qc, rc = (qc, rc) if C > 0 else (None, None)
    # keys as the attention makes them: a (B*H, K, dh) view of a time-major (K, B*H, dh) projection
    qu, k = torch.randn(B * H, T, dh, **kw), torch.randn(K, B * H, dh, **kw)
    content_args = (qu, k.transpose(0, 1)) if content else ()
    allowed = attention_mask(torch.ones(B, T, dtype=torch.bool), torch.rand(B, M) > 0.3, torch.rand(B, C) > 0.3)
    mask = additive_mask(allowed, torch.float64)
    got = attention_scores(qv, r, qc, rc, mask, C, *content_args).view(B, H, T, K)
    want = naive_positional_bias(qv, r, qc, rc, mask, C)
    if content:
        want = want + torch.einsum("btd,kbd->btk", qu, k).view(B, H, T, K)
    torch.testing.assert_close(got[allowed.expand_as(got)], want[allowed.expand_as(want)], rtol=1e-12, atol=1e-12)
    assert torch.isneginf(got[~allowed.expand_as(got)]).all()
    # The gradient through a softmax (every real use) equals autograd's through the naive gather.
    probe = torch.randn(B, H, T, K, dtype=torch.float64)
    inputs = [t for t in (qv, r, qc, rc) + ((qu, k) if content else ()) if t is not None]
    g_got = torch.autograd.grad((torch.softmax(got, -1) * probe).sum(), inputs)
    g_want = torch.autograd.grad((torch.softmax(want, -1) * probe).sum(), inputs)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    zero = torch.zeros_like(mask)  # with nothing masked the function is its own gradcheck

    def scores(*t: torch.Tensor) -> torch.Tensor:
        pos = list(t[:4] if C > 0 else t[:2] + (None, None))
        rest = t[4:] if C > 0 else t[2:]
        return attention_scores(*pos, zero, C, *((rest[0], rest[1].transpose(0, 1)) if content else ()))

    torch.autograd.gradcheck(scores, inputs)
    # without autograd (evaluation) the same values
    with torch.no_grad():
        torch.testing.assert_close(attention_scores(qv, r, qc, rc, mask, C, *content_args).view(B, H, T, K), got)


@pytest.mark.parametrize(
    ("H", "B", "T", "n", "W"),
    [
        (2, 3, 5, 9, 10),
        (2, 3, 5, 9, 13),
        (1, 1, 1, 4, 5),
        (2, 2, 4, 3, 4),
        (3, 2, 6, 6, 16),
        (1, 2, 1, 3, 3),
        (2, 1, 1, 3, 6),
    ],
)
def test_shifted_gradient_writes_every_entry_the_view_does_not(monkeypatch, H, B, T, n, W):
    """The backward zeroes only what the shifted view leaves (not the whole buffer first): every entry of an
    uninitialised buffer is either the view's gradient or zero, as if it had started from zeros."""
    import compressive_transformer.core.attention as attention

    grad = torch.randn(B, H, T, n, dtype=torch.float64)
    expected = torch.zeros(H, B, T, W, dtype=torch.float64)
    _shifted_view(expected, n).copy_(grad)
    monkeypatch.setattr(
        torch.Tensor, "new_empty", lambda self, *shape, dtype=None: torch.full(shape, float("nan"), dtype=dtype)
    )
    got = attention._shifted_gradient(grad, H, W, torch.float64)
    assert torch.equal(got, expected)
