"""The backward kernels of the fused relative attention (FlashAttention-2 style, with recomputation): each tile's
scores are recomputed from the saved log-sum-exp, never stored. Two passes:

- :func:`key_value_grad_kernel`, one program per (key block, b, h), one launch per positional stream: dk, dv,
  summed in registers over the query blocks that read the key block. Its tiles share no band chunk (the queries
  change from tile to tile), so each computes its whole band.
- :func:`query_grad_kernel`, one program per (query block, b, h), both streams: dqu, dqv, dqc, and the tables'
  gradients. It walks the key blocks as the forward does (one new band chunk per tile) and moves each tile's dS into
  band chunks (:func:`~.fused_triton_tiles.unskew`); a chunk is finished once the last tile that reads its table rows
  has added to it, and then gives ``chunk @ rows`` to the positional queries' gradient and ``chunk^T @ q_pos`` to
  the table's, added atomically to an fp32 (H, rows, dh) buffer: no table kernel, no fold afterwards.

Query-shaped tensors (qu, qv, qc, dO, their gradients) are contiguous (B, H, T, dh); keys, values and tables are read
through their strides; dk and dv are written contiguous (B, H, K, dh).
"""

from compressive_transformer.core.kernels.fused_triton_tiles import (
    LN2,
    add_rows,
    band_index,
    band_part,
    band_row0,
    band_scores,
    chunk_index,
    dense,
    first_chunks,
    head,
    interior,
    key_tile,
    load_rows,
    memory_blocks,
    memory_queries,
    mma,
    probs_and_dscores,
    query_program,
    query_rows,
    row_stats,
    scores,
    store_rows,
    tl,
    triton,
    unskew,
    unskew_index,
)


@triton.jit
def _key_value_tile(
    dk, dv, k, v, idx, QU, QP, DO, LSE, DI, tab, st_t, n_rows, kb, n0, i0, bh, T, M, win, dh,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, BAND: tl.constexpr, PREC: tl.constexpr,
    MASK: tl.constexpr, EDGE: tl.constexpr,
):  # fmt: skip
    """Add query block i0 to the gradients of key block n0. EDGE False: every query row is below T, so no load has
    a row mask: the band's first table row, n0 - i0 + T - BLOCK_M, is then never negative, and its rows past the
    table's last are the host's zero padding (``fused_triton.BAND_PAD``), inside the allocation."""
    qu = query_rows(QU, bh, i0, T, dh, BLOCK_M, D, EDGE)
    qp = query_rows(QP, bh, i0, T, dh, BLOCK_M, D, EDGE)
    do = query_rows(DO, bh, i0, T, dh, BLOCK_M, D, EDGE)
    lse, di = row_stats(LSE, DI, bh, i0, T, BLOCK_M, EDGE)
    content = mma(qu, tl.trans(k), PREC)
    pos = band_scores(qp, idx, tab, n0, i0, T, n_rows, st_t, dh, PREC, BLOCK_M, BLOCK_N, D, BAND, EDGE)
    s = scores(content, pos, kb, i0, n0, T, M, win, BLOCK_M, BLOCK_N, MASK, EDGE)
    p, ds = probs_and_dscores(s, do, v, lse, di, PREC)
    dv += mma(tl.trans(p.to(do.dtype)), do, PREC)
    dk += mma(tl.trans(ds.to(qu.dtype)), qu, PREC)
    return dk, dv


@triton.jit
def _key_value_grads(
    dk, dv, k, v, idx, QU, QP, DO, LSE, DI, tab, st_t, n_rows, kb, n0, bh, lo, hi, T, M, win, dh,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, BAND: tl.constexpr, PREC: tl.constexpr,
    MASK: tl.constexpr,
):  # fmt: skip
    """Add query blocks lo..hi, all wholly below T, to the gradients of key block n0: no load in the loop has a row
    mask."""
    for i0 in range(lo, hi, BLOCK_M):
        dk, dv = _key_value_tile(
            dk, dv, k, v, idx, QU, QP, DO, LSE, DI, tab, st_t, n_rows, kb, n0, i0, bh, T, M, win, dh,
            BLOCK_M, BLOCK_N, D, BAND, PREC, MASK, False,
        )  # fmt: skip
    return dk, dv


