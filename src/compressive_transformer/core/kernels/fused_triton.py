"""Relative-position attention over ``[compressed memory; memory; segment]`` fused in Triton, forward and backward,
without a (B, H, T, K) score, probability or gradient matrix in memory.

For query i and key j (C compressed keys, then M memory keys, then the T segment keys), with the queries already
biased and scaled by the caller (qu = (q + u) s, qv = (q + v) s, qc = (q + v_c) s):

    score = qu_i . k_j + qc_i . rc[j - i + T - 1]          (j < C, the compressed stream's own table)
                       + qv_i . r[(j - C) - i + T - 1]      (j >= C, memory + segment)

so row m of r encodes distance M + T - 1 - m and rc's rows descend in distance likewise. Key j is
allowed where ``key_valid[b, j]`` holds and, in the memory + segment stream, it is not in the future and at most
``window`` back (0: no limit); a query always sees itself. The positional term is computed inside each tile from the
queries and a band of table rows (:mod:`.fused_triton_tiles`); the forward is :mod:`.fused_triton_fwd`, the backward
(two passes, the tables' gradients in the second) :mod:`.fused_triton_bwd`.

Tiles: on CUDA each kernel runs the fastest of a few tile configurations (query and key block, warps, pipeline
stages), measured on the first call of each shape; on CPU tensors the kernels run through Triton's interpreter
(:mod:`.triton_interpreter`) with one small configuration. Either can be fixed per call (``block_m``, ``block_n``).

:func:`fused_relative_attention` is a ``torch.library`` custom op (``compressive_transformer::fused_relative_attention``
and its ``..._backward``) with fake implementations and autograd, so ``torch.compile(fullgraph=True)`` traces it
whole and CUDA graphs can capture it: nothing on its path synchronises with the host once each shape has been seen.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from compressive_transformer.core.kernels.fused_triton_bwd import key_value_grad_kernel, query_grad_kernel
from compressive_transformer.core.kernels.fused_triton_fwd import forward_kernel
from compressive_transformer.core.kernels.fused_triton_tiles import triton
from compressive_transformer.core.kernels.triton_interpreter import interpreted

NAMESPACE = "compressive_transformer"
FORWARD_OP = f"{NAMESPACE}::fused_relative_attention"
BACKWARD_OP = f"{NAMESPACE}::fused_relative_attention_backward"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BLOCKS = (16, 32, 64, 128)  # tile sides: powers of two, >= 16 for tl.dot
MAX_HEAD_DIM = 128


@dataclass(frozen=True)
class Tiles:
    """One launch configuration: BLOCK_M rows (queries) by BLOCK_N columns (keys) per tile, warps, pipeline stages.
    A tile's band of table rows is R + 1 chunks of BLOCK_N rows, R = max(BLOCK_M // BLOCK_N, 1) <= 2."""

    block_m: int
    block_n: int
    warps: int = 4
    stages: int = 2

    @property
    def kwargs(self) -> dict:
        """The tile constexprs: the blocks, R (chunks a query walk carries) and BAND (the rows of a key walk's band,
        >= BLOCK_M + BLOCK_N - 1, a power of 2)."""
        band = triton.next_power_of_2(self.block_m + self.block_n)
        return dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n, R=max(self.block_m // self.block_n, 1), BAND=band)

    def transposed(self) -> Tiles:
        """The key pass's tiles for these query-pass tiles: as many keys per program as there were queries."""
        return Tiles(self.block_n, self.block_m, self.warps, self.stages)


# Tried on the first call of each shape on CUDA, each kernel over its own; the first is taken untimed for small
# shapes and inside CUDA graph captures. Chosen by the rule in benchmarks/kernel_compile.py (compiled for sm_90 at
# the `gpu` shape: no spilled register stored or reloaded inside a tile loop, and the pass's tensor-core work within
# 10% of 64 x 64 tiles'), which both backward passes' 64 x 64 tiles fail (results/kernel_sm90.md); three of those are
# timed all the same (KEY_TIMED_DESPITE_SPILLS, TIMED_DESPITE_SPILLS).
FORWARD_TILES = (
    Tiles(64, 32, 4, 2), Tiles(64, 32, 4, 3), Tiles(64, 32, 8, 2), Tiles(64, 64, 8, 2), Tiles(64, 64, 8, 3),
)  # fmt: skip
# The backward passes' 64 x 64 tiles spill inside their loops but multiply with Hopper's warpgroup products (wgmma),
# which the spill-free smaller tiles mostly do not; which wins is a question of time, so the tuning times both kinds.
KEY_TIMED_DESPITE_SPILLS = (Tiles(64, 64, 8, 3),)
TIMED_DESPITE_SPILLS = (Tiles(64, 64, 4, 2), Tiles(64, 64, 8, 2))  # the query pass's
# the key pass's own: BLOCK_M queries by BLOCK_N keys; it holds a key block and walks the query blocks
KEY_TILES = (
    Tiles(32, 64, 8, 2), Tiles(32, 64, 8, 3), *KEY_TIMED_DESPITE_SPILLS, Tiles(32, 32, 4, 2), Tiles(32, 32, 4, 3),
)  # fmt: skip
# 64 x 32 at 8 warps: 64-row tiles (wgmma, half the atomics of 32 x 64 per tile) with no spill inside their loops
QUERY_GRAD_TILES = (
    Tiles(32, 64, 8, 2), Tiles(32, 64, 8, 3), Tiles(16, 32, 4, 2), Tiles(64, 32, 8, 2), *TIMED_DESPITE_SPILLS,
)  # fmt: skip
INTERPRETER_TILES = Tiles(32, 32)  # in the interpreter every operation costs Python time: few, mid-sized tiles


TUNED_WORK = 512 * 512  # (queries x keys) per head from which the configs are timed against each other


def _configs_worth_timing(configs, named_args, **kwargs):
    """The configs to time for a shape: all of them, except inside a CUDA graph capture (timing would synchronise)
    and for small shapes (a few tiles per head, where the first config is as good and the others need not compile),
    where the first one is taken untimed."""
    keys = named_args["n_keys"] if "n_keys" in named_args else named_args["C"] + named_args["M"] + named_args["T"]
    small = named_args["T"] * keys < TUNED_WORK
    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    return configs[:1] if small or capturing else configs


class TiledKernel:
    """A Triton kernel with its tile configurations: on CUDA the fastest for each shape (``key``: the arguments that
    name a shape; ``zeroed``: outputs it adds to, zeroed before each timed run) or a given one; on the CPU a given one
    through the interpreter."""

    def __init__(self, fn, configs: tuple[Tiles, ...], key: list[str], zeroed: tuple[str, ...] = ()) -> None:
        self.fn, self.configs, self.key, self.zeroed = fn, configs, key, zeroed

    def constexprs(self, tiles: Tiles) -> dict:
        """The tile constexprs this kernel takes."""
        return {k: v for k, v in tiles.kwargs.items() if k in self.fn.arg_names}

    def triton_configs(self) -> list:
        """The tuned configurations as the autotuner holds them."""
        return [triton.Config(self.constexprs(t), num_warps=t.warps, num_stages=t.stages) for t in self.configs]

    def compile_only(self, grid, args: tuple, meta: dict, config) -> None:
        """Compile (into Triton's cache) what the tuning would launch with ``config``, without launching it: the same
        arguments and options, so the same specialisation and the same cache entry (a prepared check compiles every
        configuration in parallel before anything is tuned)."""
        self.fn.run(*args, grid=grid, warmup=True, **meta, **config.all_kwargs())

    @functools.cached_property
    def tuned(self):
        configs = self.triton_configs()
        prune = {"early_config_prune": _configs_worth_timing}
        return triton.autotune(configs, key=self.key, reset_to_zero=list(self.zeroed), prune_configs_by=prune)(self.fn)

    def __call__(self, grid: Callable[[dict], tuple], args: tuple, meta: dict, device: torch.device, tiles) -> None:
        if device.type == "cuda" and tiles is None:
            self.tuned[grid](*args, **meta)
            return
        fn = self.fn if device.type == "cuda" else interpreted(self.fn)
        tile = self.constexprs(tiles)
        fn[grid(tile)](*args, **meta, **tile, num_warps=tiles.warps, num_stages=tiles.stages)


FORWARD = TiledKernel(forward_kernel, FORWARD_TILES, key=["T", "C", "M", "dh"])
KEY_GRADS = TiledKernel(key_value_grad_kernel, KEY_TILES, key=["T", "M", "n_keys", "dh", "MEM"])
QUERY_GRADS = TiledKernel(query_grad_kernel, QUERY_GRAD_TILES, key=["T", "C", "M", "dh"], zeroed=("DRM", "DRC"))


def _launch(kernel: TiledKernel, grid, args: tuple, meta: dict, device: torch.device, tiles: Tiles | None) -> None:
    """Every launch goes through here (``benchmarks/kernel_compile.py`` records them without a GPU)."""
    kernel(grid, args, meta, device, tiles)


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
    query_tiles: Tiles | None  # None: tuned (CUDA)
    device: torch.device
    dtype: torch.dtype

    @property
    def key_tiles(self) -> Tiles | None:
        return None if self.query_tiles is None else self.query_tiles.transposed()

    @property
    def meta(self) -> dict:
        D = max(16, triton.next_power_of_2(self.dh))
        prec = "ieee" if self.dtype == torch.float32 else "tf32" if self.device.type == "cuda" else "widen"
        return dict(D=D, PREC=prec)

    def query_grid(self) -> Callable[[dict], tuple]:
        return lambda meta: (triton.cdiv(self.T, meta["BLOCK_M"]), self.B * self.H)

    def key_grid(self, n_keys: int) -> Callable[[dict], tuple]:
        return lambda meta: (triton.cdiv(n_keys, meta["BLOCK_N"]), self.B * self.H)

    def launch_context(self):
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()


def _fail(message: str) -> None:
    raise ValueError(f"fused_relative_attention: {message}")


def _tiles(device: torch.device, block_m: int, block_n: int) -> Tiles | None:
    """The query pass's tiles of a call: tuned on CUDA when neither block is given, else the given ones."""
    if block_m == 0 and block_n == 0:
        return None if device.type == "cuda" else INTERPRETER_TILES
    if block_m not in BLOCKS or block_n not in BLOCKS or max(block_m, block_n) > 2 * min(block_m, block_n):
        _fail(f"blocks must be in {BLOCKS} and within a factor 2 of each other, got {block_m} x {block_n}")
    return Tiles(block_m, block_n, warps=4 if block_m * block_n <= 64 * 64 else 8)


def _geometry(qu, k, v, qv, r, qc, rc, key_valid, n_cmem: int, window: int, block_m: int, block_n: int) -> _Geometry:
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
    if dh > MAX_HEAD_DIM:
        _fail(f"needs head dim <= {MAX_HEAD_DIM}, got dh={dh}")
    if B * H > 65535:  # the grids' second axis
        _fail(f"needs B * H <= 65535, got {B * H}: split the batch")
    if any(t.device != qu.device for t in tensors + [key_valid]):
        _fail("all tensors must be on one device")
    win = window if window > 0 else M + T
    tiles = _tiles(qu.device, block_m, block_n)
    return _Geometry(B, H, T, K, dh, C, M, win, tiles, qu.device, qu.dtype)


LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453


def _base2(q: Tensor) -> Tensor:
    """Queries times log2(e), contiguous: the kernels' scores come out in base 2 (exp2) without a multiply per
    score; the key and table gradients they take against these queries are scaled back (by ln 2)."""
    return torch.mul(q, LOG2E, out=torch.empty(q.shape, dtype=q.dtype, device=q.device))  # one pass, any strides


ROW_STRIDE_LIMIT = 2**31 // max(BLOCKS)  # a tile's offsets from its first row are 32-bit


def _rows(t: Tensor) -> Tensor:
    """t with unit stride along its last dim (the kernels' tiles read rows) and rows close enough that a tile's
    offsets from its first row fit in 32 bits."""
    return t if t.stride(-1) == 1 and t.stride(-2) < ROW_STRIDE_LIMIT else t.contiguous()


BAND_PAD = 256  # zero rows after each table the key pass reads: at least every allowed tile's band reach


def band_reach(tiles: Tiles) -> int:
    """How many rows past a table's last real row the key pass's band may read with these tiles: a tile's band
    starts at row n0 - i0 + T - BLOCK_M and has BAND rows; the compressed stream's keys n0 < C read a table of
    >= C + T - 1 rows (BAND - BLOCK_M past it), and a memory + segment key block n0 is read by query blocks from
    (n0 - M) rounded down to BLOCK_M, so n0 - i0 <= M + BLOCK_M - 1 against >= M + T rows (BAND - 1 past it)."""
    return tiles.kwargs["BAND"] - 1


def _band_table(table: Tensor, tiles: tuple[Tiles, ...]) -> Tensor:
    """table (H, rows, dh) followed by BAND_PAD zero rows, for the key pass: its tiles' bands may run past the last
    real row, and reading zeros there inside the allocation spares every tile whose queries are below T a row mask
    (those rows only meet keys that the tile's mask or the keys' bias removes)."""
    reach = max(band_reach(t) for t in tiles)
    assert reach <= BAND_PAD, f"a key pass band reaches {reach} rows past its table, padded by {BAND_PAD}"
    return torch.nn.functional.pad(table, (0, 0, 0, BAND_PAD))


def _key_bias(key_valid: Tensor, n_cmem: int) -> tuple[Tensor, int]:
    """The keys' additive bias, fp32: 0 where a slot holds a state, -inf where it is empty (a tile adds it to its
    scores: one load and one add per score, no compare and select), each stream's padded with -inf to a whole number
    of the largest blocks (no tile's load of it needs a mask): (B, >= K) and the column where the memory + segment
    stream's starts."""
    B, K = key_valid.shape
    kb_mem = triton.cdiv(n_cmem, max(BLOCKS)) * max(BLOCKS)
    width = kb_mem + triton.cdiv(K - n_cmem, max(BLOCKS)) * max(BLOCKS)
    kb = torch.full((B, width), float("-inf"), device=key_valid.device)
    kb[:, :n_cmem].masked_fill_(key_valid[:, :n_cmem], 0.0)
    kb[:, kb_mem : kb_mem + K - n_cmem].masked_fill_(key_valid[:, n_cmem:], 0.0)
    return kb, kb_mem


def _forward(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block_m, block_n) -> tuple[Tensor, Tensor]:
    g = _geometry(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block_m, block_n)
    qu, qv = _base2(qu), _base2(qv)
    k, v, r = _rows(k), _rows(v), _rows(r)
    qc, rc = (_base2(qc), _rows(rc)) if g.C > 0 else (qv, r)  # unread when there is no compressed stream
    kb, kb_mem = _key_bias(key_valid, g.C)
    out = torch.empty((g.B, g.H, g.T, g.dh), dtype=qu.dtype, device=qu.device)
    lse = torch.empty((g.B, g.H, g.T), dtype=torch.float32, device=qu.device)
    args = (
        qu, qv, qc, k, v, r, rc, kb, out, lse,
        *k.stride()[:3], *v.stride()[:3], *r.stride()[:2], *rc.stride()[:2], kb.stride(0),
        g.H, g.T, g.C, g.M, r.shape[1], rc.shape[1], g.dh, g.win, kb_mem,
    )  # fmt: skip
    with g.launch_context():
        _launch(FORWARD, g.query_grid(), args, dict(HAS_C=g.C > 0, **g.meta), g.device, g.query_tiles)
    return out, lse


def _backward(grad, qu, k, v, qv, r, qc, rc, key_valid, out, lse, n_cmem, window, block_m, block_n):
    """dqu, dk, dv, dqv, dr, dqc, drc (the last two empty without a compressed stream)."""
    g = _geometry(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block_m, block_n)
    qu, qv, grad = _base2(qu), _base2(qv), grad.contiguous()
    k, v, r = _rows(k), _rows(v), _rows(r)
    qc, rc = (_base2(qc), _rows(rc)) if g.C > 0 else (None, None)
    kb, kb_mem = _key_bias(key_valid, g.C)
    di = (grad.float() * out.float()).sum(-1)  # (B, H, T): rowsum(dO * O)
    dk = torch.empty((g.B, g.H, g.K, g.dh), dtype=k.dtype, device=g.device)
    dv = torch.empty((g.B, g.H, g.K, g.dh), dtype=v.dtype, device=g.device)
    dqu, dqv = torch.empty_like(qu), torch.empty_like(qv)
    dqc = torch.empty_like(qc) if g.C > 0 else qu.new_empty(0)
    drm = torch.zeros((g.H, r.shape[1], g.dh), dtype=torch.float32, device=g.device)  # atomically added to
    drc = torch.zeros((g.H, rc.shape[1], g.dh), dtype=torch.float32, device=g.device) if g.C > 0 else drm
    streams = [(qc, rc, 0, g.C, 0, False)] if g.C > 0 else []
    streams.append((qv, r, g.C, g.M + g.T, kb_mem, True))
    key_tiles = KEY_GRADS.configs if g.key_tiles is None else (g.key_tiles,)
    with g.launch_context():
        for qp, table, key0, n_keys, kb0, mem in streams:
            band = _band_table(table, key_tiles)
            args = (
                qu, qp, k, v, band, kb[:, kb0:], grad, lse, di, dk, dv,
                *k.stride()[:3], *v.stride()[:3], *band.stride()[:2], kb.stride(0),
                g.H, g.T, g.M, table.shape[1], key0, n_keys, g.K, g.dh, g.win,
            )  # fmt: skip
            _launch(KEY_GRADS, g.key_grid(n_keys), args, dict(MEM=mem, **g.meta), g.device, g.key_tiles)
        qc_, rc_, dqc_ = (qc, rc, dqc) if g.C > 0 else (qv, r, dqv)  # unread / unwritten without compression
        args = (
            qu, qv, qc_, k, v, r, rc_, kb, grad, lse, di, dqu, dqv, dqc_, drm, drc,
            *k.stride()[:3], *v.stride()[:3], *r.stride()[:2], *rc_.stride()[:2], kb.stride(0),
            g.H, g.T, g.C, g.M, r.shape[1], rc_.shape[1], g.dh, g.win, kb_mem,
        )  # fmt: skip
        _launch(QUERY_GRADS, g.query_grid(), args, dict(HAS_C=g.C > 0, **g.meta), g.device, g.query_tiles)
    dr = (drm * LN2).to(r.dtype)  # taken against the base-2 queries
    drc = (drc * LN2).to(rc.dtype) if g.C > 0 else r.new_empty(0)
    return dqu, dk, dv, dqv, dr, dqc, drc


_INPUTS = "Tensor qu, Tensor k, Tensor v, Tensor qv, Tensor r, Tensor? qc, Tensor? rc, Tensor key_valid"
_SIZES = "SymInt n_cmem, SymInt window, SymInt block_m, SymInt block_n"  # SymInt: n_cmem may be a size


@torch.library.custom_op(FORWARD_OP, mutates_args=(), schema=f"({_INPUTS}, {_SIZES}) -> (Tensor, Tensor)")
def _forward_op(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block_m, block_n):
    """The attention's output (B, H, T, dh) and the base-2 log-sum-exp of each row's scores (B, H, T), fp32."""
    return _forward(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block_m, block_n)


@_forward_op.register_fake
def _forward_fake(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block_m, block_n):
    g = _geometry(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block_m, block_n)
    return qu.new_empty((g.B, g.H, g.T, g.dh)), qu.new_empty((g.B, g.H, g.T), dtype=torch.float32)


_GRADS = "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"


@torch.library.custom_op(
    BACKWARD_OP, mutates_args=(), schema=f"(Tensor grad, {_INPUTS}, Tensor out, Tensor lse, {_SIZES}) -> {_GRADS}"
)
def _backward_op(grad, qu, k, v, qv, r, qc, rc, key_valid, out, lse, n_cmem, window, block_m, block_n):
    """Gradients of qu, k, v, qv, r, qc, rc (the last two empty when n_cmem == 0)."""
    return _backward(grad, qu, k, v, qv, r, qc, rc, key_valid, out, lse, n_cmem, window, block_m, block_n)


@_backward_op.register_fake
def _backward_fake(grad, qu, k, v, qv, r, qc, rc, key_valid, out, lse, n_cmem, window, block_m, block_n):
    g = _geometry(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block_m, block_n)
    q_like = [qu.new_empty((g.B, g.H, g.T, g.dh)) for _ in range(3)]
    kv = [t.new_empty((g.B, g.H, g.K, g.dh)) for t in (k, v)]
    dr = r.new_empty(tuple(r.shape))
    drc = rc.new_empty(tuple(rc.shape)) if g.C > 0 else r.new_empty(0)
    return q_like[0], kv[0], kv[1], q_like[1], dr, q_like[2] if g.C > 0 else qu.new_empty(0), drc


def _setup_context(ctx, inputs, output) -> None:
    qu, k, v, qv, r, qc, rc, key_valid, *sizes = inputs
    ctx.save_for_backward(qu, k, v, qv, r, qc, rc, key_valid, *output)
    ctx.sizes = tuple(sizes)


def _grads(ctx, grad: Tensor, _grad_lse: Tensor):
    qu, k, v, qv, r, qc, rc, key_valid, out, lse = ctx.saved_tensors
    dqu, dk, dv, dqv, dr, dqc, drc = torch.ops.compressive_transformer.fused_relative_attention_backward(
        grad, qu, k, v, qv, r, qc, rc, key_valid, out, lse, *ctx.sizes
    )
    compressed = qc is not None
    grads = (dqu, dk, dv, dqv, dr, dqc if compressed else None, drc if compressed else None)
    return grads + (None,) * (1 + len(ctx.sizes))


_forward_op.register_autograd(_grads, setup_context=_setup_context)


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
    block_m: int = 0,
    block_n: int = 0,
) -> Tensor:
    """Relative attention of T queries over K = C + M + T keys ``[compressed memory; memory; segment]``, fused:
    (B, H, T, dh) outputs in qu's dtype, differentiable in qu, k, v, qv, r, qc, rc.

    qu, qv, qc: (B, H, T, dh) queries already biased and scaled ((q + u) s, (q + v) s, (q + v_c) s; qc None when
    n_cmem = 0); k, v: (B, H, K, dh); r: (H, >= M + T, dh), row m the projected encoding of distance M + T - 1 - m;
    rc: (H, >= C + T - 1, dh), the compressed stream's own table, row m at distance C + T - 2 - m from its nearest
    (None when n_cmem = 0); key_valid: (B, K) bool, the slots holding real states; n_cmem: C; window: how far back
    a query sees into memory + segment (0: no limit). The scores get no further scaling. block_m, block_n: fixed
    query and key blocks (both 0: tuned per shape on CUDA, 32 x 32 in the CPU interpreter).
    """
    op = torch.ops.compressive_transformer.fused_relative_attention
    return op(qu, k, v, qv, r, qc, rc, key_valid, n_cmem, window, block_m, block_n)[0]
