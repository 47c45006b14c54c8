"""The fused attention's kernels compiled for an H100 (sm_90) without a GPU: what Triton's compiler output says about
each kernel, the frozen first kernel (``benchmarks/impls/fused_v1``) against the current one (and a plain
attention forward with the same tiles, the floor), and how much tensor-core work each design does at the ``gpu``
workload's shape.

    python -m benchmarks.kernel_compile [--out benchmarks/results/kernel_sm90] [--before results/kernel_sm90_6c1d1bc.json]

``--before``: the tuned configurations' rows compiled from an earlier commit (``results/kernel_sm90_6c1d1bc.json``:
the kernels before issue 52's cheap work), compared per tile with the current ones in a last table.

``--only KERNEL`` (``forward_kernel``, ``key_value_grad_kernel``, ``query_grad_kernel``), optionally with ``--config
I`` (the index of one of its tuned configurations): compiles just those, in every variant, and prints their rows
(with ``--before``, their before / after rows); writes nothing. For iterating on one kernel: a full run compiles
about a hundred kernels.

It compiles with the Triton it imports: ``results/kernel_sm90_triton36.*`` came from Triton 3.6 (PyTorch 2.11's)
installed into a folder of its own (``pip install --no-deps --target DIR triton==3.6.0``) put first on PYTHONPATH.

Each kernel is compiled exactly as a CUDA call at that shape would launch it (bf16; the same arguments, so the same
specialisation: pointers 16-byte aligned, integers divisible by 16 marked so), once per tile configuration it may
run with (the current kernels' tuned configurations; the first kernel's one). Per compiled kernel: shared memory per
program, registers per thread and the bytes spilled (``ptxas -v``), block-wide barriers (``bar.sync`` in the PTX),
tensor-core instructions (``wgmma``), warp shuffles, asynchronous copies (``cp.async``, the software pipeline's
loads), global atomics. Per design: the tile products each pass performs per (b, h) (one product = a (BLOCK_M,
BLOCK_N, dh) matrix product, counted in FLOPs), against the useful work (the allowed (query, key) pairs times three
products forward and eight backward), and the fp32 values added atomically.

Which configurations each kernel is tuned over (``fused_triton``'s ``FORWARD_TILES``, ``KEY_TILES``,
``QUERY_GRAD_TILES``) follows from the last table: each kernel, in all its variants, compiled with its own
configurations and a grid of candidates (tiles, warps, stages), and judged by one rule (:func:`admitted`): no spilled
register stored or reloaded inside a tile loop, and the pass's tensor-core work within 10% of its 64 x 64 tiles'.

What this cannot show: time. Whether the registers' and barriers' savings become speed is measured on a GPU by
``benchmarks/fused_attention.py`` (``bash benchmarks/gpu_check.sh``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from benchmarks.fused_attention import GPU_SHAPE, table_rows
from benchmarks.impls.fused_v1 import launch as first
from compressive_transformer.core.kernels import fused_triton as current

TARGET = GPUTarget("cuda", 90, 32)  # H100 / H200
DTYPE = torch.bfloat16
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.uint8: "u8"}
USEFUL_PRODUCTS = (
    3 + 8
)  # forward: scores, positional, values; backward: both recomputed, dP, dV, dK, dQ, dq_pos, d_table


@dataclass
class Launch:
    """One recorded launch: the kernel function, its arguments, its constexprs, and the configs it may run with."""

    design: str
    fn: object
    args: tuple
    meta: dict
    configs: list[dict]  # each: constexprs (tile sizes) and num_warps / num_stages


@triton.jit
def plain_attention_forward(Q, K, V, OUT, n_keys, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """The floor a tile of the fused forward is compared with: plain attention of one head's query block over its
    keys (no positional term, no mask), the same online softmax and tiles."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    q = tl.load(Q + rows[:, None] * D + cols[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for n0 in range(0, n_keys, BLOCK_N):
        keys = n0 + tl.arange(0, BLOCK_N)
        k = tl.load(K + keys[:, None] * D + cols[None, :])
        v = tl.load(V + keys[:, None] * D + cols[None, :])
        s = tl.dot(q, tl.trans(k)) * 1.4426950408889634
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    tl.store(OUT + rows[:, None] * D + cols[None, :], (acc / l_i[:, None]).to(OUT.dtype.element_ty))


