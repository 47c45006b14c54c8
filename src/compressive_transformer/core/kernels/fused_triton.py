"""Relative-position attention over ``[compressed memory; memory; segment]`` fused in Triton, forward and backward,
without a (B, H, T, K) score, probability or gradient matrix in memory.

For query i and key j (C compressed keys, then M memory keys, then the T segment keys), with the queries already
biased and scaled by the caller (qu = (q + u) s, qv = (q + v) s, qc = (q + v_c) s):

    score = qu_i . k_j + qc_i . rc[j - i + T - 1]          (j < C, the compressed stream's own table)
                       + qv_i . r[(j - C) - i + T - 1]      (j >= C, memory + segment)

so row m of r encodes distance M + T - 1 - m and rc's rows descend in distance likewise. Key j is
allowed where ``key_valid[b, j]`` holds and, in the memory + segment stream, it is not in the future and at most
``window`` back (0: no limit); a query always sees itself. The positional term is computed inside each tile from the
queries and a band of table rows (see :mod:`.fused_triton_tiles`); the backward is in :mod:`.fused_triton_bwd`.

:func:`fused_relative_attention` is a ``torch.library`` custom op (``compressive_transformer::fused_relative_attention``
and its ``..._backward``) with fake implementations and autograd, so ``torch.compile(fullgraph=True)`` traces it
whole and CUDA graphs can capture it: nothing on its path synchronises with the host.
"""

import contextlib
from dataclasses import dataclass

import torch
from torch import Tensor

from compressive_transformer.core.kernels.fused_triton_bwd import (
    _key_grad_kernel,
    _query_grad_kernel,
    _table_grad_kernel,
)
from compressive_transformer.core.kernels.fused_triton_tiles import (
    dense,
    key_block,
    load_rows,
    memory_keys,
    mma,
    query_program,
    store_rows,
    tl,
    triton,
)

NAMESPACE = "compressive_transformer"
FORWARD_OP = f"{NAMESPACE}::fused_relative_attention"
BACKWARD_OP = f"{NAMESPACE}::fused_relative_attention_backward"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BLOCKS = (16, 32, 64, 128)  # tile sizes: powers of two, >= 16 for tl.dot
MAX_HEAD_DIM = 128  # (BLOCK, dh) fp32 accumulators and a (BLOCK, 2 BLOCK) band live in registers


@triton.jit
def _attend(
    m_i, l_i, acc, qu, qp, kp, sk_t, vp, sv_t, tab, st_t, n_rows, kv, key0, n_keys, lo, hi, i0, T, M, win, dh,
    scratch, BLOCK: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, MEM: tl.constexpr,
):  # fmt: skip
    """Online softmax of a query block over one stream's key blocks lo..hi (base-2 running max m_i and sum l_i)."""
    for n0 in range(lo, hi, BLOCK):
        k, v, band, s, ok = key_block(
            qu, qp, kp, sk_t, vp, sv_t, tab, st_t, n_rows, kv, key0, n_keys, n0, i0, T, M, win, dh, scratch,
            BLOCK, D, PREC, MEM,
        )  # fmt: skip
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing allowed yet stays at 0
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + mma(p.to(v.dtype), v, PREC)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _forward_kernel(
    QU, QV, QC, K, V, R, RC, KV, OUT, LSE, SCR,
    sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, sr_h, sr_t, src_h, src_t, skv_b,
    H, T, C, M, Lr, Lc, dh, win,
    BLOCK: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, HAS_C: tl.constexpr,
):  # fmt: skip
    """One query block of head (b, h): the output rows and their base-2 log-sum-exp."""
    i0, bh, h, scratch, kp, vp, kv = query_program(SCR, K, V, KV, sk_b, sk_h, sv_b, sv_h, skv_b, H, BLOCK)
    qu = load_rows(dense(QU, bh, T, dh), i0, T, dh, dh, BLOCK, D)
    m_i = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK], dtype=tl.float32)
    acc = tl.zeros([BLOCK, D], dtype=tl.float32)
    if HAS_C:
        qc = load_rows(dense(QC, bh, T, dh), i0, T, dh, dh, BLOCK, D)
        rc = RC + h.to(tl.int64) * src_h
        m_i, l_i, acc = _attend(
            m_i, l_i, acc, qu, qc, kp, sk_t, vp, sv_t, rc, src_t, Lc, kv, 0, C, 0, C, i0, T, M, win, dh, scratch,
            BLOCK, D, PREC, False,
        )  # fmt: skip
    qv = load_rows(dense(QV, bh, T, dh), i0, T, dh, dh, BLOCK, D)
    lo, hi = memory_keys(i0, T, M, win, BLOCK)
    r = R + h.to(tl.int64) * sr_h
    m_i, l_i, acc = _attend(
        m_i, l_i, acc, qu, qv, kp, sk_t, vp, sv_t, r, sr_t, Lr, kv, C, M + T, lo, hi, i0, T, M, win, dh, scratch,
        BLOCK, D, PREC, True,
    )  # fmt: skip
    l_safe = tl.where(l_i > 0, l_i, 1.0)  # only rows past T have nothing: they are not stored
    store_rows(dense(OUT, bh, T, dh), acc / l_safe[:, None], i0, T, dh, dh, BLOCK, D)
    i = i0 + tl.arange(0, BLOCK)
    tl.store(LSE + bh * T + i, m_i + tl.math.log2(l_safe), mask=i < T)


