"""The first fused kernel's backward, frozen as it was (FlashAttention-2 style, with recomputation): the scores of
each tile are recomputed from the saved log-sum-exp, never stored.

- :func:`_key_grad_kernel`, one program per (key block, b, h), one launch per positional stream: dk, dv.
- :func:`_query_grad_kernel`, one program per (query block, b, h): dqu, dqv, dqc. The positional queries' gradient
  is ``band(dS) @ table_band``: dS moved into the band layout (the inverse of the forward's shift).
- :func:`_table_grad_kernel`, one program per (diagonal block offset delta, h, batch split), one launch per stream:
  all tiles with the same delta = key block - query block read the same band of table rows, so each program sums
  ``band(dS)^T @ q_pos`` over its tiles in registers and writes one partial band; :func:`fold_bands` overlap-adds
  the bands (neighbours share BLOCK rows) into the table's gradient. No atomics, no (B, H, T, K) buffer.

Query-shaped tensors (qu, qv, qc, dO, their gradients) are contiguous (B, H, T, dh); keys, values and tables are
read through their strides; dk and dv are written contiguous (B, H, K, dh).
"""

from .tiles import (
    allowed,
    band_row0,
    dense,
    head,
    key_block,
    load_rows,
    logits,
    memory_keys,
    mma,
    query_program,
    store_rows,
    tile_to_band,
    tl,
    triton,
)


@triton.jit
def _probs_and_dscores(s, ok, do, v, lse, di, PREC: tl.constexpr):
    """P (from the saved base-2 log-sum-exp) and dS = P * (dO v^T - rowsum(dO * O)) of one tile."""
    p = tl.math.exp2(tl.where(ok, s - lse[:, None], float("-inf")))
    dp = mma(do, tl.trans(v), PREC)
    return p, p * (dp - di[:, None])