def record_floor(shape: dict) -> list[Launch]:
    T, dh = shape["T"], shape["dh"]
    K = shape["C"] + shape["M"] + T
    q, k = torch.empty(T, dh, dtype=DTYPE, device="meta"), torch.empty(K, dh, dtype=DTYPE, device="meta")
    config = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)
    return [Launch("floor", plain_attention_forward, (q, k, k, q, K - K % 16), {"D": dh}, [config])]


def _inputs(shape: dict) -> tuple:
    """The kernels' inputs at ``shape`` on the meta device (shapes and strides only, nothing allocated)."""
    B, H, T, dh, C, M = (shape[n] for n in ("B", "H", "T", "dh", "C", "M"))
    K = C + M + T

    def t(*s):
        return torch.empty(s, dtype=DTYPE, device="meta")

    qu, k, v, qv, qc = t(B, H, T, dh), t(B, H, K, dh), t(B, H, K, dh), t(B, H, T, dh), t(B, H, T, dh)
    Rm, Rc = table_rows(shape)  # as long as the model's (aligned) where the shape names them
    r, rc = t(H, Rm, dh), t(H, Rc, dh)
    key_valid = torch.empty(B, K, dtype=torch.bool, device="meta")
    return (qu, k, v, qv, r, qc, rc, key_valid), t(B, H, T, dh), torch.empty(B, H, T, device="meta")


def _cuda_meta(meta: dict) -> dict:
    """The constexprs a CUDA call has (a call on the meta device takes the interpreter's product precision)."""
    return {**meta, "PREC": "tf32"} if "PREC" in meta else meta


def record_current(shape: dict) -> list[Launch]:
    launches: list[Launch] = []

    def launch(kernel, grid, args, meta, device, tiles):
        configs = [dict(t.kwargs, num_warps=t.warps, num_stages=t.stages) for t in kernel.configs]
        launches.append(Launch("current", kernel.fn, args, _cuda_meta(meta), configs))

    inputs, grad, lse = _inputs(shape)
    with mock.patch.object(current, "_launch", launch):
        out, _ = current._forward(*inputs, shape["C"], 0, 0, 0)
        current._backward(grad, *inputs, out, lse, shape["C"], 0, 0, 0)
    return launches


def record_first(shape: dict) -> list[Launch]:
    launches: list[Launch] = []

    def launch(kernel, grid, args, meta, device):
        meta = _cuda_meta(dict(meta, BLOCK=64))
        options = dict(num_warps=meta.pop("num_warps"), num_stages=meta.pop("num_stages"))
        launches.append(Launch("first", kernel, args, meta, [options]))

    inputs, grad, lse = _inputs(shape)
    with mock.patch.object(first, "_launch", launch):
        out, _ = first._forward(*inputs, shape["C"], 0)
        first._backward(grad, *inputs, out, lse, shape["C"], 0)
    return launches


