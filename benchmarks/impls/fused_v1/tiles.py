"""The first fused kernel's tile helpers, frozen as they were (the baseline the current kernel is measured against): masked loads, the relative shift between
a tile and its band of positional-table rows, the scores of one (query block, key block) tile and its mask.

A tile of BLOCK queries i0.. and BLOCK keys n0.. of one positional stream reads table rows m = (n - i) + T - 1, all
of them inside the band of 2 * BLOCK rows that starts at ``n0 - i0 + T - BLOCK``: element (a, c) of the tile is
column c + BLOCK - 1 - a of the band. The kernels multiply the queries by the whole band on the tensor cores and
move each row a left by BLOCK - 1 - a through a small scratch buffer of the program (store, barrier, shifted load),
which stays in L1/L2: no (B, H, T, K) tensor is ever written to memory. The scratch is why every kernel runs with
``num_stages=1``: Triton's software pipeliner would hoist a load of the next iteration above this iteration's store.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # scores are kept in base 2: exp2 is the GPU's native exponential


@triton.jit
def head(ptr, b, h, stride_b, stride_h):
    """The base pointer of head (b, h), in 64-bit arithmetic (large tensors overflow 32-bit offsets)."""
    return ptr + tl.cast(b, tl.int64) * stride_b + tl.cast(h, tl.int64) * stride_h


@triton.jit
def dense(ptr, bh, n_rows, dh):
    """The base pointer of head bh of a contiguous (B, H, n_rows, dh) tensor (rows dh apart)."""
    return ptr + tl.cast(bh, tl.int64) * n_rows * dh


@triton.jit
def load_rows(ptr, row0, n_rows, stride_row, dh, ROWS: tl.constexpr, D: tl.constexpr):
    """Rows row0 .. row0 + ROWS of a (n_rows, dh) matrix as a (ROWS, D) tile; rows outside [0, n_rows) and columns
    past dh read as 0 (never out of bounds)."""
    rows = row0 + tl.arange(0, ROWS)
    cols = tl.arange(0, D)
    mask = ((rows >= 0) & (rows < n_rows))[:, None] & (cols < dh)[None, :]
    return tl.load(ptr + rows[:, None].to(tl.int64) * stride_row + cols[None, :], mask=mask, other=0.0)


@triton.jit
def store_rows(ptr, value, row0, n_rows, stride_row, dh, ROWS: tl.constexpr, D: tl.constexpr):
    """Store a (ROWS, D) tile as rows row0 .. of a (n_rows, dh) matrix, skipping rows and columns outside it."""
    rows = row0 + tl.arange(0, ROWS)
    cols = tl.arange(0, D)
    mask = ((rows >= 0) & (rows < n_rows))[:, None] & (cols < dh)[None, :]
    tl.store(ptr + rows[:, None].to(tl.int64) * stride_row + cols[None, :], value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def mma(a, b, PREC: tl.constexpr):
    """a @ b accumulated in fp32. PREC: "ieee" (fp32 operands, exact: no TF32), "tf32" (16-bit operands: the tensor
    cores' bf16/fp16 product, where the setting is moot) or "widen" (16-bit operands widened to fp32 first, the same
    products: for Triton's interpreter, whose dot multiplies the bit patterns of bf16 operands)."""
    if PREC == "widen":
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PREC)
    return out


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