@dataclass(frozen=True)
class _Geometry:
    """Sizes of one call and the kernels' compile-time settings."""

    B: int
    H: int
    T: int
    K: int
    dh: int
    C: int
    M: int
    win: int  # the window, or M + T (beyond any distance) for none
    block: int
    device: torch.device
    dtype: torch.dtype

    @property
    def meta(self) -> dict:
        """Constexprs and launch settings. One pipeline stage: the scratch shift must not be software-pipelined."""
        D = max(16, triton.next_power_of_2(self.dh))
        prec = "ieee" if self.dtype == torch.float32 else "tf32" if self.device.type == "cuda" else "widen"
        warps = 8 if self.block >= 64 else 4  # the (BLOCK, 2 BLOCK) fp32 band beside the tiles: not yet tuned
        return dict(BLOCK=self.block, D=D, PREC=prec, num_warps=warps, num_stages=1)

    def scratch(self, programs: int) -> Tensor:
        """2 BLOCK^2 fp32 of shift scratch per program (each program's own, so no two programs share any)."""
        return torch.empty(programs * 2 * self.block**2, dtype=torch.float32, device=self.device)

    def launch_context(self):
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()


def _fail(message: str) -> None:
    raise ValueError(f"fused_relative_attention: {message}")


def _geometry(qu, k, v, qv, r, qc, rc, key_valid, n_cmem: int, window: int, block: int) -> _Geometry:
    """Check the arguments' shapes and dtypes (each error one line saying what to change) and size the call."""
    if qu.dim() != 4 or k.dim() != 4:
        _fail(f"qu and k must be (B, H, T, dh) and (B, H, K, dh), got {tuple(qu.shape)} and {tuple(k.shape)}")
    B, H, T, dh = qu.shape
    K, C = k.shape[2], n_cmem
    M = K - C - T
    if k.shape != (B, H, K, dh) or v.shape != k.shape or qv.shape != qu.shape:
        _fail(f"k, v must be (B, H, K, dh) and qv like qu {tuple(qu.shape)}: got {tuple(k.shape)}, {tuple(v.shape)}")
    if C < 0 or M < 0 or window < 0:
        _fail(f"need 0 <= n_cmem <= K - T and window >= 0, got n_cmem={C}, K={K}, T={T}, window={window}")
    if (qc is None or rc is None) != bool(C == 0):  # bool(): a SymBool under dynamic shapes
        _fail(f"qc and rc must be given exactly when n_cmem > 0 (n_cmem={C})")
    if r.dim() != 3 or r.shape[0] != H or r.shape[2] != dh or r.shape[1] < M + T:
        _fail(f"r must be (H={H}, >= M + T = {M + T}, dh={dh}), got {tuple(r.shape)}")
    if C > 0 and (qc.shape != qu.shape or rc.dim() != 3 or rc.shape[0] != H or rc.shape[2] != dh):
        _fail(f"qc must be like qu and rc (H={H}, >= C + T - 1, dh={dh}), got {tuple(qc.shape)}, {tuple(rc.shape)}")
    if C > 0 and rc.shape[1] < C + T - 1:
        _fail(f"rc needs >= C + T - 1 = {C + T - 1} rows, got {rc.shape[1]}")
    if key_valid.shape != (B, K) or key_valid.dtype != torch.bool:
        _fail(f"key_valid must be a bool (B, K) = ({B}, {K}) tensor, got {key_valid.dtype} {tuple(key_valid.shape)}")
    tensors = [qu, k, v, qv, r] + ([qc, rc] if C > 0 else [])
    if qu.dtype not in DTYPES or any(t.dtype != qu.dtype for t in tensors):
        _fail(f"qu, k, v, qv, r, qc, rc must share one dtype of fp32, bf16, fp16, got {[t.dtype for t in tensors]}")
    if dh > MAX_HEAD_DIM or block not in BLOCKS:
        _fail(f"needs head dim <= {MAX_HEAD_DIM} and a block in {BLOCKS}, got dh={dh}, block={block}")
    if B * H > 65535:  # the grids' second axis
        _fail(f"needs B * H <= 65535, got {B * H}: split the batch")
    if any(t.device != qu.device for t in tensors + [key_valid]):
        _fail("all tensors must be on one device")
    win = window if window > 0 else M + T
    return _Geometry(B, H, T, K, dh, C, M, win, block, qu.device, qu.dtype)


