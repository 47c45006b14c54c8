"""Time the relative attention's kernels against each other at the ``gpu`` workload's attention shape, forward and
backward, each pass by CUDA events, with the rate of useful work, what each saves for the backward, and check that
all agree: the fused Triton kernels (``fused``), the first fused kernel (frozen in ``benchmarks/impls/fused_v1``),
``F.scaled_dot_product_attention`` with the positional term and the mask as its float ``attn_mask`` (the
``sdpa-bias`` backend's way), FlexAttention under ``torch.compile`` (the ``flex`` backend) and a plain-torch
reference with explicit (B, H, T, K) scores.

    python -m benchmarks.fused_attention [--device cuda] [--out fused_attention.json] [--impls fused,flex]

On CUDA: the ``gpu`` workload's attention shape (B=16, H=8, T=512, dh=64, C=512, M=520, bf16, the positional tables
as long as the model makes them: :func:`attention_shape`, so that every kernel compiles as in the model), medians of
``--iters`` CUDA-event timings after warm-up (which also tunes the fused kernel's tiles), and the peak memory each
one allocates. Per pass: the forward, the backward, and for the Triton kernels each of their launches (the key and
the query pass), timed alone. On CPU: a tiny shape (the fused kernels through Triton's interpreter), timed once (the
script end to end; its times say nothing about a GPU). Useful work: the allowed (query, key) pairs times 2 dh FLOPs
times 3 products forward (scores, positional scores, values) and 8 backward (both recomputed, dP, dV, dK, dQ,
dq_pos, d_table); TFLOP/s is that over the time. Saved for the backward: the bytes of the tensors autograd keeps
beyond the inputs themselves. Prints a table and writes the JSON to ``--out`` after each implementation.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import time
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks import workloads
from benchmarks.impls.fused_v1 import fused_relative_attention_v1
from benchmarks.impls.fused_v1 import launch as first_launch
from compressive_transformer.core.attention import AttentionInputs, KeyMask, aligned_rows
from compressive_transformer.core.kernels import fused_triton
from compressive_transformer.core.kernels.flex import flex_relative_attention, prepare
from compressive_transformer.core.kernels.fused_triton import fused_relative_attention
from compressive_transformer.core.memory import memory_capacity


def attention_shape(w: workloads.Workload) -> dict:
    """One layer's attention in workload ``w`` as the model runs it: M the memory's capacity (its pending slots
    aligned as the model aligns them), Rm and Rc the positional tables' rows (``TABLE_ALIGN``)."""
    M = memory_capacity(mem_len=w.mem_len, cmem_len=w.cmem_len, compression_rate=w.rate)
    T, C = w.seg_len, w.cmem_len
    shape = dict(B=w.batch, H=w.n_heads, T=T, dh=w.d_model // w.n_heads, C=C, M=M)
    return shape | dict(Rm=aligned_rows(M + T + 1), Rc=aligned_rows(C + T))


GPU_SHAPE = attention_shape(workloads.get("gpu"))  # B=16, H=8, T=512, dh=64, C=512, M=520, Rm=1040, Rc=1024
CPU_SHAPE = dict(B=1, H=2, T=12, dh=16, C=4, M=6, Rm=aligned_rows(19), Rc=aligned_rows(16))
WINDOW = 0
NAMES = ("qu", "k", "v", "qv", "r", "qc", "rc")
FORWARD_PRODUCTS, BACKWARD_PRODUCTS = 3, 8


def table_rows(shape: dict) -> tuple[int, int]:
    """The rows of the two positional tables at ``shape``: the model's (aligned) where the shape names them."""
    T, C, M = shape["T"], shape["C"], shape["M"]
    return shape.get("Rm", aligned_rows(M + T + 1)), shape.get("Rc", aligned_rows(C + T))


def make_inputs(shape: dict, device: str, dtype: torch.dtype, seed: int = 0) -> tuple[list[Tensor], Tensor]:
    """Random qu, k, v, qv, r, qc, rc (leaves needing gradients) at ``shape``, and key_valid (the first memory
    slots empty, as in a memory that has not filled yet)."""
    B, H, T, dh, C, M = (shape[n] for n in ("B", "H", "T", "dh", "C", "M"))
    K = C + M + T
    Rm, Rc = table_rows(shape)
    g = torch.Generator().manual_seed(seed)
    sizes = [(B, H, T, dh), (B, H, K, dh), (B, H, K, dh), (B, H, T, dh), (H, Rm, dh), (B, H, T, dh), (H, Rc, dh)]
    tensors = [(torch.randn(s, generator=g) * 0.5).to(device, dtype).requires_grad_() for s in sizes]
    key_valid = torch.ones(B, K, dtype=torch.bool)
    key_valid[:, C : C + M // 4] = False
    return tensors, key_valid.to(device)


def shifted(table_scores: Tensor, n_keys: int) -> Tensor:
    """out[b, h, i, n] = table_scores[b, h, i, n - i + T - 1] as a strided view (the relative shift without a copy):
    row i starts T - 1 - i columns in, so consecutive rows step W - 1 elements. Reads past a row's end land only on
    future keys, which the mask removes."""
    B, H, T, W = table_scores.shape
    assert table_scores.is_contiguous() and W >= n_keys
    return table_scores.as_strided((B, H, T, n_keys), (H * T * W, T * W, W - 1, 1), T - 1)


def bias_of(qv, r, qc, rc, key_valid: Tensor, C: int, window: int) -> Tensor:
    """The positional scores of both streams plus the additive mask: (B, H, T, K), in the queries' dtype."""
    B, H, T, _ = qv.shape
    K = key_valid.shape[1]
    M = K - C - T
    mem = shifted(torch.einsum("bhtd,hld->bhtl", qv, r).contiguous(), M + T)
    pos = torch.cat([shifted(torch.einsum("bhtd,hld->bhtl", qc, rc).contiguous(), C), mem], -1) if C else mem
    i = torch.arange(T, device=qv.device)[:, None]
    dist = M + i - torch.arange(M + T, device=qv.device)[None, :]
    near = (dist >= 0) & (dist <= window) if window > 0 else dist >= 0
    ok = torch.cat([key_valid[:, None, :C].expand(B, T, C), (key_valid[:, None, C:] & near) | (dist == 0)], -1)
    mask = torch.zeros(ok.shape, dtype=qv.dtype, device=qv.device).masked_fill_(~ok, float("-inf"))
    return pos + mask[:, None]


def explicit(qu, k, v, qv, r, qc, rc, mask: KeyMask) -> Tensor:
    """softmax(qu k^T + bias) v with the (B, H, T, K) scores in memory."""
    scores = qu @ k.transpose(-1, -2) + bias_of(qv, r, qc, rc, mask.valid, mask.n_cmem, mask.window)
    return torch.softmax(scores.float(), -1).to(v.dtype) @ v


def sdpa_bias(qu, k, v, qv, r, qc, rc, mask: KeyMask) -> Tensor:
    """SDPA with the positional scores and the mask as its float attn_mask (gradients flow into it)."""
    bias = bias_of(qv, r, qc, rc, mask.valid, mask.n_cmem, mask.window)
    return F.scaled_dot_product_attention(qu, k, v, attn_mask=bias, scale=1.0)


def fused(qu, k, v, qv, r, qc, rc, mask: KeyMask) -> Tensor:
    return fused_relative_attention(qu, k, v, qv, r, qc, rc, mask.valid, n_cmem=mask.n_cmem, window=mask.window)


def fused_first(qu, k, v, qv, r, qc, rc, mask: KeyMask) -> Tensor:
    return fused_relative_attention_v1(qu, k, v, qv, r, qc, rc, mask.valid, n_cmem=mask.n_cmem, window=mask.window)


@functools.cache
def _flex_compiled():
    return torch.compile(flex_relative_attention, fullgraph=True)


def flex(qu, k, v, qv, r, qc, rc, mask: KeyMask) -> Tensor:
    """The ``flex`` backend as the model runs it on a GPU: under torch.compile, its BlockMask made once per segment
    (outside the timing); eager on the CPU, whose backend compiles no FlexAttention backward."""
    fn = _flex_compiled() if qu.device.type == "cuda" else flex_relative_attention
    return fn(AttentionInputs(qu=qu, qv=qv, qc=qc, k=k, v=v, r=r, rc=rc, mask=mask))


IMPLS = {
    "fused (Triton)": fused,
    "fused, first kernel": fused_first,
    "sdpa-bias": sdpa_bias,
    "flex (FlexAttention)": flex,
    "explicit (torch)": explicit,
}
REFERENCE = "explicit (torch)"


def useful_flops(key_valid: Tensor, C: int, window: int, T: int, H: int, dh: int) -> tuple[float, float]:
    """FLOPs of useful work forward and backward: allowed (query, key) pairs x 2 dh x products."""
    pairs = KeyMask(key_valid, C, window).allowed(T).sum().item() * H
    return pairs * 2 * dh * FORWARD_PRODUCTS, pairs * 2 * dh * BACKWARD_PRODUCTS


def _timed(fn, device: str, iters: int, before=None) -> float:
    """Median milliseconds of ``fn`` over ``iters`` runs after two warm-up runs (CUDA events on a GPU); ``before``
    runs untimed ahead of each (what ``fn`` needs, such as the forward a backward reads)."""
    prepare_run = before or (lambda: None)
    if device != "cuda":
        arg = prepare_run()
        t = time.perf_counter()
        fn(arg)
        return (time.perf_counter() - t) * 1e3
    for _ in range(2):
        fn(prepare_run())
    times = []
    for _ in range(iters):
        arg = prepare_run()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(arg)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _kernel_name(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)  # a TiledKernel holds its JIT function; the first kernel's launch gets it
    return getattr(fn, "__name__", None) or fn.fn.__name__


@contextlib.contextmanager
def launch_times(device: str):
    """Each Triton launch of the calls made inside, timed alone (CUDA events around it; wall time in the
    interpreter): a list of (kernel name, milliseconds), filled when the block ends."""
    records: list = []
    result: list[tuple[str, float]] = []

    def timing(original):
        def launch(kernel, *args, **kwargs):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                original(kernel, *args, **kwargs)
                end.record()
                records.append((_kernel_name(kernel), start, end))
            else:
                t = time.perf_counter()
                original(kernel, *args, **kwargs)
                records.append((_kernel_name(kernel), t, time.perf_counter()))

        return launch

    patches = [mock.patch.object(m, "_launch", timing(m._launch)) for m in (fused_triton, first_launch)]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield result
    if device == "cuda":
        torch.cuda.synchronize()
    for name, start, end in records:
        ms = start.elapsed_time(end) if device == "cuda" else (end - start) * 1e3
        result.append((name, ms))


def saved_for_backward_mib(fn, inputs: list[Tensor]) -> float:
    """MiB of the tensors autograd keeps for the backward of ``fn()``, less the inputs' own storage."""
    inputs_at = {t.untyped_storage().data_ptr() for t in inputs}
    kept: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in inputs_at:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(kept.values()) / 2**20


def measure(name: str, tensors, mask: KeyMask, device: str, iters: int) -> tuple[dict, Tensor, list[Tensor]]:
    """One implementation's row (forward, backward and forward + backward milliseconds, each Triton launch's,
    what it saves for the backward, peak MiB) and its output and gradients (for the agreement check)."""
    impl = IMPLS[name]
    grad_out = torch.ones_like(tensors[0]) * 0.1

    def forward(_=None):
        with torch.no_grad():
            return impl(*tensors, mask)

    def forward_backward(_=None):
        out = impl(*tensors, mask)
        return out, torch.autograd.grad(out, tensors, grad_out)

    def backward(out):
        return torch.autograd.grad(out, tensors, grad_out)

    row = {"impl": name, "forward_ms": _timed(forward, device, iters)}
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    row["forward_backward_ms"] = _timed(forward_backward, device, iters)
    row["backward_ms"] = _timed(backward, device, iters, before=lambda: impl(*tensors, mask))
    with launch_times(device) as launches:
        out, grads = forward_backward()
    row["launches_ms"] = launches  # the Triton kernels' passes, in launch order (empty for the others)
    if device == "cuda":
        row["peak_extra_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    row["saved_for_backward_mib"] = saved_for_backward_mib(lambda: impl(*tensors, mask), tensors)
    return row, out.detach(), [g.detach() for g in grads]


def report(rows: list[dict], meta: dict) -> str:
    lines = [
        f"relative attention, {meta['device_name']}, torch {meta['torch']}, triton {meta['triton']}, {meta['dtype']}, "
        f"shape {meta['shape']}",
        "| implementation | forward ms | backward ms | forward + backward ms | forward TFLOP/s | backward TFLOP/s "
        "| forward + backward TFLOP/s | passes ms | saved for backward MiB | peak extra MiB "
        "| max rel. difference to explicit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak = f"{r['peak_extra_mib']:.0f}" if "peak_extra_mib" in r else "-"
        diff = f"{r['max_rel_difference']:.2e}" if "max_rel_difference" in r else "-"
        passes = ", ".join(f"{n.removesuffix('_kernel')} {ms:.2f}" for n, ms in r["launches_ms"]) or "-"
        lines.append(
            f"| {r['impl']} | {r['forward_ms']:.2f} | {r['backward_ms']:.2f} | {r['forward_backward_ms']:.2f} | "
            f"{r['forward_tflops']:.3g} | {r['backward_tflops']:.3g} | {r['forward_backward_tflops']:.3g} | {passes} | "
            f"{r['saved_for_backward_mib']:.4g} | {peak} | {diff} |"
        )
    return "\n".join(lines)


def run(device: str, iters: int, out: Path | None = None, impls: list[str] | None = None) -> dict:
    """Measure every implementation (or ``impls``); with ``out``, the JSON is written after each one (a run cut off
    keeps its rows). The agreement check is against the explicit reference, which always runs (last)."""
    import triton

    names = [n for n in IMPLS if impls is None or n in impls or n == REFERENCE]
    shape = GPU_SHAPE if device == "cuda" else CPU_SHAPE
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tensors, key_valid = make_inputs(shape, device, dtype)
    mask = prepare(KeyMask(key_valid, shape["C"], WINDOW), shape["T"], dtype)  # flex's BlockMask, once
    forward_flops, backward_flops = useful_flops(key_valid, shape["C"], WINDOW, shape["T"], shape["H"], shape["dh"])
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreter)"
    result = {"device_name": name, "torch": torch.__version__, "triton": triton.__version__}
    result.update(dtype=str(dtype).removeprefix("torch."), shape={**shape, "window": WINDOW})
    result.update(iters=iters if device == "cuda" else 1, useful_gflop_forward=forward_flops * 1e-9)
    result.update(useful_gflop_backward=backward_flops * 1e-9, rows=[])
    results = {}
    for impl in names:
        try:
            row, output, grads = measure(impl, tensors, mask, device, iters)
        except Exception as e:  # noqa: BLE001 - one failing row is reported, the others still run
            result["rows"].append({"impl": impl, "error": f"{type(e).__name__}: {e}"[:500]})
            print(f"{impl}: {result['rows'][-1]['error']}", flush=True)
            continue
        row["forward_tflops"] = forward_flops / row["forward_ms"] * 1e-9
        row["backward_tflops"] = backward_flops / row["backward_ms"] * 1e-9
        row["forward_backward_tflops"] = (forward_flops + backward_flops) / row["forward_backward_ms"] * 1e-9
        results[impl] = [output, *grads]
        result["rows"].append(row)
        if out is not None:
            out.write_text(json.dumps(result, indent=2) + "\n")
        if device == "cuda":
            torch.cuda.empty_cache()
    ref = results.get(REFERENCE)
    for row in result["rows"]:  # worst relative (norm) difference over the output and the seven gradients
        if ref is not None and row["impl"] in results:
            pairs = zip(results[row["impl"]], ref)
            row["max_rel_difference"] = max(
                ((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in pairs
            )
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("fused_attention.json"))
    ap.add_argument("--impls", default=None, help=f"comma-separated subset of {', '.join(IMPLS)} (by name or prefix)")
    a = ap.parse_args(argv)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    chosen = None
    if a.impls:
        chosen = [n for n in IMPLS if any(n.startswith(p.strip()) for p in a.impls.split(",") if p.strip())]
    result = run(a.device, a.iters, a.out, chosen)
    failed = [r for r in result["rows"] if "error" in r]
    print(report([r for r in result["rows"] if "error" not in r], result))
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")
    if failed:
        raise SystemExit(f"{len(failed)} implementation(s) failed: {', '.join(r['impl'] for r in failed)}")
    return result


if __name__ == "__main__":
    main()