@triton.jit
def key_value_grad_kernel(
    QU, QP, K, V, TAB, KB, DO, LSE, DI, DK, DV,
    sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, st_h, st_t, skb_b,
    H, T, M, n_rows, key0, n_keys, n_all, dh, win,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, BAND: tl.constexpr, PREC: tl.constexpr,
    MEM: tl.constexpr,
):  # fmt: skip
    """dk, dv of key block n0 of one stream (key slots key0 + n0 ..), summed over the query blocks that read it:
    those on the diagonal or the window's edge with the mask (memory + segment only), the others without; all but
    the one that straddles T (if any, after the loops, with row masks) without row masks on their loads. TAB: the
    stream's table, padded by the host with zero rows past its n_rows real ones. KB: the stream's keys' bias, from
    its first key."""
    n0 = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    k = load_rows(head(K, b, h, sk_b, sk_h), key0 + n0, key0 + n_keys, sk_t, dh, BLOCK_N, D)
    v = load_rows(head(V, b, h, sv_b, sv_h), key0 + n0, key0 + n_keys, sv_t, dh, BLOCK_N, D)
    tab, kb = TAB + h.to(tl.int64) * st_h, KB + b.to(tl.int64) * skb_b
    if MEM:
        lo, b1, b2, hi = memory_queries(n0, T, M, win, BLOCK_M, BLOCK_N)
    else:  # every query reads every compressed slot
        lo, b1, b2, hi = 0, 0, T, T
    dk = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    idx = band_index(k, PREC, BLOCK_M, BLOCK_N, D, BAND)
    inside = T // BLOCK_M * BLOCK_M  # the query blocks before it lie wholly below T
    dk, dv = _key_value_grads(
        dk, dv, k, v, idx, QU, QP, DO, LSE, DI, tab, st_t, n_rows, kb, n0, bh, lo, tl.minimum(b1, inside), T, M,
        win, dh, BLOCK_M, BLOCK_N, D, BAND, PREC, MEM,
    )  # fmt: skip
    dk, dv = _key_value_grads(
        dk, dv, k, v, idx, QU, QP, DO, LSE, DI, tab, st_t, n_rows, kb, n0, bh, b1, tl.minimum(b2, inside), T, M,
        win, dh, BLOCK_M, BLOCK_N, D, BAND, PREC, False,
    )  # fmt: skip
    dk, dv = _key_value_grads(
        dk, dv, k, v, idx, QU, QP, DO, LSE, DI, tab, st_t, n_rows, kb, n0, bh, b2, tl.minimum(hi, inside), T, M,
        win, dh, BLOCK_M, BLOCK_N, D, BAND, PREC, MEM,
    )  # fmt: skip
    if inside < hi:  # the block that straddles T, in the walk when it reads this key block (lo <= inside)
        dk, dv = _key_value_tile(
            dk, dv, k, v, idx, QU, QP, DO, LSE, DI, tab, st_t, n_rows, kb, n0, inside, bh, T, M, win, dh,
            BLOCK_M, BLOCK_N, D, BAND, PREC, MEM, True,
        )  # fmt: skip
    store_rows(dense(DK, bh, n_all, dh), dk * LN2, key0 + n0, key0 + n_keys, dh, dh, BLOCK_N, D)
    store_rows(dense(DV, bh, n_all, dh), dv, key0 + n0, key0 + n_keys, dh, dh, BLOCK_N, D)


@triton.jit
def _finish(dqp, band, qp, tab, dtab, row0, n_rows, st_t, dh, PREC: tl.constexpr, BLOCK_N: tl.constexpr,
            D: tl.constexpr):  # fmt: skip
    """A finished band chunk of dS (every tile reading table rows row0 .. row0 + BLOCK_N has added to it): its share
    of the positional queries' gradient, band @ rows, and of the table's, band^T @ q_pos (added atomically)."""
    rows = load_rows(tab, row0, n_rows, st_t, dh, BLOCK_N, D)
    dqp += mma(band.to(rows.dtype), rows, PREC)
    add_rows(dtab, mma(tl.trans(band.to(qp.dtype)), qp, PREC), row0, n_rows, dh, BLOCK_N, D)
    return dqp