def _rows(t: Tensor) -> Tensor:
    """t with unit stride along its last dim (the kernels' tiles read rows)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _forward(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block) -> tuple[Tensor, Tensor]:
    g = _geometry(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block)
    qu, qv = qu.contiguous(), qv.contiguous()
    k, v, r = _rows(k), _rows(v), _rows(r)
    qc, rc = (qc.contiguous(), _rows(rc)) if g.C > 0 else (qv, r)  # unread when there is no compressed stream
    kv = key_valid.contiguous().view(torch.uint8)
    out = torch.empty((g.B, g.H, g.T, g.dh), dtype=qu.dtype, device=qu.device)
    lse = torch.empty((g.B, g.H, g.T), dtype=torch.float32, device=qu.device)
    nq = triton.cdiv(g.T, block)
    with g.launch_context():
        _forward_kernel[(nq, g.B * g.H)](
            qu, qv, qc, k, v, r, rc, kv, out, lse, g.scratch(nq * g.B * g.H),
            *k.stride()[:3], *v.stride()[:3], *r.stride()[:2], *rc.stride()[:2], kv.stride(0),
            g.H, g.T, g.C, g.M, r.shape[1], rc.shape[1], g.dh, g.win, HAS_C=g.C > 0, **g.meta,
        )  # fmt: skip
    return out, lse


@dataclass(frozen=True)
class _Stream:
    """One positional stream: its queries, table, first key slot and number of keys."""

    qp: Tensor
    table: Tensor
    key0: int
    n_keys: int
    mem: bool  # the memory + segment stream (causal, windowed)


def _streams(g: _Geometry, qv: Tensor, r: Tensor, qc: Tensor | None, rc: Tensor | None) -> list[_Stream]:
    mem = _Stream(qv, r, g.C, g.M + g.T, True)
    return [_Stream(qc, rc, 0, g.C, False), mem] if g.C > 0 else [mem]


def _key_grads(g: _Geometry, s: _Stream, qu, k, v, kv, grad, lse, di, dk, dv) -> None:
    """dk, dv of the stream's keys: one program per (key block, b, h)."""
    nk = triton.cdiv(s.n_keys, g.block)
    _key_grad_kernel[(nk, g.B * g.H)](
        qu, s.qp, k, v, s.table, kv, grad, lse, di, dk, dv, g.scratch(nk * g.B * g.H),
        *k.stride()[:3], *v.stride()[:3], *s.table.stride()[:2], kv.stride(0),
        g.H, g.T, g.M, s.table.shape[1], s.key0, s.n_keys, g.K, g.dh, g.win, MEM=s.mem, **g.meta,
    )  # fmt: skip


