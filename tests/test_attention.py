"""Relative attention against the formula computed one score at a time, positional invariance, and the kernels
(the reference's tensor code, the CPU kernel's strided scores and SDPA with a bias) against each other."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_config
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer.core.attention import (
    AttentionInputs,
    RelativeAttention,
    key_mask,
    make_positions,
    rel_shift,
    relative_attention,
    sinusoid,
)
from compressive_transformer.core.kernels import KERNELS
from compressive_transformer.core.kernels.explicit import _shifted_gradient, _shifted_view, explicit_attention, scores


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


def call(attn, cfg, x, mem, cmem, mem_mask, fill, kernel="explicit"):
    T, M, C = x.shape[1], mem.shape[1], cmem.shape[1]
    pos = make_positions(
        seg_len=T,
        mem_capacity=M,
        cmem_len=C,
        cmem_offset=fill if attn.cpos is None else 0,
        d_model=cfg.d_model,
        clamp_len=0,
        device="cpu",
        dtype=x.dtype,
    )
    ones = lambda n: torch.ones(1, n, dtype=torch.bool)  # noqa: E731
    window = M if cfg.positions.same_length else 0
    spec = KERNELS[kernel]
    mask = spec.prepare(key_mask(ones(T), mem_mask, ones(C), window=window), T, x.dtype)
    out = attn(x, [cmem, mem], attn.tables(pos), mask, spec.run)
    return out.y, out.weights


@pytest.mark.parametrize("kernel", ["reference", "explicit"])
@pytest.mark.parametrize("shared", [False, True])
def test_scores_match_the_formula(shared, kernel):
    cfg, attn, x, mem, cmem = setup(shared=shared)
    _, w = call(attn, cfg, x, mem, cmem, torch.ones(1, 5, dtype=torch.bool), fill=5, kernel=kernel)
    torch.testing.assert_close(w[0], naive_weights(cfg, attn, x, mem, cmem, fill=5), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kernel", ["reference", "explicit"])
def test_partly_filled_memory_matches_the_formula(kernel):
    cfg, attn, x, mem, cmem = setup()
    mask = torch.tensor([[False, False, True, True, True]])
    _, w = call(attn, cfg, x, mem, cmem, mask, fill=3, kernel=kernel)
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


@pytest.mark.parametrize("kernel", ["explicit", "sdpa-bias"])
def test_every_kernel_gives_the_references_output(kernel):
    cfg, attn, x, mem, cmem = setup()
    tol = 1e-10
    mask = torch.tensor([[False, True, True, True, True]])
    with torch.no_grad():
        a, _ = call(attn, cfg, x, mem, cmem, mask, fill=4, kernel="reference")
        b, w = call(attn, cfg, x, mem, cmem, mask, fill=4, kernel=kernel)
    assert (w is None) == (not KERNELS[kernel].weights)
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


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


def naive_scores(a: AttentionInputs) -> torch.Tensor:
    """Every score one entry at a time: the distance of key j from query i picks the row of its table."""
    B, H, T, _ = a.qu.shape
    K, C = a.k.shape[2], a.mask.n_cmem
    allowed = a.mask.allowed(T)
    out = torch.full((B, H, T, K), float("-inf"), dtype=a.qu.dtype)
    for i in range(T):
        for j in range(K):
            q_, r_, row = (a.qc, a.rc, j + T - 1 - i) if j < C else (a.qv, a.r, (j - C) + T - 1 - i)
            for b in range(B):
                if allowed[b, 0, i, j]:
                    pos = torch.einsum("hd,hd->h", q_[b, :, i], r_[:, row])
                    out[b, :, i, j] = torch.einsum("hd,hd->h", a.qu[b, :, i], a.k[b, :, j]) + pos
    return out


def random_inputs(B, T, C, M, pad, window=0, seed=0) -> AttentionInputs:
    torch.manual_seed(seed)
    H, dh = 2, 3
    K = C + M + T
    kw = dict(dtype=torch.float64, requires_grad=True)
    mask = key_mask(torch.ones(B, T, dtype=torch.bool), torch.rand(B, M) > 0.3, torch.rand(B, C) > 0.3, window=window)
    return AttentionInputs(
        qu=torch.randn(B, H, T, dh, **kw),
        qv=torch.randn(B, H, T, dh, **kw),
        qc=torch.randn(B, H, T, dh, **kw) if C > 0 else None,
        k=torch.randn(B, H, K, dh, **kw),
        v=torch.randn(B, H, K, dh, **kw),
        r=torch.randn(H, M + T + 1 + pad, dh, **kw),
        rc=torch.randn(H, C + T + pad, dh, **kw) if C > 0 else None,
        mask=mask.with_dense(T, torch.float64),
    )


def leaves(a: AttentionInputs) -> list[torch.Tensor]:
    return [t for t in (a.qu, a.qv, a.qc, a.k, a.v, a.r, a.rc) if t is not None]


@pytest.mark.parametrize("pad", [0, 5])  # tables longer than the keys need (make_positions aligns them)
@pytest.mark.parametrize("B,T,C,M", [(2, 4, 3, 5), (1, 1, 2, 3), (2, 3, 0, 4), (1, 5, 4, 0)])
@pytest.mark.parametrize("window", [0, 3])
def test_both_weight_kernels_are_the_formula_with_exact_gradients(B, T, C, M, pad, window):
    a = random_inputs(B, T, C, M, pad, window)
    want = naive_scores(a)
    got = scores(a)  # the explicit kernel's strided scores
    allowed = a.mask.allowed(T).expand_as(got)
    torch.testing.assert_close(got[allowed], want[allowed], rtol=1e-12, atol=1e-12)
    assert torch.isneginf(got[~allowed]).all()
    y_want = torch.softmax(want, -1) @ a.v
    probe = torch.randn_like(y_want)
    g_want = torch.autograd.grad((y_want * probe).sum(), leaves(a))
    for name in ("reference", "explicit"):
        y, weights = KERNELS[name].run(a)
        torch.testing.assert_close(y, y_want, rtol=1e-10, atol=1e-12, msg=name)
        torch.testing.assert_close(weights, torch.softmax(want, -1), rtol=1e-10, atol=1e-12, msg=name)
        g_got = torch.autograd.grad((y * probe).sum(), leaves(a))
        for x, y_ in zip(g_got, g_want):
            torch.testing.assert_close(x, y_, rtol=1e-10, atol=1e-12, msg=name)
    with torch.no_grad():  # without autograd (evaluation) the same values
        torch.testing.assert_close(explicit_attention(a)[0], y_want, rtol=1e-10, atol=1e-12)


def test_the_reference_passes_gradcheck():
    a = random_inputs(2, 3, 2, 3, 1)

    def y(*t: torch.Tensor) -> torch.Tensor:
        qu, qv, qc, k, v, r, rc = t
        return relative_attention(AttentionInputs(qu, qv, qc, k, v, r, rc, a.mask))[0]

    torch.autograd.gradcheck(y, leaves(a))


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 7), extra=st.integers(1, 6), n=st.integers(1, 9))
def test_rel_shift_puts_each_keys_distance_in_its_column(T, extra, n):
    """out[i, j] = x[i, j - i + T - 1] wherever that row exists (elsewhere a future key, masked in every use)."""
    L = n + extra
    x = torch.randn(2, T, L)
    out = rel_shift(x, n)
    assert out.shape == (2, T, n)
    for i in range(T):
        for j in range(n):
            if j - i + T - 1 < L:
                assert torch.equal(out[:, i, j], x[:, i, j - i + T - 1])


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
    grad = torch.randn(B, H, T, n, dtype=torch.float64)
    expected = torch.zeros(H, B, T, W, dtype=torch.float64)
    _shifted_view(expected, n).copy_(grad)
    monkeypatch.setattr(
        torch.Tensor, "new_empty", lambda self, *shape, dtype=None: torch.full(shape, float("nan"), dtype=dtype)
    )
    got = _shifted_gradient(grad, H, W, torch.float64)
    assert torch.equal(got, expected)
