"""Tile helpers shared by the fused relative attention's Triton kernels: masked loads, the relative shift between a
tile and its band of positional-table rows (in registers), a tile's scores and which key blocks need a mask.

A tile of BLOCK_M queries i0.. and BLOCK_N keys n0.. of one positional stream reads table rows m = (n - i) + T - 1,
all inside the band of BLOCK_M + BLOCK_N - 1 rows that starts at ``n0 - i0 + T - BLOCK_M``: element (a, c) of the tile
is column j = c + BLOCK_M - 1 - a of the band. The band is cut into R + 1 chunks of BLOCK_N rows (R = BLOCK_M //
BLOCK_N, at least 1); the queries are multiplied by each chunk on the tensor cores (:func:`chunk`), and one
``tl.gather`` (:func:`take`) from the R + 1 products joined moves row a of each left by BLOCK_M - 1 - a (modulo
BLOCK_N) and takes each element from the chunk holding its band column (:func:`skew`): no scratch buffer in global
memory and no barrier in the kernels' code, so Triton's software pipeliner may overlap the next tile's loads with this
tile's products. Consecutive key blocks of one query block share R of their chunks, so a program walking the keys
computes one new chunk per tile and carries the R before it (:func:`first_chunks`, :func:`next_chunks`).
:func:`unskew` and :func:`band_part` are the inverse (a tile's dS into band chunks), for the positional queries' and
the table's gradients.

Masks: a key's slot may be empty anywhere (a per-key bias of 0 or -inf, one vector per tile, padded with -inf past
each stream's end); the causal rule, the window and "a query always reads itself" concern only the memory + segment
stream's tiles that straddle the diagonal or the window's edge (:func:`memory_blocks`, :func:`memory_queries` say
which), so every other tile is scored without a (BLOCK_M, BLOCK_N) mask.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # scores are kept in base 2: exp2 is the GPU's native exponential
LN2 = tl.constexpr(0.6931471805599453)  # 1 / LOG2E: a gradient taken against base-2 queries, back to theirs


@triton.jit
def head(ptr, b, h, stride_b, stride_h):
    """The base pointer of head (b, h), in 64-bit arithmetic (large tensors overflow 32-bit offsets)."""
    return ptr + tl.cast(b, tl.int64) * stride_b + tl.cast(h, tl.int64) * stride_h


@triton.jit
def dense(ptr, bh, n_rows, dh):
    """The base pointer of head bh of a contiguous (B, H, n_rows, dh) tensor (rows dh apart)."""
    return ptr + tl.cast(bh, tl.int64) * n_rows * dh


@triton.jit
def row_block(ptr, row0, n_rows, stride_row, dh, ROWS: tl.constexpr, D: tl.constexpr, EDGE: tl.constexpr = True):
    """Pointers and the in-bounds mask of rows row0 .. row0 + ROWS of a (n_rows, dh) matrix: the tile's first row
    in 64-bit scalar arithmetic (once per tile, for the whole program), the offsets within the tile in 32 bits
    (the same for every tile, so computed once per program; the host keeps ROWS * stride_row below 2^31). EDGE
    False: the caller knows every row is inside, and only the columns past dh are masked (the same for every
    tile)."""
    r = tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, D)[None, :]
    if EDGE:
        mask = (r >= -row0) & (r < n_rows - row0) & (cols < dh)
    else:
        mask = (r >= 0) & (cols < dh)  # (ROWS, D), like the edge's
    return ptr + tl.cast(row0, tl.int64) * stride_row + (r * stride_row + cols), mask


@triton.jit
def load_rows(ptr, row0, n_rows, stride_row, dh, ROWS: tl.constexpr, D: tl.constexpr, EDGE: tl.constexpr = True):
    """Rows row0 .. row0 + ROWS of a (n_rows, dh) matrix as a (ROWS, D) tile; rows outside [0, n_rows) and columns
    past dh read as 0 (never out of bounds; EDGE False: the rows are known to be inside)."""
    ptrs, mask = row_block(ptr, row0, n_rows, stride_row, dh, ROWS, D, EDGE)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def store_rows(ptr, value, row0, n_rows, stride_row, dh, ROWS: tl.constexpr, D: tl.constexpr):
    """Store a (ROWS, D) tile as rows row0 .. of a (n_rows, dh) matrix, skipping rows and columns outside it."""
    ptrs, mask = row_block(ptr, row0, n_rows, stride_row, dh, ROWS, D)
    tl.store(ptrs, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def add_rows(ptr, value, row0, n_rows, dh, ROWS: tl.constexpr, D: tl.constexpr):
    """Atomically add a (ROWS, D) fp32 tile to rows row0 .. of a contiguous (n_rows, dh) fp32 matrix (rows outside
    it dropped): the table gradient, which the programs of all query blocks and batch rows add to."""
    ptrs, mask = row_block(ptr, row0, n_rows, dh, dh, ROWS, D)
    tl.atomic_add(ptrs, value, mask=mask, sem="relaxed")


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
def take(src, idx, N_SRC: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """out[a, c] = src.flat[idx[a, c]] for a (ROWS, COLS) result: ``tl.gather`` on the flattened tensors, which
    Triton lowers to one store of src to shared memory, a barrier and one load per element. idx comes from
    :func:`anchored` (the tensor cores' register layout, so the result has it too and no layout conversion surrounds
    the gather)."""
    out = tl.gather(tl.reshape(src, [N_SRC]), tl.reshape(idx, [ROWS * COLS]), 0)
    return tl.reshape(out, [ROWS, COLS])


@triton.jit
def anchored(index, like, PREC: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr, D: tl.constexpr):
    """A gather index (ROWS, COLS) in the register layout of a (ROWS, D) @ (D, COLS) tensor-core product in like's
    dtype, built once per program, before the tile loops: the layout comes from a product of zeros (never NaN, so
    the index is the given one everywhere); an index from ``tl.arange`` alone would take a blocked layout, and each
    tile would convert its gather's result."""
    zero = mma(tl.zeros([ROWS, D], dtype=like.dtype), tl.zeros([D, COLS], dtype=like.dtype), PREC)
    return tl.where(zero == 0.0, index, 0)