def _diagonals(g: _Geometry, s: _Stream) -> tuple[int, int]:
    """The first diagonal block offset (key block - query block) whose tiles may hold an allowed key, and their
    number: all of them for the compressed stream; causal and window-bounded for memory + segment."""
    lo, hi = 1 - triton.cdiv(g.T, g.block), triton.cdiv(s.n_keys, g.block) - 1
    if s.mem:  # tile distances span M - delta*block -+ (block - 1): some must lie in [0, win]
        lo = max(lo, -((g.win + g.block - 1 - g.M) // g.block))
        hi = min(hi, (g.M + g.block - 1) // g.block)
    return lo, max(hi - lo + 1, 0)


def _table_grad(g: _Geometry, s: _Stream, qu, k, v, kv, grad, lse, di) -> Tensor:
    """The stream's table gradient: partial bands per (split, h, diagonal), folded."""
    delta0, n_delta = _diagonals(g, s)
    D = g.meta["D"]
    if g.device.type == "cuda":  # enough programs to fill the GPU about four times
        sms = torch.cuda.get_device_properties(g.device).multi_processor_count
        splits = min(g.B, max(1, triton.cdiv(4 * sms, max(n_delta * g.H, 1))))
    else:
        splits = min(g.B, 2)
    part = torch.empty((splits, g.H, n_delta, 2 * g.block, D), dtype=torch.float32, device=g.device)
    if n_delta > 0:
        _table_grad_kernel[(n_delta, g.H, splits)](
            qu, s.qp, k, v, s.table, kv, grad, lse, di, part, g.scratch(n_delta * g.H * splits),
            *k.stride()[:3], *v.stride()[:3], *s.table.stride()[:2], kv.stride(0),
            g.B, g.H, g.T, g.M, s.table.shape[1], s.key0, s.n_keys, g.dh, g.win, delta0, splits,
            MEM=s.mem, **g.meta,
        )  # fmt: skip
    return fold_bands(part[..., : g.dh], delta0, g.block, g.T, s.table.shape[1]).to(s.table.dtype)


def fold_bands(part: Tensor, delta0: int, block: int, T: int, n_rows: int) -> Tensor:
    """Overlap-add partial bands (splits, H, n, 2 block, dh) into a table gradient (H, n_rows, dh): band d starts
    at row (delta0 + d) block + T - block, so its second half and the next band's first half are the same rows."""
    bands = part.sum(0)
    H, n, _, dh = bands.shape
    halves = bands.reshape(H, n, 2, block, dh)
    blocks = bands.new_zeros(H, n + 1, block, dh)
    blocks[:, :n] += halves[:, :, 0]
    blocks[:, 1:] += halves[:, :, 1]
    rows = blocks.reshape(H, (n + 1) * block, dh)
    start = delta0 * block + T - block
    lo, hi = max(start, 0), min(start + rows.shape[1], n_rows)
    out = bands.new_zeros(H, n_rows, dh)
    if hi > lo:
        out[:, lo:hi] = rows[:, lo - start : hi - start]
    return out


def _backward(grad, qu, k, v, qv, r, qc, rc, key_valid, out, lse, n_cmem, window, block) -> tuple[Tensor, ...]:
    """dqu, dk, dv, dqv, dr, dqc, drc (the last two empty without a compressed stream)."""
    g = _geometry(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block)
    qu, qv, grad = qu.contiguous(), qv.contiguous(), grad.contiguous()
    k, v, r = _rows(k), _rows(v), _rows(r)
    qc, rc = (qc.contiguous(), _rows(rc)) if g.C > 0 else (None, None)
    kv = key_valid.contiguous().view(torch.uint8)
    di = (grad.float() * out.float()).sum(-1)  # (B, H, T): rowsum(dO * O)
    dk = torch.empty((g.B, g.H, g.K, g.dh), dtype=k.dtype, device=g.device)
    dv = torch.empty((g.B, g.H, g.K, g.dh), dtype=v.dtype, device=g.device)
    dqu, dqv = torch.empty_like(qu), torch.empty_like(qv)
    dqc = torch.empty_like(qc) if g.C > 0 else qu.new_empty(0)
    streams = _streams(g, qv, r, qc, rc)
    nq = triton.cdiv(g.T, block)
    with g.launch_context():
        for s in streams:
            _key_grads(g, s, qu, k, v, kv, grad, lse, di, dk, dv)
        qc_, rc_, dqc_ = (qc, rc, dqc) if g.C > 0 else (qv, r, dqv)  # unread / unwritten without compression
        _query_grad_kernel[(nq, g.B * g.H)](
            qu, qv, qc_, k, v, r, rc_, kv, grad, lse, di, dqu, dqv, dqc_, g.scratch(nq * g.B * g.H),
            *k.stride()[:3], *v.stride()[:3], *r.stride()[:2], *rc_.stride()[:2], kv.stride(0),
            g.H, g.T, g.C, g.M, r.shape[1], rc_.shape[1], g.dh, g.win, HAS_C=g.C > 0, **g.meta,
        )  # fmt: skip
        tables = [_table_grad(g, s, qu, k, v, kv, grad, lse, di) for s in streams]
    dr = tables[-1]
    drc = tables[0] if g.C > 0 else r.new_empty(0)
    return dqu, dk, dv, dqv, dr, dqc, drc


_INPUTS = "Tensor qu, Tensor k, Tensor v, Tensor qv, Tensor r, Tensor? qc, Tensor? rc, Tensor key_valid"
_SIZES = "SymInt n_cmem, SymInt window, SymInt block"  # SymInt: n_cmem may be a size under dynamic shapes


@torch.library.custom_op(FORWARD_OP, mutates_args=(), schema=f"({_INPUTS}, {_SIZES}) -> (Tensor, Tensor)")
def _forward_op(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block):
    """The attention's output (B, H, T, dh) and the base-2 log-sum-exp of each row's scores (B, H, T), fp32."""
    return _forward(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block)


@_forward_op.register_fake
def _forward_fake(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block):
    g = _geometry(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block)
    return qu.new_empty((g.B, g.H, g.T, g.dh)), qu.new_empty((g.B, g.H, g.T), dtype=torch.float32)


_GRADS = "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"


@torch.library.custom_op(
    BACKWARD_OP, mutates_args=(), schema=f"(Tensor grad, {_INPUTS}, Tensor out, Tensor lse, {_SIZES}) -> {_GRADS}"
)
def _backward_op(grad, qu, k, v, qv, r, qc, rc, key_valid, out, lse, n_cmem, window, block):
    """Gradients of qu, k, v, qv, r, qc, rc (the last two empty when n_cmem == 0)."""
    return _backward(grad, qu, k, v, qv, r, qc, rc, key_valid, out, lse, n_cmem, window, block)


@_backward_op.register_fake
def _backward_fake(grad, qu, k, v, qv, r, qc, rc, key_valid, out, lse, n_cmem, window, block):
    g = _geometry(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block)
    q_like = [qu.new_empty((g.B, g.H, g.T, g.dh)) for _ in range(3)]
    kv = [t.new_empty((g.B, g.H, g.K, g.dh)) for t in (k, v)]
    dr = r.new_empty(tuple(r.shape))
    drc = rc.new_empty(tuple(rc.shape)) if g.C > 0 else r.new_empty(0)
    return q_like[0], kv[0], kv[1], q_like[1], dr, q_like[2] if g.C > 0 else qu.new_empty(0), drc


def _setup_context(ctx, inputs, output) -> None:
    qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block = inputs
    ctx.save_for_backward(qu, k, v, qv, r, qc, rc, key_valid, *output)
    ctx.sizes = (n_cmem, window, block)


def _grads(ctx, grad: Tensor, _grad_lse: Tensor):
    qu, k, v, qv, r, qc, rc, key_valid, out, lse = ctx.saved_tensors
    dqu, dk, dv, dqv, dr, dqc, drc = torch.ops.compressive_transformer.fused_relative_attention_backward(
        grad, qu, k, v, qv, r, qc, rc, key_valid, out, lse, *ctx.sizes
    )
    compressed = qc is not None
    return dqu, dk, dv, dqv, dr, dqc if compressed else None, drc if compressed else None, None, None, None, None


_forward_op.register_autograd(_grads, setup_context=_setup_context)


def default_block(x: Tensor) -> int:
    """The tile size: 64 on a GPU (a 64 x 128 band product per tile on the tensor cores); 32 in Triton's
    interpreter, where every operation costs Python time."""
    return 64 if x.device.type == "cuda" else 32


def fused_relative_attention(
    qu: Tensor,
    k: Tensor,
    v: Tensor,
    qv: Tensor,
    r: Tensor,
    qc: Tensor | None,
    rc: Tensor | None,
    key_valid: Tensor,
    *,
    n_cmem: int,
    window: int = 0,
) -> Tensor:
    """Relative attention of T queries over K = C + M + T keys ``[compressed memory; memory; segment]``, fused:
    (B, H, T, dh) outputs in qu's dtype, differentiable in qu, k, v, qv, r, qc, rc.

    qu, qv, qc: (B, H, T, dh) queries already biased and scaled ((q + u) s, (q + v) s, (q + v_c) s; qc None when
    n_cmem = 0); k, v: (B, H, K, dh); r: (H, >= M + T, dh), row m the projected encoding of distance M + T - 1 - m;
    rc: (H, >= C + T - 1, dh), the compressed stream's own table, row m at distance C + T - 2 - m from its nearest
    (None when n_cmem = 0); key_valid: (B, K) bool, the slots holding real states; n_cmem: C; window: how far back
    a query sees into memory + segment (0: no limit). The scores get no further scaling.
    """
    op = torch.ops.compressive_transformer.fused_relative_attention
    return op(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, default_block(qu))[0]
