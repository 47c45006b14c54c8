"""The forward kernel of the fused relative attention: one program per (query block, b, h), an online softmax over
the compressed stream's key blocks, then the memory + segment stream's (the window's edge, the blocks every query
reads whole, the diagonal), each tile's positional scores from one new band chunk and the ones carried over."""

from compressive_transformer.core.kernels.fused_triton_tiles import (
    chunk_index,
    dense,
    first_chunks,
    interior,
    key_tile,
    memory_blocks,
    online_softmax,
    query_program,
    query_rows,
    store_rows,
    tl,
    triton,
)


@triton.jit
def _attend(
    m_i, l_i, acc, band, qu, qp, idx, kp, sk_t, vp, sv_t, tab, st_t, n_rows, kb, key0, n_keys, lo, hi, i0,
    T, M, win, dh, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
    PREC: tl.constexpr, MASK: tl.constexpr, EDGE: tl.constexpr,
):  # fmt: skip
    """Online softmax of a query block over one stream's key blocks lo..hi (base-2 running max m_i and sum l_i)."""
    for n0 in range(lo, hi, BLOCK_N):
        _, v, s, band = key_tile(
            band, qu, qp, idx, kp, sk_t, vp, sv_t, tab, st_t, n_rows, kb, key0, n_keys, n0, i0, T, M, win, dh,
            BLOCK_M, BLOCK_N, D, R, PREC, MASK, EDGE,
        )  # fmt: skip
        m_i, l_i, acc = online_softmax(m_i, l_i, acc, s, v, PREC)
    return m_i, l_i, acc, band


@triton.jit
def _attend_stream(
    m_i, l_i, acc, qu, qp, kp, sk_t, vp, sv_t, tab, st_t, n_rows, kb, key0, n_keys, lo, b1, b2, hi, i0, T, M, win,
    dh, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, R: tl.constexpr, PREC: tl.constexpr,
    MEM: tl.constexpr,
):  # fmt: skip
    """One stream's key blocks lo..hi: [lo, b1) and [b2, hi) with the causal/window mask (memory + segment only),
    [b1, b2) without: its interior blocks [b1, c) also without row masks on their loads."""
    idx = chunk_index(qp, PREC, BLOCK_M, BLOCK_N, D, R)
    band = first_chunks(qp, tab, lo, i0, T, n_rows, st_t, dh, PREC, BLOCK_M, BLOCK_N, D, R)
    c = interior(lo, b1, b2, i0, T, n_keys, n_rows, BLOCK_M, BLOCK_N, R)
    m_i, l_i, acc, band = _attend(
        m_i, l_i, acc, band, qu, qp, idx, kp, sk_t, vp, sv_t, tab, st_t, n_rows, kb, key0, n_keys, lo, b1, i0,
        T, M, win, dh, BLOCK_M, BLOCK_N, D, R, PREC, MEM, True,
    )  # fmt: skip
    m_i, l_i, acc, band = _attend(
        m_i, l_i, acc, band, qu, qp, idx, kp, sk_t, vp, sv_t, tab, st_t, n_rows, kb, key0, n_keys, b1, c, i0,
        T, M, win, dh, BLOCK_M, BLOCK_N, D, R, PREC, False, False,
    )  # fmt: skip
    m_i, l_i, acc, band = _attend(
        m_i, l_i, acc, band, qu, qp, idx, kp, sk_t, vp, sv_t, tab, st_t, n_rows, kb, key0, n_keys, c, b2, i0,
        T, M, win, dh, BLOCK_M, BLOCK_N, D, R, PREC, False, True,
    )  # fmt: skip
    m_i, l_i, acc, band = _attend(
        m_i, l_i, acc, band, qu, qp, idx, kp, sk_t, vp, sv_t, tab, st_t, n_rows, kb, key0, n_keys, b2, hi, i0,
        T, M, win, dh, BLOCK_M, BLOCK_N, D, R, PREC, MEM, True,
    )  # fmt: skip
    return m_i, l_i, acc


@triton.jit
def forward_kernel(
    QU, QV, QC, K, V, RM, RC, KB, OUT, LSE,
    sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sr_h, sr_t, src_h, src_t, skb_b,
    H, T, C, M, Lr, Lc, dh, win, kb_mem,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, R: tl.constexpr, PREC: tl.constexpr,
    HAS_C: tl.constexpr,
):  # fmt: skip
    """One query block of head (b, h): the output rows and their base-2 log-sum-exp. KB: the keys' bias, the
    compressed stream's from column 0, the memory + segment stream's from column kb_mem."""
    i0, bh, h, kp, vp, kb = query_program(K, V, KB, sk_b, sk_h, sv_b, sv_h, skb_b, H, BLOCK_M)
    qu = query_rows(QU, bh, i0, T, dh, BLOCK_M, D)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    if HAS_C:  # every compressed slot is in every query's past: no tile needs the causal mask
        qc = query_rows(QC, bh, i0, T, dh, BLOCK_M, D)
        m_i, l_i, acc = _attend_stream(
            m_i, l_i, acc, qu, qc, kp, sk_t, vp, sv_t, RC + h.to(tl.int64) * src_h, src_t, Lc, kb, 0, C, 0, 0, C,
            C, i0, T, M, win, dh, BLOCK_M, BLOCK_N, D, R, PREC, False,
        )  # fmt: skip
    qv = query_rows(QV, bh, i0, T, dh, BLOCK_M, D)
    lo, b1, b2, hi = memory_blocks(i0, T, M, win, BLOCK_M, BLOCK_N)
    m_i, l_i, acc = _attend_stream(
        m_i, l_i, acc, qu, qv, kp, sk_t, vp, sv_t, RM + h.to(tl.int64) * sr_h, sr_t, Lr, kb + kb_mem, C, M + T, lo,
        b1, b2, hi, i0, T, M, win, dh, BLOCK_M, BLOCK_N, D, R, PREC, True,
    )  # fmt: skip
    l_safe = tl.where(l_i > 0, l_i, 1.0)  # only rows past T can have nothing: they are not stored
    store_rows(dense(OUT, bh, T, dh), acc / l_safe[:, None], i0, T, dh, dh, BLOCK_M, D)
    i = i0 + tl.arange(0, BLOCK_M)
    tl.store(LSE + bh * T + i, m_i + tl.math.log2(l_safe), mask=i < T)