def specialise(fn, args: tuple, meta: dict) -> tuple[dict, dict, dict]:
    """Triton's signature, constexprs and attributes for a call with ``args``, as its JIT specialises them."""
    signature, constexprs, attrs = {}, {}, {}
    names = fn.arg_names
    for i, (name, a) in enumerate(zip(names, args)):
        if isinstance(a, torch.Tensor):
            signature[name] = "*" + TYPES[a.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # CUDA allocations (and these views) are 16-byte aligned
        elif a == 1:
            signature[name], constexprs[name] = "constexpr", 1
        else:
            signature[name] = "i32" if -(2**31) <= a < 2**31 else "i64"
            if a % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    for name in names[len(args) :]:
        signature[name], constexprs[name] = "constexpr", meta[name]
    return signature, constexprs, attrs


def _ptxas(ptx: str) -> dict:
    """Registers per thread and spilled bytes, from the ptxas Triton uses for sm_90."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        cmd = [get_ptxas(90).path, "-v", "--gpu-name=sm_90a", str(src), "-o", str(Path(d) / "k.o")]
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", log)
    stores = re.search(r"(\d+) bytes spill stores", log)
    loads = re.search(r"(\d+) bytes spill loads", log)
    return {
        "registers": int(regs.group(1)),
        "spill_store_bytes": int(stores.group(1)),
        "spill_load_bytes": int(loads.group(1)),
    }


def _count(ptx: str, pattern: str) -> int:
    return len(re.findall(pattern, ptx))


def _sass(cubin: bytes) -> str:
    """The machine code (SASS) of a cubin, by the nvdisasm that ships with Triton."""
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.cubin"
        path.write_bytes(cubin)
        return subprocess.run([str(nvdisasm), "-c", str(path)], capture_output=True, text=True, check=True).stdout


def loop_bodies(sass: str) -> list[str]:
    """The bodies of the SASS loops (from a label to the branch back to it) that run tensor-core products: one
    iteration of each is one tile."""
    lines = sass.splitlines()
    labels, bodies = {}, []
    for i, line in enumerate(lines):
        label = re.match(r"^\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = i
        back = re.search(r"\bBRA\b.*?(\.L_x_\d+)", line)
        if back and labels.get(back.group(1), i) < i:
            body = "\n".join(lines[labels[back.group(1)] : i + 1])
            if "HGMMA" in body or "HMMA" in body:
                bodies.append(body)
    return bodies


def per_tile(sass: str, warps: int) -> dict:
    """Per loop iteration (one tile), over the kernel's loops (masked and unmasked tiles): SASS instructions issued
    by all warps together, those of them that are not tensor-core products (HGMMA, HMMA), block-wide barriers,
    shared-memory loads and stores, spilled registers reloaded and stored."""
    stats = []
    for body in loop_bodies(sass):
        count = lambda p, b=body: len(re.findall(p, b))  # noqa: E731
        instructions = count(r"/\*[0-9a-f]{4,}\*/")
        stats.append(
            {
                "warp_instructions": instructions * warps,
                "other_instructions": (instructions - count(r"\bH(G)?MMA\b")) * warps,
                "barriers": count(r"\bBAR\.SYNC"),
                "shared_accesses": count(r"\b(LDS|STS)(\.\S+)?\s"),
                "spill_reloads": count(r"\bLDL\b"),
                "spill_stores": count(r"\bSTL\b"),
            }
        )
    keys = ("warp_instructions", "other_instructions", "barriers", "shared_accesses", "spill_reloads", "spill_stores")
    return {f"tile_{k}": [min(s[k] for s in stats), max(s[k] for s in stats)] for k in keys} if stats else {}


def compile_one(launch: Launch, config: dict) -> dict:
    meta = {**launch.meta, **{k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}}
    signature, constexprs, attrs = specialise(launch.fn, launch.args, meta)
    options = dict(num_warps=config["num_warps"], num_stages=config["num_stages"])
    src = triton.compiler.ASTSource(launch.fn, signature, constexprs, attrs)
    kernel = triton.compile(src, target=TARGET, options=options)
    ptx = kernel.asm["ptx"]
    tiles = {k: meta[k] for k in ("BLOCK", "BLOCK_M", "BLOCK_N") if k in meta}
    variant = {k: meta[k] for k in ("MEM", "HAS_C") if k in meta}
    return {
        "design": launch.design,
        "kernel": launch.fn.__name__,
        **variant,
        **tiles,
        **options,
        "shared_bytes": kernel.metadata.shared,
        **_ptxas(ptx),
        "bar_sync": _count(ptx, r"\bbar\.sync\b|\bbarrier\.sync\b"),
        "wgmma": _count(ptx, r"\bwgmma\.mma_async\b"),
        "cp_async": _count(ptx, r"\bcp\.async\.c[ag]\b"),
        "atomics": _count(ptx, r"\b(red|atom)\.global\b"),
        **per_tile(_sass(kernel.asm["cubin"]), config["num_warps"]),
    }


# --------------------------------------------------------------------------------------------------------------
# Tile products per (b, h), each pass as its loops run at the shape (no mask is data-dependent in these counts).


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _memory_key_range(i0: int, T: int, M: int, win: int, bm: int, bn: int) -> tuple[int, int]:
    return max(M + i0 - win, 0) // bn * bn, min(M + T, M + i0 + bm)


def _memory_query_range(n0: int, T: int, M: int, win: int, bm: int, bn: int, *, first: bool) -> tuple[int, int]:
    hi_key = n0 + bn if first else min(n0 + bn, M + T)
    return max(n0 - M, 0) // bm * bm, min(T, hi_key - M + win)


def first_design_products(shape: dict, block: int = 64) -> dict:
    """The first kernel's tile products (block x block x dh) and programs, per (b, h) (the table pass's per head)."""
    T, C, M = shape["T"], shape["C"], shape["M"]
    win = M + T
    query_tiles = 0
    for i0 in range(0, T, block):
        lo, hi = _memory_key_range(i0, T, M, win, block, block)
        query_tiles += cdiv(C, block) + cdiv(max(hi - lo, 0), block)
    key_tiles = cdiv(C, block) * cdiv(T, block)
    for n0 in range(0, M + T, block):
        lo, hi = _memory_query_range(n0, T, M, win, block, block, first=True)
        key_tiles += cdiv(max(hi - lo, 0), block)
    table_tiles = 0
    for n_keys, mem in ((C, False), (M + T, True)):
        lo, hi = 1 - cdiv(T, block), cdiv(n_keys, block) - 1
        if mem:
            lo, hi = max(lo, -((win + block - 1 - M) // block)), min(hi, (M + block - 1) // block)
        for delta in range(lo, hi + 1):
            table_tiles += max(min(cdiv(T, block), cdiv(n_keys, block) - delta) - max(-delta, 0), 0)
    unit = 2 * block * block * shape["dh"]
    return {
        "forward": query_tiles * 4 * unit,  # scores, a band twice the tile (2), values
        "key pass": key_tiles * 6 * unit,  # scores, band (2), dP, dV, dK
        "query pass": query_tiles * 7 * unit,  # scores, band (2), dP, dQ, dq_pos against the band (2)
        "table pass": table_tiles * 6 * unit,  # scores, band (2), dP, d_table over the band (2)
        "atomic_values": 0,
        "tiles": {"query": query_tiles, "key": key_tiles, "table": table_tiles},
    }


def _query_walks(shape: dict, bm: int, bn: int) -> tuple[int, int]:
    """The tiles of the query-block walks (forward, query pass) with (bm, bn) tiles, and their first chunks (R per
    walk of a stream; the query pass also finishes R open chunks per walk)."""
    T, C, M = shape["T"], shape["C"], shape["M"]
    tiles = chunks = 0
    for i0 in range(0, T, bm):
        lo, hi = _memory_key_range(i0, T, M, M + T, bm, bn)
        for n in (C, max(hi - lo, 0)):
            if n > 0:
                tiles += cdiv(n, bn)
                chunks += max(bm // bn, 1)
    return tiles, chunks


def forward_products(shape: dict, bm: int, bn: int) -> int:
    """The forward's tensor-core FLOPs per (b, h) with (bm, bn) tiles: scores, one new band chunk, values per tile."""
    tiles, chunks = _query_walks(shape, bm, bn)
    return (tiles * 3 + chunks) * 2 * bm * bn * shape["dh"]