@triton.jit
def _query_grads(
    dq, dqp, pend1, pend2, band, qu, qp, idx, uidx, do, lse, di, kp, sk_t, vp, sv_t, tab, st_t, n_rows, dtab,
    kb, key0, n_keys, lo, hi, i0, T, M, win, dh, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
    R: tl.constexpr, PREC: tl.constexpr, MASK: tl.constexpr, EDGE: tl.constexpr,
):  # fmt: skip
    """Add one stream's key blocks lo..hi to a query block's gradients. pend1 (and pend2 when R == 2): the band
    chunks of dS after the current tile's first, still open. EDGE False: interior tiles (the finished chunk's
    table rows keep their mask: the first tiles' start before row 0)."""
    for n0 in range(lo, hi, BLOCK_N):
        k, v, s, band = key_tile(
            band, qu, qp, idx, kp, sk_t, vp, sv_t, tab, st_t, n_rows, kb, key0, n_keys, n0, i0, T, M, win, dh,
            BLOCK_M, BLOCK_N, D, R, PREC, MASK, EDGE,
        )  # fmt: skip
        _, ds = probs_and_dscores(s, do, v, lse, di, PREC)
        dq += mma(ds.to(k.dtype), k, PREC)
        z = unskew(ds.to(qp.dtype), uidx, BLOCK_M, BLOCK_N)  # the products take dS in the operands' dtype
        done = pend1 + band_part(z, 0, BLOCK_M, BLOCK_N)  # no later tile reads this chunk's rows
        dqp = _finish(dqp, done, qp, tab, dtab, band_row0(n0, i0, T, BLOCK_M), n_rows, st_t, dh, PREC, BLOCK_N, D)
        if R == 2:
            pend1 = pend2 + band_part(z, 1, BLOCK_M, BLOCK_N)
            pend2 = band_part(z, 2, BLOCK_M, BLOCK_N)
        else:
            pend1 = band_part(z, 1, BLOCK_M, BLOCK_N)
    return dq, dqp, pend1, pend2, band


@triton.jit
def _query_stream(
    dq, qu, qp, do, lse, di, kp, sk_t, vp, sv_t, tab, st_t, n_rows, dtab, kb, key0, n_keys, lo, b1, b2, hi, i0, T,
    M, win, dh, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
    PREC: tl.constexpr, MEM: tl.constexpr,
):  # fmt: skip
    """One stream's key blocks lo..hi ([b1, b2) without the mask, its interior blocks [b1, c) also without row
    masks on their loads): dq gains their share; returns it and dq_pos."""
    dqp = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    pend1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=qp.dtype)
    pend2 = pend1
    idx, uidx = chunk_index(qp, PREC, BLOCK_M, BLOCK_N, D, R), unskew_index(qp, PREC, BLOCK_M, BLOCK_N, D)
    band = first_chunks(qp, tab, lo, i0, T, n_rows, st_t, dh, PREC, BLOCK_M, BLOCK_N, D, R)
    c = interior(lo, b1, b2, i0, T, n_keys, n_rows, BLOCK_M, BLOCK_N, R)
    dq, dqp, pend1, pend2, band = _query_grads(
        dq, dqp, pend1, pend2, band, qu, qp, idx, uidx, do, lse, di, kp, sk_t, vp, sv_t, tab, st_t, n_rows,
        dtab, kb, key0, n_keys, lo, b1, i0, T, M, win, dh, BLOCK_M, BLOCK_N, D, R, PREC, MEM, True,
    )  # fmt: skip
    dq, dqp, pend1, pend2, band = _query_grads(
        dq, dqp, pend1, pend2, band, qu, qp, idx, uidx, do, lse, di, kp, sk_t, vp, sv_t, tab, st_t, n_rows,
        dtab, kb, key0, n_keys, b1, c, i0, T, M, win, dh, BLOCK_M, BLOCK_N, D, R, PREC, False, False,
    )  # fmt: skip
    dq, dqp, pend1, pend2, band = _query_grads(
        dq, dqp, pend1, pend2, band, qu, qp, idx, uidx, do, lse, di, kp, sk_t, vp, sv_t, tab, st_t, n_rows,
        dtab, kb, key0, n_keys, c, b2, i0, T, M, win, dh, BLOCK_M, BLOCK_N, D, R, PREC, False, True,
    )  # fmt: skip
    dq, dqp, pend1, pend2, band = _query_grads(
        dq, dqp, pend1, pend2, band, qu, qp, idx, uidx, do, lse, di, kp, sk_t, vp, sv_t, tab, st_t, n_rows,
        dtab, kb, key0, n_keys, b2, hi, i0, T, M, win, dh, BLOCK_M, BLOCK_N, D, R, PREC, MEM, True,
    )  # fmt: skip
    if hi > lo:  # the chunks the last tile left open: no tile after it
        end = lo + (hi - lo + BLOCK_N - 1) // BLOCK_N * BLOCK_N  # the key block after the last
        row0 = band_row0(end, i0, T, BLOCK_M)
        dqp = _finish(dqp, pend1, qp, tab, dtab, row0, n_rows, st_t, dh, PREC, BLOCK_N, D)
        if R == 2:
            dqp = _finish(dqp, pend2, qp, tab, dtab, row0 + BLOCK_N, n_rows, st_t, dh, PREC, BLOCK_N, D)
    return dq, dqp


