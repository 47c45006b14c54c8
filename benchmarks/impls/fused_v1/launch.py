"""The first fused relative attention (before its kernels kept the relative shift in registers), frozen as it was
so that ``benchmarks/fused_attention.py`` and ``benchmarks/kernel_compile.py`` can measure the current kernels against
it. Its kernels are unchanged: the forward, three backward passes (key, query and table gradients), a per-program
global scratch buffer for the shift between barriers (which forces ``num_stages=1``), 64 x 64 tiles on CUDA; they
share only the generic helpers (loads, stores, products, the online-softmax step) with today's. The launching around
them is reduced to what a benchmark needs: a ``torch.autograd.Function`` (no custom op; the current kernel's argument
checks), each launch through :func:`_launch`, CPU tensors through Triton's interpreter.

    fused_relative_attention_v1(qu, k, v, qv, r, qc, rc, key_valid, n_cmem=C, window=0)

takes what :func:`compressive_transformer.core.kernels.fused_triton.fused_relative_attention` takes.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from compressive_transformer.core.kernels.fused_triton import _geometry as _sizes
from compressive_transformer.core.kernels.fused_triton_tiles import online_softmax
from compressive_transformer.core.kernels.triton_interpreter import interpreted

from .backward import _key_grad_kernel, _query_grad_kernel, _table_grad_kernel
from .tiles import dense, key_block, load_rows, memory_keys, query_program, store_rows, tl, triton


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
        m_i, l_i, acc = online_softmax(m_i, l_i, acc, tl.where(ok, s, float("-inf")), v, PREC)
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
    """The sizes of one call (the current kernel's checks and sizes) and the first kernel's tile."""

    sizes: object  # the current kernel's _Geometry: B, H, T, K, dh, C, M, win, device, dtype
    block: int

    def __getattr__(self, name: str):
        return getattr(self.sizes, name)

    @property
    def meta(self) -> dict:
        """Constexprs and launch settings. One pipeline stage: the scratch shift must not be software-pipelined."""
        D = max(16, triton.next_power_of_2(self.dh))
        prec = "ieee" if self.dtype == torch.float32 else "tf32" if self.device.type == "cuda" else "widen"
        warps = 8 if self.block >= 64 else 4
        return dict(BLOCK=self.block, D=D, PREC=prec, num_warps=warps, num_stages=1)

    def scratch(self, programs: int) -> Tensor:
        """2 BLOCK^2 fp32 of shift scratch per program (each program's own, so no two programs share any)."""
        return torch.empty(programs * 2 * self.block**2, dtype=torch.float32, device=self.device)


def _geometry(qu, k, v, qv, r, qc, rc, key_valid, n_cmem: int, window: int) -> _Geometry:
    sizes = _sizes(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, 0, 0)
    return _Geometry(sizes, 32 if qu.device.type == "cpu" else 64)  # 32: in the interpreter (CPU tensors)


def _launch(kernel, grid: tuple, args: tuple, meta: dict, device: torch.device) -> None:
    """Every launch goes through here (``benchmarks/kernel_compile.py`` records them without a GPU)."""
    (kernel if device.type == "cuda" else interpreted(kernel))[grid](*args, **meta)


def _forward(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window) -> tuple[Tensor, Tensor]:
    g = _geometry(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window)
    qc, rc = (qc, rc) if g.C > 0 else (qv, r)  # unread when there is no compressed stream
    kv = key_valid.view(torch.uint8)
    out = torch.empty((g.B, g.H, g.T, g.dh), dtype=qu.dtype, device=qu.device)
    lse = torch.empty((g.B, g.H, g.T), dtype=torch.float32, device=qu.device)
    nq = triton.cdiv(g.T, g.block)
    args = (
        qu, qv, qc, k, v, r, rc, kv, out, lse, g.scratch(nq * g.B * g.H),
        *k.stride()[:3], *v.stride()[:3], *r.stride()[:2], *rc.stride()[:2], kv.stride(0),
        g.H, g.T, g.C, g.M, r.shape[1], rc.shape[1], g.dh, g.win,
    )  # fmt: skip
    _launch(_forward_kernel, (nq, g.B * g.H), args, dict(HAS_C=g.C > 0, **g.meta), g.device)
    return out, lse


@dataclass(frozen=True)
class _Stream:
    """One positional stream: its queries, table, first key slot and number of keys."""

    qp: Tensor
    table: Tensor
    key0: int
    n_keys: int
    mem: bool  # the memory + segment stream (causal, windowed)


def _key_grads(g: _Geometry, s: _Stream, qu, k, v, kv, grad, lse, di, dk, dv) -> None:
    """dk, dv of the stream's keys: one program per (key block, b, h)."""
    nk = triton.cdiv(s.n_keys, g.block)
    args = (
        qu, s.qp, k, v, s.table, kv, grad, lse, di, dk, dv, g.scratch(nk * g.B * g.H),
        *k.stride()[:3], *v.stride()[:3], *s.table.stride()[:2], kv.stride(0),
        g.H, g.T, g.M, s.table.shape[1], s.key0, s.n_keys, g.K, g.dh, g.win,
    )  # fmt: skip
    _launch(_key_grad_kernel, (nk, g.B * g.H), args, dict(MEM=s.mem, **g.meta), g.device)


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
        args = (
            qu, s.qp, k, v, s.table, kv, grad, lse, di, part, g.scratch(n_delta * g.H * splits),
            *k.stride()[:3], *v.stride()[:3], *s.table.stride()[:2], kv.stride(0),
            g.B, g.H, g.T, g.M, s.table.shape[1], s.key0, s.n_keys, g.dh, g.win, delta0, splits,
        )  # fmt: skip
        _launch(_table_grad_kernel, (n_delta, g.H, splits), args, dict(MEM=s.mem, **g.meta), g.device)
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


def _backward(grad, qu, k, v, qv, r, qc, rc, key_valid, out, lse, n_cmem, window) -> tuple[Tensor, ...]:
    """dqu, dk, dv, dqv, dr, dqc, drc (the last two None without a compressed stream)."""
    g = _geometry(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window)
    grad = grad.contiguous()
    kv = key_valid.view(torch.uint8)
    di = (grad.float() * out.float()).sum(-1)  # (B, H, T): rowsum(dO * O)
    dk = torch.empty((g.B, g.H, g.K, g.dh), dtype=k.dtype, device=g.device)
    dv = torch.empty((g.B, g.H, g.K, g.dh), dtype=v.dtype, device=g.device)
    dqu, dqv = torch.empty_like(qu), torch.empty_like(qv)
    dqc = torch.empty_like(qc) if g.C > 0 else dqv
    mem = _Stream(qv, r, g.C, g.M + g.T, True)
    streams = [_Stream(qc, rc, 0, g.C, False), mem] if g.C > 0 else [mem]
    nq = triton.cdiv(g.T, g.block)
    for s in streams:
        _key_grads(g, s, qu, k, v, kv, grad, lse, di, dk, dv)
    qc_, rc_ = (qc, rc) if g.C > 0 else (qv, r)  # unread / unwritten without compression
    args = (
        qu, qv, qc_, k, v, r, rc_, kv, grad, lse, di, dqu, dqv, dqc, g.scratch(nq * g.B * g.H),
        *k.stride()[:3], *v.stride()[:3], *r.stride()[:2], *rc_.stride()[:2], kv.stride(0),
        g.H, g.T, g.C, g.M, r.shape[1], rc_.shape[1], g.dh, g.win,
    )  # fmt: skip
    _launch(_query_grad_kernel, (nq, g.B * g.H), args, dict(HAS_C=g.C > 0, **g.meta), g.device)
    tables = [_table_grad(g, s, qu, k, v, kv, grad, lse, di) for s in streams]
    compressed = g.C > 0
    return dqu, dk, dv, dqv, tables[-1], dqc if compressed else None, tables[0] if compressed else None


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window):
        qu, qv, k, v, r = (t.contiguous() for t in (qu, qv, k, v, r))
        qc, rc = (qc.contiguous(), rc.contiguous()) if n_cmem > 0 else (None, None)
        out, lse = _forward(qu, k, v, qv, r, qc, rc, key_valid.contiguous(), n_cmem, window)
        ctx.save_for_backward(qu, k, v, qv, r, qc, rc, key_valid.contiguous(), out, lse)
        ctx.sizes = (n_cmem, window)
        return out

    @staticmethod
    def backward(ctx, grad):
        qu, k, v, qv, r, qc, rc, key_valid, out, lse = ctx.saved_tensors
        grads = _backward(grad, qu, k, v, qv, r, qc, rc, key_valid, out, lse, *ctx.sizes)
        return (*grads, None, None, None)


def fused_relative_attention_v1(qu, k, v, qv, r, qc, rc, key_valid, *, n_cmem: int, window: int = 0) -> Tensor:
    """The first fused kernel's output (B, H, T, dh), differentiable in qu, k, v, qv, r, qc, rc."""
    return _Attention.apply(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window)