def query_pass_products(shape: dict, bm: int, bn: int) -> tuple[int, int]:
    """The query pass's tensor-core FLOPs per (b, h) with (bm, bn) tiles (scores, chunk, dP, dQ, dq_pos, d_table per
    tile; the first and last chunks per walk), and the fp32 table-gradient values it adds atomically."""
    tiles, chunks = _query_walks(shape, bm, bn)
    return (tiles * 6 + 3 * chunks) * 2 * bm * bn * shape["dh"], (tiles + chunks) * bn * shape["dh"]


def key_pass_products(shape: dict, bm: int, bn: int) -> tuple[int, int]:
    """The key pass's tensor-core FLOPs per (b, h) with its own tiles, bm queries by bn keys (scores, dP, dV, dK and
    the whole band per tile: the kernel's BAND rows, ``Tiles.kwargs``), and its tiles."""
    T, C, M = shape["T"], shape["C"], shape["M"]
    tiles = cdiv(C, bn) * cdiv(T, bm)
    for n0 in range(0, M + T, bn):
        lo, hi = _memory_query_range(n0, T, M, M + T, bm, bn, first=False)
        tiles += cdiv(max(hi - lo, 0), bm)
    band = current.Tiles(bm, bn).kwargs["BAND"]
    return tiles * (4 * bn + band) * 2 * bm * shape["dh"], tiles


def current_design_products(shape: dict, bm: int, bn: int) -> dict:
    """The current kernels' tile products with (bm, bn) query-pass tiles and (bn, bm) key-pass tiles."""
    query, atomic_values = query_pass_products(shape, bm, bn)
    key, key_tiles = key_pass_products(shape, bn, bm)
    return {
        "forward": forward_products(shape, bm, bn),
        "key pass": key,
        "query pass": query,
        "table pass": 0,
        "atomic_values": atomic_values,  # one finished band chunk's table rows per tile
        "tiles": {"query": _query_walks(shape, bm, bn)[0], "key": key_tiles},
    }


