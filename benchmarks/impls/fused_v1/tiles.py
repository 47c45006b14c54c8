"""The first fused kernel's tile helpers, frozen as they were (the baseline the current kernels are measured
against): the relative shift between a tile and its band of positional-table rows, the scores of one (query block,
key block) tile and its mask.

A tile of BLOCK queries i0.. and BLOCK keys n0.. of one positional stream reads table rows m = (n - i) + T - 1, all
of them inside the band of 2 * BLOCK rows that starts at ``n0 - i0 + T - BLOCK``: element (a, c) of the tile is
column c + BLOCK - 1 - a of the band. The kernels multiply the queries by the whole band on the tensor cores and
move each row a left by BLOCK - 1 - a through a small scratch buffer of the program (store, barrier, shifted load),
which stays in L1/L2: no (B, H, T, K) tensor is ever written to memory. The scratch is why every kernel runs with
``num_stages=1``: Triton's software pipeliner would hoist a load of the next iteration above this iteration's store.
"""

import triton
import triton.language as tl

# loads, stores, products and the base-2 constant are the current kernels' (unchanged in meaning since)
from compressive_transformer.core.kernels.fused_triton_tiles import LOG2E, dense, head, load_rows, mma, store_rows

__all__ = ["LOG2E", "dense", "head", "load_rows", "mma", "store_rows"]  # the generic helpers, shared with today's


@triton.jit
def band_to_tile(band, scratch, BLOCK: tl.constexpr, BAND: tl.constexpr):
    """(BLOCK, BAND) band -> (BLOCK, BLOCK) tile: out[a, c] = band[a, c + BLOCK - 1 - a]. The first barrier keeps
    the store from overwriting what another thread has not yet read from the previous use of the scratch."""
    a = tl.arange(0, BLOCK)[:, None]
    tl.debug_barrier()
    tl.store(scratch + a * BAND + tl.arange(0, BAND)[None, :], band)
    tl.debug_barrier()
    c = tl.arange(0, BLOCK)[None, :]
    return tl.load(scratch + a * BAND + c + (BLOCK - 1) - a)


@triton.jit
def tile_to_band(tile, scratch, BLOCK: tl.constexpr, BAND: tl.constexpr):
    """The inverse of :func:`band_to_tile`: (BLOCK, BLOCK) tile -> (BLOCK, BAND) band, zero off the tile's
    diagonals: out[a, t] = tile[a, t - (BLOCK - 1 - a)] where that column exists."""
    a = tl.arange(0, BLOCK)[:, None]
    tl.debug_barrier()
    tl.store(scratch + a * BLOCK + tl.arange(0, BLOCK)[None, :], tile)
    tl.debug_barrier()
    c = tl.arange(0, BAND)[None, :] - (BLOCK - 1) + a
    return tl.load(scratch + a * BLOCK + c, mask=(c >= 0) & (c < BLOCK), other=0.0)


@triton.jit
def logits(qu, qp, k, band, scratch, PREC: tl.constexpr, BLOCK: tl.constexpr, BAND: tl.constexpr):
    """Scores of one tile in base 2: (qu . k + qp . table[m(i, n)]) * log2(e), (BLOCK, BLOCK) fp32."""
    s = mma(qu, tl.trans(k), PREC)
    pos = mma(qp, tl.trans(band), PREC)  # (BLOCK, BAND): every query against every band row
    return (s + band_to_tile(pos, scratch, BLOCK, BAND)) * LOG2E


@triton.jit
def allowed(kv_ptr, i, n, key0, n_keys, T, M, win, MEM: tl.constexpr):
    """Which keys n (stream positions, (BLOCK,)) queries i ((BLOCK,)) may read: valid slots of the stream starting
    at key slot key0; in the memory + segment stream (MEM) also causal and at most ``win`` back, and always the
    query itself."""
    valid = tl.load(kv_ptr + key0 + n, mask=n < n_keys, other=0) != 0
    ok = valid[None, :] & (i < T)[:, None]
    if MEM:
        dist = M + i[:, None] - n[None, :]  # (BLOCK, BLOCK)
        ok = (ok & (dist >= 0) & (dist <= win)) | ((dist == 0) & (i < T)[:, None])
    return ok


@triton.jit
def band_row0(n0, i0, T, BLOCK: tl.constexpr):
    """The first table row of the band of the tile (queries i0.., keys n0..)."""
    return n0 - i0 + T - BLOCK


@triton.jit
def query_program(SCR, K, V, KV, sk_b, sk_h, sv_b, sv_h, skv_b, H, BLOCK: tl.constexpr):
    """A program of a (query block, b * H + h) grid: its first row i0 (the rows with the most keys first), bh, its
    own shift scratch, and the heads of its keys and values and its batch row of key_valid."""
    nq = tl.num_programs(0)
    i0 = (nq - 1 - tl.program_id(0)) * BLOCK
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    scratch = SCR + (bh.to(tl.int64) * nq + tl.program_id(0)) * (2 * BLOCK * BLOCK)
    kp, vp, kv = head(K, b, h, sk_b, sk_h), head(V, b, h, sv_b, sv_h), KV + b.to(tl.int64) * skv_b
    return i0, bh, h, scratch, kp, vp, kv


@triton.jit
def memory_keys(i0, T, M, win, BLOCK: tl.constexpr):
    """The memory + segment key blocks that queries i0 .. i0 + BLOCK may read: from the oldest within the window
    (rounded down to a block) to past the newest (causal)."""
    return tl.maximum(M + i0 - win, 0) // BLOCK * BLOCK, tl.minimum(M + T, M + i0 + BLOCK)


@triton.jit
def key_block(
    qu, qp, kp, sk_t, vp, sv_t, tab, st_t, n_rows, kv, key0, n_keys, n0, i0, T, M, win, dh, scratch,
    BLOCK: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, MEM: tl.constexpr,
):  # fmt: skip
    """Key block n0 of a stream (key slots key0 + n0 ..) against queries i0 ..: its keys, values and table band,
    the tile's base-2 scores and which of them are allowed."""
    k = load_rows(kp, key0 + n0, key0 + n_keys, sk_t, dh, BLOCK, D)
    v = load_rows(vp, key0 + n0, key0 + n_keys, sv_t, dh, BLOCK, D)
    band = load_rows(tab, band_row0(n0, i0, T, BLOCK), n_rows, st_t, dh, 2 * BLOCK, D)
    s = logits(qu, qp, k, band, scratch, PREC, BLOCK, 2 * BLOCK)
    ok = allowed(kv, i0 + tl.arange(0, BLOCK), n0 + tl.arange(0, BLOCK), key0, n_keys, T, M, win, MEM)
    return k, v, band, s, ok