@triton.jit
def tile_rows(BLOCK_M: tl.constexpr):
    return tl.arange(0, BLOCK_M)[:, None]


@triton.jit
def band_column(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """j = c + BLOCK_M - 1 - a: the band column of tile element (a, c), (BLOCK_M, BLOCK_N)."""
    return tl.arange(0, BLOCK_N)[None, :] + (BLOCK_M - 1) - tile_rows(BLOCK_M)


@triton.jit
def chunk(qp, tab, row0, n_rows, st_t, dh, PREC: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
          EDGE: tl.constexpr = True):  # fmt: skip
    """The positional queries (BLOCK_M, D) against table rows row0 .. row0 + BLOCK_N, in fp32 as the tensor cores
    accumulate them (not rounded to qp's dtype: a 32-bit gather needs no packing or widening of 16-bit halves, and
    the content scores they are added to are fp32): prod[a, t] = qp[a] . tab[row0 + t]. A tile reads R + 1 of them,
    moved into place by one gather (:func:`skew`)."""
    rows = load_rows(tab, row0, n_rows, st_t, dh, BLOCK_N, D, EDGE)
    return mma(qp, tl.trans(rows), PREC)  # (BLOCK_M, BLOCK_N)


@triton.jit
def skew(new, band, idx, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, R: tl.constexpr):
    """A tile's positional scores from the products of its R + 1 chunks, new (its last BLOCK_N band rows) and band
    (the R before, :func:`next_chunks`): out[a, c] = (chunk of band column j)[a, j mod BLOCK_N], j = c + BLOCK_M - 1
    - a, in one gather from the chunks joined. The chunk's choice is in the gather's index (built once per program),
    so no tile selects between chunks element by element (a select on a (BLOCK_M, BLOCK_N) mask held across the
    loop costs predicate moves besides itself). idx: :func:`chunk_index`."""
    if R == 2:  # slots: new, new (unread), then band's two
        src = tl.permute(tl.join(tl.join(new, new), band), (3, 2, 0, 1))
    else:
        src = tl.permute(tl.join(new, band), (2, 0, 1))
    return take(src, idx, BLOCK_M * BLOCK_N * 2 * R, BLOCK_M, BLOCK_N)


@triton.jit
def chunk_index(qp, PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                R: tl.constexpr):  # fmt: skip
    """:func:`skew`'s gather index: element (a, j mod BLOCK_N) of the chunk holding band column j, which the walk
    computed R - j // BLOCK_N tiles ago (its age picks the joined chunk: slot 0 the new one, R == 2 slots 2 and 3
    the two before it)."""
    j = band_column(BLOCK_M, BLOCK_N)
    age = R - j // BLOCK_N
    slot = age + tl.where(age > 0, R - 1, 0)
    return anchored(slot * (BLOCK_M * BLOCK_N) + tile_rows(BLOCK_M) * BLOCK_N + j % BLOCK_N, qp, PREC, BLOCK_M,
                    BLOCK_N, D)  # fmt: skip


@triton.jit
def band_row0(n0, i0, T, BLOCK_M: tl.constexpr):
    """The first table row of the band of the tile (queries i0.., keys n0..): chunk p starts BLOCK_N p rows later."""
    return n0 - i0 + T - BLOCK_M


@triton.jit
def first_chunks(qp, tab, n0, i0, T, n_rows, st_t, dh, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, D: tl.constexpr, R: tl.constexpr):  # fmt: skip
    """What a walk's first tile (key block n0) needs besides its newest chunk, as :func:`next_chunks` carries it:
    the products of the R chunks before the newest (R == 2: the later one and the earlier, joined)."""
    row0 = band_row0(n0, i0, T, BLOCK_M)
    band = chunk(qp, tab, row0 + (R - 1) * BLOCK_N, n_rows, st_t, dh, PREC, BLOCK_N, D)
    if R == 2:
        band = tl.join(band, chunk(qp, tab, row0, n_rows, st_t, dh, PREC, BLOCK_N, D))
    return band


@triton.jit
def next_chunks(band, qp, tab, idx, n0, i0, T, n_rows, st_t, dh, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, D: tl.constexpr, R: tl.constexpr, EDGE: tl.constexpr):  # fmt: skip
    """The positional scores of tile (i0, n0) from the chunks the tiles before computed (band) and one new chunk,
    and the band to carry to the next tile. What is carried is computed in this tile (R == 2: the new chunk joined
    with the later of band's two): a value passed on unchanged for two tiles would keep Triton's pipeliner from
    overlapping the loads."""
    row0 = band_row0(n0, i0, T, BLOCK_M) + R * BLOCK_N
    new = chunk(qp, tab, row0, n_rows, st_t, dh, PREC, BLOCK_N, D, EDGE)
    pos = skew(new, band, idx, BLOCK_M, BLOCK_N, R)
    if R == 2:
        later, _ = tl.split(band)
        band = tl.join(new, later)
    else:
        band = new
    return pos, band


@triton.jit
def band_scores(qp, idx, tab, n0, i0, T, n_rows, st_t, dh, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, D: tl.constexpr, BAND: tl.constexpr, EDGE: tl.constexpr):  # fmt: skip
    """The positional scores of tile (i0, n0) from one product with its whole band (BAND >= BLOCK_M + BLOCK_N - 1
    rows), for a walk over query blocks, whose tiles share no band rows' products (the queries change). idx:
    :func:`band_index`."""
    rows = load_rows(tab, band_row0(n0, i0, T, BLOCK_M), n_rows, st_t, dh, BAND, D, EDGE)
    band = mma(qp, tl.trans(rows), PREC)  # (BLOCK_M, BAND), fp32 as chunk()'s
    return take(band, idx, BLOCK_M * BAND, BLOCK_M, BLOCK_N)


@triton.jit
def band_index(qp, PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
               BAND: tl.constexpr):  # fmt: skip
    """:func:`band_scores`' gather index: tile element (a, c) from band column j = c + BLOCK_M - 1 - a of row a."""
    return anchored(tile_rows(BLOCK_M) * BAND + band_column(BLOCK_M, BLOCK_N), qp, PREC, BLOCK_M, BLOCK_N, D)


@triton.jit
def unskew(ds, idx, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A tile's dS moved into band columns modulo BLOCK_N: out[a, t] = ds[a, c] for the column c whose band column
    j = c + BLOCK_M - 1 - a is congruent to t; :func:`band_part` cuts out the chunks. idx: :func:`unskew_index`."""
    return take(ds, idx, BLOCK_M * BLOCK_N, BLOCK_M, BLOCK_N)  # in ds's dtype


@triton.jit
def unskew_index(qp, PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """:func:`unskew`'s gather index."""
    a = tile_rows(BLOCK_M)
    c = (tl.arange(0, BLOCK_N)[None, :] + a + 1 - BLOCK_M + 2 * BLOCK_N) % BLOCK_N
    return anchored(a * BLOCK_N + c, qp, PREC, BLOCK_M, BLOCK_N, D)


@triton.jit
def band_part(z, q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Chunk q of a tile's dS in the band layout, from :func:`unskew`'s z: band columns q BLOCK_N .. (q + 1)
    BLOCK_N, zero where no tile column lands."""
    c = q * BLOCK_N + tl.arange(0, BLOCK_N)[None, :] - (BLOCK_M - 1) + tile_rows(BLOCK_M)
    return tl.where((c >= 0) & (c < BLOCK_N), z, 0.0)


@triton.jit
def scores(content, pos, kb, i0, n0, T, M, win, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
           EDGE: tl.constexpr = True):  # fmt: skip
    """Base-2 scores of tile (i0, n0), qu . k + positional from queries the host scaled by log2(e) (no multiply per
    score), with -inf where a key may not be read: an empty slot (every tile: kb, the stream's additive bias, 0 or
    -inf, which the host pads with -inf past the stream's end to a whole number of the largest blocks, so its load
    needs no mask on any tile); with MASK (memory + segment tiles on the diagonal or the window's edge) also a future
    key or one farther back than ``win``, except that a query always reads itself (a row past T does not; EDGE
    False: the caller knows every query row is below T, and the tile skips that test)."""
    raw = content + pos
    c = tl.arange(0, BLOCK_N)
    bias = tl.load(kb + n0 + c)  # (BLOCK_N,)
    if MASK:
        i = i0 + tl.arange(0, BLOCK_M)
        dist = M + i[:, None] - (n0 + c)[None, :]
        near = dist.to(tl.uint32) <= tl.cast(win, tl.uint32)  # 0 <= dist <= win in one comparison
        own = dist == 0
        if EDGE:
            own = own & (i < T)[:, None]
        s = tl.where(own, raw, tl.where(near, raw + bias[None, :], float("-inf")))
    else:
        s = raw + bias[None, :]
    return s


@triton.jit
def key_tile(
    band, qu, qp, idx, kp, sk_t, vp, sv_t, tab, st_t, n_rows, kb, key0, n_keys, n0, i0, T, M, win, dh,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, R: tl.constexpr, PREC: tl.constexpr,
    MASK: tl.constexpr, EDGE: tl.constexpr,
):  # fmt: skip
    """Key block n0 (key slots key0 + n0 ..) of a query block's walk over one stream: its keys, values and the tile's
    base-2 scores, and the band chunks to carry to the next key block. EDGE False: an interior tile
    (:func:`interior`), whose loads need no row mask."""
    k = load_rows(kp, key0 + n0, key0 + n_keys, sk_t, dh, BLOCK_N, D, EDGE)
    v = load_rows(vp, key0 + n0, key0 + n_keys, sv_t, dh, BLOCK_N, D, EDGE)
    content = mma(qu, tl.trans(k), PREC)
    pos, band = next_chunks(band, qp, tab, idx, n0, i0, T, n_rows, st_t, dh, PREC, BLOCK_M, BLOCK_N, D, R, EDGE)
    s = scores(content, pos, kb, i0, n0, T, M, win, BLOCK_M, BLOCK_N, MASK)
    return k, v, s, band


@triton.jit
def online_softmax(m_i, l_i, acc, s, v, PREC: tl.constexpr):
    """Add one tile of base-2 scores s and its values v to a query block's running max m_i, sum l_i and output acc;
    a row with nothing allowed yet stays at max -inf and sum 0."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_use)
    p = tl.math.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, PREC)
    return m_new, l_i, acc


@triton.jit
def split(lo, full_lo, full_hi, hi):
    """[lo, hi) cut at b1 <= b2 so that [b1, b2) is where the fully allowed blocks start (``full_lo``, ``full_hi``
    on the blocks' lattice): the loops run [lo, b1) masked, [b1, b2) unmasked, [b2, hi) masked."""
    b1 = tl.minimum(tl.maximum(full_lo, lo), hi)
    b2 = tl.minimum(tl.maximum(full_hi, b1), hi)
    return b1, b2


@triton.jit
def interior(lo, b1, b2, i0, T, n_keys, n_rows, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, R: tl.constexpr):
    """Where the key blocks of [b1, b2) (a query block's walk from lo) stop being interior: a tile whose keys and
    new band chunk are all inside their tensors (n0 + BLOCK_N <= n_keys, its chunk's last table row < n_rows; its
    chunk's first row is never negative, as R BLOCK_N >= BLOCK_M), so its loads need no row mask. Both bounds grow
    with n0: the interior blocks are [b1, c), the edge ones [c, b2)."""
    last = tl.minimum(n_keys - BLOCK_N, n_rows + i0 - T + BLOCK_M - (R + 1) * BLOCK_N)  # the last interior n0
    c = lo + tl.maximum(last - lo + BLOCK_N, 0) // BLOCK_N * BLOCK_N  # the first block after it
    return tl.minimum(tl.maximum(c, b1), b2)


@triton.jit
def memory_blocks(i0, T, M, win, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The memory + segment key blocks (stream positions) that queries i0 .. i0 + BLOCK_M may read, lo .. hi, and the
    cuts b1 <= b2 between them: blocks before b1 cross the window's edge, blocks from b2 the diagonal, and the
    blocks between are read whole by every query (each key at a distance in [1, win])."""
    last = tl.minimum(i0 + BLOCK_M, T) - 1  # the block's last real query
    lo = tl.maximum(M + i0 - win, 0) // BLOCK_N * BLOCK_N
    hi = tl.minimum(M + T, M + i0 + BLOCK_M)
    full_lo = (tl.maximum(M + last - win, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N  # no key beyond any query's window
    full_hi = (M + i0) // BLOCK_N * BLOCK_N  # key blocks ending at or before the first query: all strictly earlier
    b1, b2 = split(lo, full_lo, full_hi, hi)
    return lo, b1, b2, hi


@triton.jit
def memory_queries(n0, T, M, win, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The query blocks that read some key of the memory + segment block n0 .. n0 + BLOCK_N, lo .. hi, with the cuts
    b1 <= b2 as in :func:`memory_blocks`: blocks before b1 cross the diagonal, blocks from b2 the window's edge."""
    last = tl.minimum(n0 + BLOCK_N, M + T) - 1  # the block's last real key
    lo = tl.maximum(n0 - M, 0) // BLOCK_M * BLOCK_M
    hi = tl.minimum(T, last - M + win + 1)
    full_lo = (tl.maximum(last - M + 1, 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M  # every key strictly earlier
    full_hi = tl.maximum(n0 - M + win + 1, 0) // BLOCK_M * BLOCK_M  # every key within every query's window
    b1, b2 = split(lo, full_lo, full_hi, hi)
    return lo, b1, b2, hi


@triton.jit
def query_program(K, V, KB, sk_b, sk_h, sv_b, sv_h, skb_b, H, BLOCK_M: tl.constexpr):
    """A program of a (query block, b * H + h) grid: its first row i0 (the rows with the most keys first), bh, h,
    and the heads of its keys and values and its batch row of the keys' bias."""
    i0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    kp, vp, kb = head(K, b, h, sk_b, sk_h), head(V, b, h, sv_b, sv_h), KB + b.to(tl.int64) * skb_b
    return i0, bh, h, kp, vp, kb


@triton.jit
def query_rows(ptr, bh, i0, T, dh, BLOCK_M: tl.constexpr, D: tl.constexpr, EDGE: tl.constexpr = True):
    """Rows i0 .. i0 + BLOCK_M of head bh of a contiguous (B, H, T, dh) query-shaped tensor."""
    return load_rows(dense(ptr, bh, T, dh), i0, T, dh, dh, BLOCK_M, D, EDGE)


@triton.jit
def row_stats(LSE, DI, bh, i0, T, BLOCK_M: tl.constexpr, EDGE: tl.constexpr = True):
    """The saved base-2 log-sum-exp and rowsum(dO * O) of rows i0 .. i0 + BLOCK_M; rows past T get +inf and 0, so
    that their probabilities and score gradients are exactly 0 (EDGE False: no row is past T)."""
    i = i0 + tl.arange(0, BLOCK_M)
    if EDGE:
        lse = tl.load(LSE + bh * T + i, mask=i < T, other=float("inf"))
        di = tl.load(DI + bh * T + i, mask=i < T, other=0.0)
    else:
        lse, di = tl.load(LSE + bh * T + i), tl.load(DI + bh * T + i)
    return lse, di


@triton.jit
def probs_and_dscores(s, do, v, lse, di, PREC: tl.constexpr):
    """P (from the saved base-2 log-sum-exp) and dS = P * (dO v^T - rowsum(dO * O)) of one tile."""
    p = tl.math.exp2(s - lse[:, None])
    dp = mma(do, tl.trans(v), PREC)
    return p, p * (dp - di[:, None])