def one_kernel_products(shape: dict, block: int = 64) -> dict:
    """A single FlashAttention-2-shaped backward (one program per key block, dK/dV in registers; dQ, dq_pos and the
    table gradient added atomically), with the current forward: the alternative to two passes."""
    key = current_design_products(shape, block, block)
    tiles = key["tiles"]["key"]
    unit = 2 * block * block * shape["dh"]
    return {
        "forward": key["forward"],
        "key pass": tiles * 11 * unit,  # scores, band (2), dP, dV, dK, dQ, dq_pos (2), d_table (2)
        "query pass": 0,
        "table pass": 0,
        "atomic_values": tiles * (block + block + 2 * block) * shape["dh"],  # dQ, dq_pos, d_table (two chunks)
        "tiles": {"key": tiles},
    }


def useful_flops(shape: dict) -> int:
    """Allowed (query, key) pairs per (b, h), all slots full, times 2 dh FLOPs times 3 products forward, 8 backward."""
    T, C, M = shape["T"], shape["C"], shape["M"]
    pairs = T * C + T * M + T * (T + 1) // 2
    return pairs * 2 * shape["dh"] * USEFUL_PRODUCTS


def tuned_design_products(shape: dict) -> tuple[str, dict]:
    """The current kernels' tile products with each pass's first tuned tiles (those small shapes run with)."""
    (fm, fn), (km, kn), (qm, qn) = (
        (k.configs[0].block_m, k.configs[0].block_n) for k in (current.FORWARD, current.KEY_GRADS, current.QUERY_GRADS)
    )
    query, atomic_values = query_pass_products(shape, qm, qn)
    key, key_tiles = key_pass_products(shape, km, kn)
    name = f"current, first tuned: forward {fm} x {fn}, key pass {km} x {kn}, query pass {qm} x {qn}"
    products = {"forward": forward_products(shape, fm, fn), "key pass": key, "query pass": query, "table pass": 0}
    return name, {**products, "atomic_values": atomic_values, "tiles": {"key": key_tiles}}


def analysis(shape: dict) -> list[dict]:
    rows = [("first kernel, 64 x 64", first_design_products(shape))]
    for bm, bn in ((64, 64), (128, 64)):
        rows.append((f"current, {bm} x {bn} (key pass {bn} x {bm})", current_design_products(shape, bm, bn)))
    rows.append(tuned_design_products(shape))
    rows.append(("one backward kernel (FA-2 shape), 64 x 64", one_kernel_products(shape)))
    useful = useful_flops(shape)
    out = []
    for name, p in rows:
        total = p["forward"] + p["key pass"] + p["query pass"] + p["table pass"]
        out.append(
            {
                "design": name,
                **{f"{k}_gflop": v * 1e-9 for k, v in p.items() if k not in ("tiles", "atomic_values")},
                "total_gflop": total * 1e-9,
                "over_useful": total / useful,
                "atomic_values": p["atomic_values"],
                "tiles": p["tiles"],
            }
        )
    return out


# --------------------------------------------------------------------------------------------------------------
# The configurations each kernel is tuned over: its own and a grid of candidates, compiled, and the rule that admits.

CANDIDATE_TILES = ((64, 64), (64, 32), (32, 64), (32, 32), (16, 32))  # each kernel's own (BLOCK_M, BLOCK_N)
CANDIDATE_WARPS = (4, 8)
CANDIDATE_STAGES = (2, 3)
MAX_WORK = 1.10  # a pass's tensor-core work per (b, h), against the same pass with 64 x 64 tiles
PASS_WORK = {
    "forward_kernel": forward_products,
    "key_value_grad_kernel": lambda *a: key_pass_products(*a)[0],
    "query_grad_kernel": lambda *a: query_pass_products(*a)[0],
}


def pass_work(shape: dict, kernel: str, bm: int, bn: int) -> float:
    """The tensor-core work per (b, h) of ``kernel``'s pass with (bm, bn) tiles, against its 64 x 64 tiles'."""
    work = PASS_WORK[kernel]
    return work(shape, bm, bn) / work(shape, 64, 64)


def admitted(variants: list[dict], work: float) -> bool:
    """The rule a configuration is tuned by: compiled in every variant of its kernel (MEM, HAS_C), no spilled register
    is stored or reloaded inside a tile loop (spills around the loops cost once per program, inside them on every
    tile), and its pass's tensor-core work is at most MAX_WORK times the 64 x 64 tiles'."""
    in_loops = sum(v["tile_spill_reloads"][1] + v["tile_spill_stores"][1] for v in variants)
    return in_loops == 0 and work <= MAX_WORK