@triton.jit
def _key_grad_kernel(
    QU, QP, K, V, TAB, KV, DO, LSE, DI, DK, DV, SCR,
    sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, st_h, st_t, skv_b,
    H, T, M, n_rows, key0, n_keys, n_all, dh, win,
    BLOCK: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, MEM: tl.constexpr,
):  # fmt: skip
    """dk, dv of key block n0 of one stream (key slots key0 + n0 ..), summed over the query blocks that see it."""
    n0 = tl.program_id(0) * BLOCK
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    scratch = SCR + (bh.to(tl.int64) * tl.num_programs(0) + tl.program_id(0)) * (2 * BLOCK * BLOCK)
    k = load_rows(head(K, b, h, sk_b, sk_h), key0 + n0, key0 + n_keys, sk_t, dh, BLOCK, D)
    v = load_rows(head(V, b, h, sv_b, sv_h), key0 + n0, key0 + n_keys, sv_t, dh, BLOCK, D)
    qup, qpp, dop = dense(QU, bh, T, dh), dense(QP, bh, T, dh), dense(DO, bh, T, dh)
    tab, kv = TAB + h.to(tl.int64) * st_h, KV + b.to(tl.int64) * skv_b
    if MEM:  # the queries that see some key of this block: causal, within the window
        lo = tl.maximum(n0 - M, 0) // BLOCK * BLOCK
        hi = tl.minimum(T, n0 + BLOCK - M + win)
    else:
        lo = 0
        hi = T
    n = n0 + tl.arange(0, BLOCK)
    dk = tl.zeros([BLOCK, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK, D], dtype=tl.float32)
    for i0 in range(lo, hi, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        qu = load_rows(qup, i0, T, dh, dh, BLOCK, D)
        qp = load_rows(qpp, i0, T, dh, dh, BLOCK, D)
        do = load_rows(dop, i0, T, dh, dh, BLOCK, D)
        lse = tl.load(LSE + bh * T + i, mask=i < T, other=0.0)
        di = tl.load(DI + bh * T + i, mask=i < T, other=0.0)
        band = load_rows(tab, band_row0(n0, i0, T, BLOCK), n_rows, st_t, dh, 2 * BLOCK, D)
        s = logits(qu, qp, k, band, scratch, PREC, BLOCK, 2 * BLOCK)
        ok = allowed(kv, i, n, key0, n_keys, T, M, win, MEM)
        p, ds = _probs_and_dscores(s, ok, do, v, lse, di, PREC)
        dv += mma(tl.trans(p.to(do.dtype)), do, PREC)
        dk += mma(tl.trans(ds.to(qu.dtype)), qu, PREC)
    store_rows(dense(DK, bh, n_all, dh), dk, key0 + n0, key0 + n_keys, dh, dh, BLOCK, D)
    store_rows(dense(DV, bh, n_all, dh), dv, key0 + n0, key0 + n_keys, dh, dh, BLOCK, D)


@triton.jit
def _query_grads(
    dq, dqp, qu, qp, do, lse, di, kp, sk_t, vp, sv_t, tab, st_t, n_rows, kv, key0, n_keys, lo, hi, i0, T, M, win,
    dh, scratch, BLOCK: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, MEM: tl.constexpr,
):  # fmt: skip
    """Add one stream's key blocks lo..hi to the gradients of a query block's content and positional queries."""
    for n0 in range(lo, hi, BLOCK):
        k, v, band, s, ok = key_block(
            qu, qp, kp, sk_t, vp, sv_t, tab, st_t, n_rows, kv, key0, n_keys, n0, i0, T, M, win, dh, scratch,
            BLOCK, D, PREC, MEM,
        )  # fmt: skip
        p, ds = _probs_and_dscores(s, ok, do, v, lse, di, PREC)
        dq += mma(ds.to(k.dtype), k, PREC)
        dqp += mma(tile_to_band(ds, scratch, BLOCK, 2 * BLOCK).to(band.dtype), band, PREC)
    return dq, dqp


@triton.jit
def _query_grad_kernel(
    QU, QV, QC, K, V, R, RC, KV, DO, LSE, DI, DQU, DQV, DQC, SCR,
    sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sr_h, sr_t, src_h, src_t, skv_b,
    H, T, C, M, Lr, Lc, dh, win,
    BLOCK: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, HAS_C: tl.constexpr,
):  # fmt: skip
    """dqu, dqv, dqc of one query block: the compressed stream's keys, then the memory + segment stream's."""
    i0, bh, h, scratch, kp, vp, kv = query_program(SCR, K, V, KV, sk_b, sk_h, sv_b, sv_h, skv_b, H, BLOCK)
    i = i0 + tl.arange(0, BLOCK)
    qu = load_rows(dense(QU, bh, T, dh), i0, T, dh, dh, BLOCK, D)
    do = load_rows(dense(DO, bh, T, dh), i0, T, dh, dh, BLOCK, D)
    lse = tl.load(LSE + bh * T + i, mask=i < T, other=0.0)
    di = tl.load(DI + bh * T + i, mask=i < T, other=0.0)
    dq = tl.zeros([BLOCK, D], dtype=tl.float32)
    if HAS_C:
        qc = load_rows(dense(QC, bh, T, dh), i0, T, dh, dh, BLOCK, D)
        dqc = tl.zeros([BLOCK, D], dtype=tl.float32)
        rc = RC + h.to(tl.int64) * src_h
        dq, dqc = _query_grads(
            dq, dqc, qu, qc, do, lse, di, kp, sk_t, vp, sv_t, rc, src_t, Lc, kv, 0, C, 0, C, i0, T, M, win, dh,
            scratch, BLOCK, D, PREC, False,
        )  # fmt: skip
        store_rows(dense(DQC, bh, T, dh), dqc, i0, T, dh, dh, BLOCK, D)
    qv = load_rows(dense(QV, bh, T, dh), i0, T, dh, dh, BLOCK, D)
    dqv = tl.zeros([BLOCK, D], dtype=tl.float32)
    lo, hi = memory_keys(i0, T, M, win, BLOCK)
    r = R + h.to(tl.int64) * sr_h
    dq, dqv = _query_grads(
        dq, dqv, qu, qv, do, lse, di, kp, sk_t, vp, sv_t, r, sr_t, Lr, kv, C, M + T, lo, hi, i0, T, M, win, dh,
        scratch, BLOCK, D, PREC, True,
    )  # fmt: skip
    store_rows(dense(DQU, bh, T, dh), dq, i0, T, dh, dh, BLOCK, D)
    store_rows(dense(DQV, bh, T, dh), dqv, i0, T, dh, dh, BLOCK, D)


@triton.jit
def _table_tile(
    acc, band, b, h, i0, n0, QU, QP, K, V, KV, DO, LSE, DI, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, skv_b,
    H, T, M, key0, n_keys, dh, win, scratch,
    BLOCK: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, MEM: tl.constexpr,
):  # fmt: skip
    """Add tile (queries i0.., keys n0..) of head (b, h) to its band's table gradient: band(dS)^T @ q_pos."""
    bh = b * H + h
    i = i0 + tl.arange(0, BLOCK)
    qu = load_rows(dense(QU, bh, T, dh), i0, T, dh, dh, BLOCK, D)
    qp = load_rows(dense(QP, bh, T, dh), i0, T, dh, dh, BLOCK, D)
    do = load_rows(dense(DO, bh, T, dh), i0, T, dh, dh, BLOCK, D)
    lse = tl.load(LSE + bh * T + i, mask=i < T, other=0.0)
    di = tl.load(DI + bh * T + i, mask=i < T, other=0.0)
    k = load_rows(head(K, b, h, sk_b, sk_h), key0 + n0, key0 + n_keys, sk_t, dh, BLOCK, D)
    v = load_rows(head(V, b, h, sv_b, sv_h), key0 + n0, key0 + n_keys, sv_t, dh, BLOCK, D)
    s = logits(qu, qp, k, band, scratch, PREC, BLOCK, 2 * BLOCK)
    ok = allowed(KV + tl.cast(b, tl.int64) * skv_b, i, n0 + tl.arange(0, BLOCK), key0, n_keys, T, M, win, MEM)
    p, ds = _probs_and_dscores(s, ok, do, v, lse, di, PREC)
    dsb = tile_to_band(ds, scratch, BLOCK, 2 * BLOCK)  # (BLOCK, 2 BLOCK)
    return acc + mma(tl.trans(dsb.to(qp.dtype)), qp, PREC)


@triton.jit
def _table_grad_kernel(
    QU, QP, K, V, TAB, KV, DO, LSE, DI, PART, SCR,
    sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, st_h, st_t, skv_b,
    B, H, T, M, n_rows, key0, n_keys, dh, win, delta0, n_splits,
    BLOCK: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, MEM: tl.constexpr,
):  # fmt: skip
    """The table gradient's band for diagonal delta0 + program_id(0) of head program_id(1), summed over the batch
    rows program_id(2), + n_splits, ... and over all query blocks: written to PART[split, h, delta]."""
    d, h, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_delta = tl.num_programs(0)
    delta = delta0 + d
    program = (split * H + h).to(tl.int64) * n_delta + d
    scratch = SCR + program * (2 * BLOCK * BLOCK)
    band = load_rows(TAB + h.to(tl.int64) * st_h, delta * BLOCK + T - BLOCK, n_rows, st_t, dh, 2 * BLOCK, D)
    qb_lo = tl.maximum(-delta, 0)
    qb_hi = tl.minimum(tl.cdiv(T, BLOCK), tl.cdiv(n_keys, BLOCK) - delta)
    acc = tl.zeros([2 * BLOCK, D], dtype=tl.float32)
    for b in range(split, B, n_splits):
        for qb in range(qb_lo, qb_hi):
            acc = _table_tile(
                acc, band, b, h, qb * BLOCK, (qb + delta) * BLOCK, QU, QP, K, V, KV, DO, LSE, DI,
                sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, skv_b, H, T, M, key0, n_keys, dh, win, scratch,
                BLOCK, D, PREC, MEM,
            )  # fmt: skip
    rows = tl.arange(0, 2 * BLOCK)[:, None] * D + tl.arange(0, D)[None, :]
    tl.store(PART + program * (2 * BLOCK * D) + rows, acc)