@triton.jit
def query_grad_kernel(
    QU, QV, QC, K, V, RM, RC, KB, DO, LSE, DI, DQU, DQV, DQC, DRM, DRC,
    sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sr_h, sr_t, src_h, src_t, skb_b,
    H, T, C, M, Lr, Lc, dh, win, kb_mem,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, R: tl.constexpr, PREC: tl.constexpr,
    HAS_C: tl.constexpr,
):  # fmt: skip
    """dqu, dqv, dqc of one query block and its shares of the two tables' gradients (DRM, DRC: fp32 (H, rows, dh),
    zero before the launch): the compressed stream's keys, then the memory + segment stream's (KB: the keys' bias,
    the compressed stream's from column 0, the memory + segment stream's from column kb_mem)."""
    i0, bh, h, kp, vp, kb = query_program(K, V, KB, sk_b, sk_h, sv_b, sv_h, skb_b, H, BLOCK_M)
    qu = query_rows(QU, bh, i0, T, dh, BLOCK_M, D)
    do = query_rows(DO, bh, i0, T, dh, BLOCK_M, D)
    lse, di = row_stats(LSE, DI, bh, i0, T, BLOCK_M)
    dq = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    if HAS_C:
        qc = query_rows(QC, bh, i0, T, dh, BLOCK_M, D)
        dq, dqc = _query_stream(
            dq, qu, qc, do, lse, di, kp, sk_t, vp, sv_t, RC + h.to(tl.int64) * src_h, src_t, Lc,
            DRC + h.to(tl.int64) * Lc * dh, kb, 0, C, 0, 0, C, C, i0, T, M, win, dh, BLOCK_M, BLOCK_N, D, R, PREC,
            False,
        )  # fmt: skip
        store_rows(dense(DQC, bh, T, dh), dqc, i0, T, dh, dh, BLOCK_M, D)
    qv = query_rows(QV, bh, i0, T, dh, BLOCK_M, D)
    lo, b1, b2, hi = memory_blocks(i0, T, M, win, BLOCK_M, BLOCK_N)
    dq, dqv = _query_stream(
        dq, qu, qv, do, lse, di, kp, sk_t, vp, sv_t, RM + h.to(tl.int64) * sr_h, sr_t, Lr,
        DRM + h.to(tl.int64) * Lr * dh, kb + kb_mem, C, M + T, lo, b1, b2, hi, i0, T, M, win, dh, BLOCK_M, BLOCK_N,
        D, R, PREC, True,
    )  # fmt: skip
    store_rows(dense(DQU, bh, T, dh), dq, i0, T, dh, dh, BLOCK_M, D)
    store_rows(dense(DQV, bh, T, dh), dqv, i0, T, dh, dh, BLOCK_M, D)