def candidates(shape: dict, tiles: tuple = CANDIDATE_TILES) -> list[dict]:
    """Each current kernel compiled, in all its variants, with every configuration it is tuned over and every
    candidate of the grid (``tiles`` by warps by stages; no tiles: the tuned ones only); per configuration its pass's
    work against 64 x 64 tiles and the rule's verdict."""
    launches = record_current(shape)
    rows = []
    for name in dict.fromkeys(launch.fn.__name__ for launch in launches):
        variants = [launch for launch in launches if launch.fn.__name__ == name]
        tuned = [(c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"]) for c in variants[0].configs]
        grid = [(bm, bn, w, st) for bm, bn in tiles for w in CANDIDATE_WARPS for st in CANDIDATE_STAGES]
        for bm, bn, w, st in dict.fromkeys(tuned + grid):
            config = dict(current.Tiles(bm, bn, w, st).kwargs, num_warps=w, num_stages=st)
            compiled = [compile_one(launch, config) for launch in variants]
            work = pass_work(shape, name, bm, bn)
            rows.append(
                {
                    "kernel": name,
                    "BLOCK_M": bm,
                    "BLOCK_N": bn,
                    "num_warps": w,
                    "num_stages": st,
                    "tuned": (bm, bn, w, st) in tuned,
                    "first": (bm, bn, w, st) == tuned[0],  # the one small shapes and CUDA graph captures take
                    "work": work,
                    "admitted": admitted(compiled, work),
                    "variants": compiled,
                }
            )
    return rows


def candidates_report(rows: list[dict]) -> list[str]:
    lines = [
        "",
        "Tile configurations: each kernel's own (BLOCK_M x BLOCK_N; the key pass's BLOCK_M counts queries) and a grid "
        "of candidates, every variant compiled (key pass: MEM=False / MEM=True). The rule a configuration is tuned "
        "by: no spilled register stored or reloaded inside a tile loop, in any variant, and its pass's tensor-core "
        f"work per (b, h) at most {MAX_WORK:.2f} x the 64 x 64 tiles'; the backward passes' 64 x 64 tiles are tuned "
        "against it (`KEY_TIMED_DESPITE_SPILLS`, `TIMED_DESPITE_SPILLS`: their products are wgmma, the admitted "
        "tiles' mostly `mma.sync`, and only timing can weigh that against their spills). wgmma: Hopper's warpgroup products in the "
        "PTX (0: every product is an `mma.sync`); warp-instructions per tile scaled to 64 x 64 tile elements.",
        "",
        "| kernel | tile | warps | stages | tuned | rule | wgmma | registers | spilled B | spill ld/st per tile | "
        "shared KiB | warp-instructions per 64 x 64 | work vs 64 x 64 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        vs = r["variants"]
        each = lambda f, vs=vs: " / ".join(str(f(v)) for v in vs)  # noqa: E731
        scale = 64 * 64 / (r["BLOCK_M"] * r["BLOCK_N"])
        tuned = ("first" if r["first"] else "yes") if r["tuned"] else ""
        lines.append(
            f"| {r['kernel']} | {r['BLOCK_M']} x {r['BLOCK_N']} | {r['num_warps']} | {r['num_stages']} | {tuned} | "
            f"{'admits' if r['admitted'] else 'no (timed: wgmma)' if r['tuned'] else 'no'} | "
            f"{each(lambda v: v['wgmma'])} | "
            f"{each(lambda v: v['registers'])} | {each(lambda v: v['spill_store_bytes'])} | "
            f"{each(lambda v: '{}/{}'.format(v['tile_spill_reloads'][1], v['tile_spill_stores'][1]))} | "
            f"{each(lambda v: round(v['shared_bytes'] / 1024))} | "
            f"{each(lambda v, k=scale: '{:.0f}-{:.0f}'.format(*(x * k for x in v['tile_warp_instructions'])))} | "
            f"{r['work']:.3f} |"
        )
    return lines


def report(result: dict) -> str:
    lines = [
        f"Compiled for sm_90 by Triton {result['triton']} (ptxas {result['ptxas']}), `gpu` shape {result['shape']}, "
        "bf16; no GPU: no timing.",
        "",
        "| design | kernel | variant | tile | warps | stages | shared KiB | registers | spilled B | bar.sync | "
        "cp.async | atomics | per tile: warp-instructions | barriers | shared ld/st | spill reloads |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    span = lambda k, n: "-" if f"tile_{n}" not in k else "{}-{}".format(*k[f"tile_{n}"])  # noqa: E731
    for k in result["kernels"]:
        variant = ", ".join(f"{n}={k[n]}" for n in ("MEM", "HAS_C") if n in k)
        tile = f"{k['BLOCK']} x {k['BLOCK']}" if "BLOCK" in k else f"{k['BLOCK_M']} x {k['BLOCK_N']}"
        lines.append(
            f"| {k['design']} | {k['kernel']} | {variant} | {tile} | {k['num_warps']} | {k['num_stages']} | "
            f"{k['shared_bytes'] / 1024:.0f} | {k['registers']} | {k['spill_store_bytes']} | {k['bar_sync']} | "
            f"{k['cp_async']} | {k['atomics']} | {span(k, 'warp_instructions')} | {span(k, 'barriers')} | "
            f"{span(k, 'shared_accesses')} | {span(k, 'spill_reloads')} |"
        )
    lines += [
        "",
        f"Tensor-core work per (b, h), GFLOP (useful: {result['useful_gflop']:.3f}):",
        "",
        "| design | forward | key pass | query pass | table pass | total | x useful | fp32 atomics |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a in result["analysis"]:
        lines.append(
            f"| {a['design']} | {a['forward_gflop']:.3f} | {a['key pass_gflop']:.3f} | {a['query pass_gflop']:.3f} "
            f"| {a['table pass_gflop']:.3f} | {a['total_gflop']:.3f} | {a['over_useful']:.2f} | "
            f"{a['atomic_values']:,} |"
        )
    return "\n".join(lines + candidates_report(result["candidates"]))


@contextmanager
def _quiet_fp_fusion_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
        yield


def run(shape: dict) -> dict:
    from triton.backends.nvidia.compiler import get_ptxas

    kernels = []
    with _quiet_fp_fusion_warning():
        for launch in record_floor(shape) + record_first(shape) + record_current(shape):
            for config in launch.configs:
                kernels.append(compile_one(launch, config))
        tuning = candidates(shape)
    version = subprocess.run([get_ptxas(90).path, "--version"], capture_output=True, text=True).stdout
    return {
        "triton": triton.__version__,
        "ptxas": re.search(r"release ([\d.]+)", version).group(1),
        "target": "sm_90a",
        "shape": shape,
        "dtype": "bfloat16",
        "kernels": _unique(kernels),
        "analysis": analysis(shape),
        "candidates": tuning,
        "useful_gflop": useful_flops(shape) * 1e-9,
    }


def _unique(rows: list[dict]) -> list[dict]:
    """One row per distinct compiled kernel (the first kernel launches its key and table passes once per stream)."""
    seen, out = set(), []
    for row in rows:
        key = json.dumps(row, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


TARGET_CUT = 0.25  # issue 52: at least 25% fewer non-tensor-core instructions per tile in each pass


def _config_key(row: dict) -> tuple:
    variant = tuple((n, row[n]) for n in ("MEM", "HAS_C") if n in row)
    return row["kernel"], variant, row.get("BLOCK_M"), row.get("BLOCK_N"), row["num_warps"], row["num_stages"]


def comparison(before: dict, result: dict) -> list[str]:
    """The current kernels' tuned configurations against the same configurations compiled from an earlier commit
    (``before``: that commit's ``kernels`` rows, as this script records them): per tile, the warp-instructions that
    are not tensor-core products, cheapest tile (an interior one) and dearest (a masked one), and the spill reloads
    and stores inside the loops."""
    old = {_config_key(r): r for r in before["kernels"] if r["design"] == "current"}
    new = {_config_key(r): r for r in result["kernels"] if r["design"] == "current"}
    lines = [
        "",
        f"Before / after (issue 52, item 4): the tuned configurations compiled from commit {before['commit']} "
        f"(Triton {before['triton']}, ptxas {before['ptxas']}) and from this one, the `gpu` shape; per tile, "
        "warp-instructions that are not tensor-core products (HGMMA, HMMA), the cheapest tile (interior) and the "
        f"dearest (masked: the diagonal or the window's edge). Target: {TARGET_CUT:.0%} fewer. No GPU: none of this "
        "is timed.",
        "",
        "| kernel | variant | tile | warps | stages | before | after | change (cheapest / dearest) | target | "
        "spill ld/st per tile, before -> after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    span = lambda r, missing: "{}-{}".format(*r["tile_other_instructions"]) if r else missing  # noqa: E731
    spills = lambda r: "{}/{}".format(r["tile_spill_reloads"][1], r["tile_spill_stores"][1]) if r else "-"  # noqa: E731
    verdicts, first = {}, {}
    for key in dict.fromkeys(list(old) + list(new)):
        b, a = old.get(key), new.get(key)
        name, variant, bm, bn, warps, stages = key
        if a and b:
            cut = [1 - x / y for x, y in zip(a["tile_other_instructions"], b["tile_other_instructions"])]
            change = f"{-cut[0]:+.1%} / {-cut[1]:+.1%}"
            met = "met" if min(cut) >= TARGET_CUT else "cheapest only" if cut[0] >= TARGET_CUT else "not met"
        else:
            change, met = "-", "-"
        if first.setdefault(name, key[2:]) == key[2:]:  # each pass's first tuned configuration, every variant
            verdicts[key] = f"{name} {', '.join(f'{n}={v}' for n, v in variant)} {bm} x {bn}: {met} ({change})"
        lines.append(
            f"| {name} | {', '.join(f'{n}={v}' for n, v in variant)} | {bm} x {bn} | {warps} | {stages} | {span(b, 'not tuned')} | "
            f"{span(a, 'dropped')} | {change} | {met} | {spills(b)} -> {spills(a)} |"
        )
    return lines + [
        "",
        "Each pass's first tuned configuration (the one that runs untimed): " + "; ".join(verdicts.values()),
    ]


def only(shape: dict, kernel: str, config: int | None) -> dict:
    """One current kernel's tuned configurations (or the one at index ``config``), compiled in every variant."""
    launches = [launch for launch in record_current(shape) if launch.fn.__name__ == kernel]
    if not launches:
        raise SystemExit(f"--only: no current kernel named {kernel!r}")
    rows = []
    with _quiet_fp_fusion_warning():
        for launch in launches:
            for i, c in enumerate(launch.configs):
                if config is None or i == config:
                    rows.append(compile_one(launch, c))
    return {"kernels": rows}


def only_report(result: dict, before: dict | None) -> str:
    if before:  # its rows of the last table: the header, then one per configuration compiled
        keys = {_config_key(k) for k in result["kernels"]}
        mine = dict(before, kernels=[r for r in before["kernels"] if _config_key(r) in keys])
        return "\n".join(comparison(mine, result)[3:-2])
    span = lambda k, n: "{}-{}".format(*k[f"tile_{n}"])  # noqa: E731
    return "\n".join(
        f"{k['kernel']} {', '.join(f'{n}={k[n]}' for n in ('MEM', 'HAS_C') if n in k)} {k['BLOCK_M']} x "
        f"{k['BLOCK_N']}, {k['num_warps']} warps, {k['num_stages']} stages: {k['registers']} registers, "
        f"{k['spill_store_bytes']} B spilled; per tile: {span(k, 'other_instructions')} warp-instructions not "
        f"tensor-core products, spill reloads {span(k, 'spill_reloads')}, stores {span(k, 'spill_stores')}"
        for k in result["kernels"]
    )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/kernel_sm90"))
    ap.add_argument("--before", type=Path, help="an earlier commit's kernel rows (JSON) to compare the tuned ones with")
    ap.add_argument("--only", metavar="KERNEL", help="compile only this current kernel's tuned configurations")
    ap.add_argument("--config", type=int, help="with --only: only its tuned configuration at this index")
    a = ap.parse_args(argv)
    shape = dict(GPU_SHAPE)
    before = json.loads(a.before.read_text()) if a.before else None
    if before and before["shape"] != shape:
        raise SystemExit(f"--before was compiled at shape {before['shape']}, not {shape}: recompile it")
    if a.only:
        result = only(shape, a.only, a.config)
        print(only_report(result, before))
        return result
    result = run(shape)
    text = report(result)
    if before:
        result["before"] = {k: before[k] for k in ("commit", "triton", "ptxas")}
        text += "\n" + "\n".join(comparison(before, result))
    print(text)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    a.out.with_suffix(".md").write_text(text + "\n")
    print(f"wrote {a.out.with_suffix('.json')} and {a.out.with_suffix('.md')}")
    return result


if __name__ == "__main__":
    main()
