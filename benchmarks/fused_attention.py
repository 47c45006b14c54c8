"""Time the fused Triton relative attention against the first fused kernel (frozen in ``benchmarks/impls/fused_v1``),
a plain-torch reference with explicit (B, H, T, K) scores and ``F.scaled_dot_product_attention`` with the
positional term and the mask as its float ``attn_mask`` (the ``sdpa-bias`` backend's way), forward and forward +
backward, with the rate of useful work, and check that all agree.

    python -m benchmarks.fused_attention [--device cuda] [--out fused_attention.json]

On CUDA: the ``gpu`` workload's attention shape (B=16, H=8, T=512, dh=64, C=512, M=515, bf16), medians of
``--iters`` CUDA-event timings after warm-up (which also tunes the fused kernel's tiles), and the peak memory each
one allocates. On CPU: a tiny shape through Triton's interpreter, timed once (the script end to end; its times say
nothing about a GPU). Useful work: the allowed (query, key) pairs times 2 dh FLOPs times 3 products forward (scores,
positional scores, values) and 8 backward (both recomputed, dP, dV, dK, dQ, dq_pos, d_table); TFLOP/s is that over
the time. Prints a table and writes the JSON to ``--out`` after each implementation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.impls.fused_v1 import fused_relative_attention_v1
from compressive_transformer.core.attention import KeyMask
from compressive_transformer.core.kernels.fused_triton import fused_relative_attention

GPU_SHAPE = dict(B=16, H=8, T=512, dh=64, C=512, M=515)  # the `gpu` workload: n_s = 512, n_m = 512 (+3), n_cm = 512
CPU_SHAPE = dict(B=1, H=2, T=12, dh=16, C=4, M=6)
WINDOW = 0
NAMES = ("qu", "k", "v", "qv", "r", "qc", "rc")
FORWARD_PRODUCTS, BACKWARD_PRODUCTS = 3, 8


def make_inputs(shape: dict, device: str, dtype: torch.dtype, seed: int = 0) -> tuple[list[Tensor], Tensor]:
    """Random qu, k, v, qv, r, qc, rc (leaves needing gradients) at ``shape``, and key_valid (the first memory
    slots empty, as in a memory that has not filled yet)."""
    B, H, T, dh, C, M = (shape[n] for n in ("B", "H", "T", "dh", "C", "M"))
    K = C + M + T
    g = torch.Generator().manual_seed(seed)
    sizes = [(B, H, T, dh), (B, H, K, dh), (B, H, K, dh), (B, H, T, dh), (H, M + T + 1, dh), (B, H, T, dh)]
    sizes.append((H, C + T - 1, dh))
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


def explicit(qu, k, v, qv, r, qc, rc, key_valid, C: int, window: int) -> Tensor:
    """softmax(qu k^T + bias) v with the (B, H, T, K) scores in memory."""
    scores = qu @ k.transpose(-1, -2) + bias_of(qv, r, qc, rc, key_valid, C, window)
    return torch.softmax(scores.float(), -1).to(v.dtype) @ v


def sdpa_bias(qu, k, v, qv, r, qc, rc, key_valid, C: int, window: int) -> Tensor:
    """SDPA with the positional scores and the mask as its float attn_mask (gradients flow into it)."""
    return F.scaled_dot_product_attention(qu, k, v, attn_mask=bias_of(qv, r, qc, rc, key_valid, C, window), scale=1.0)


def fused(qu, k, v, qv, r, qc, rc, key_valid, C: int, window: int) -> Tensor:
    return fused_relative_attention(qu, k, v, qv, r, qc, rc, key_valid, n_cmem=C, window=window)


def fused_first(qu, k, v, qv, r, qc, rc, key_valid, C: int, window: int) -> Tensor:
    return fused_relative_attention_v1(qu, k, v, qv, r, qc, rc, key_valid, n_cmem=C, window=window)


IMPLS = {
    "fused (Triton)": fused,
    "fused, first kernel": fused_first,
    "explicit (torch)": explicit,
    "sdpa-bias": sdpa_bias,
}


def useful_flops(key_valid: Tensor, C: int, window: int, T: int, H: int, dh: int) -> tuple[float, float]:
    """FLOPs of useful work forward and backward: allowed (query, key) pairs x 2 dh x products."""
    pairs = KeyMask(key_valid, C, window).allowed(T).sum().item() * H
    return pairs * 2 * dh * FORWARD_PRODUCTS, pairs * 2 * dh * BACKWARD_PRODUCTS


def _timed(fn, device: str, iters: int) -> float:
    """Median milliseconds of ``fn`` over ``iters`` runs after two warm-up runs (CUDA events on a GPU)."""
    if device != "cuda":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(name: str, tensors, key_valid, C: int, device: str, iters: int) -> tuple[dict, Tensor, list[Tensor]]:
    """One implementation's row (forward and forward + backward milliseconds, peak MiB) and its output and
    gradients (for the agreement check)."""
    impl = IMPLS[name]
    grad_out = torch.ones_like(tensors[0]) * 0.1

    def forward():
        with torch.no_grad():
            return impl(*tensors, key_valid, C, WINDOW)

    def forward_backward():
        out = impl(*tensors, key_valid, C, WINDOW)
        return out, torch.autograd.grad(out, tensors, grad_out)

    row = {"impl": name, "forward_ms": _timed(forward, device, iters)}
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    row["forward_backward_ms"] = _timed(forward_backward, device, iters)
    out, grads = forward_backward()
    if device == "cuda":
        row["peak_extra_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    return row, out.detach(), [g.detach() for g in grads]


def report(rows: list[dict], meta: dict) -> str:
    lines = [
        f"relative attention, {meta['device_name']}, torch {meta['torch']}, triton {meta['triton']}, {meta['dtype']}, "
        f"shape {meta['shape']}",
        "| implementation | forward ms | forward + backward ms | forward TFLOP/s | forward + backward TFLOP/s "
        "| peak extra MiB | max rel. difference to explicit |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak = f"{r['peak_extra_mib']:.0f}" if "peak_extra_mib" in r else "-"
        diff = f"{r['max_rel_difference']:.2e}" if "max_rel_difference" in r else "-"
        lines.append(
            f"| {r['impl']} | {r['forward_ms']:.2f} | {r['forward_backward_ms']:.2f} | {r['forward_tflops']:.3g} | "
            f"{r['forward_backward_tflops']:.3g} | {peak} | {diff} |"
        )
    return "\n".join(lines)


def run(device: str, iters: int, out: Path | None = None) -> dict:
    """Measure every implementation; with ``out``, the JSON is written after each one (a run cut off keeps its
    rows)."""
    import triton

    shape = GPU_SHAPE if device == "cuda" else CPU_SHAPE
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tensors, key_valid = make_inputs(shape, device, dtype)
    forward_flops, backward_flops = useful_flops(key_valid, shape["C"], WINDOW, shape["T"], shape["H"], shape["dh"])
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreter)"
    result = {"device_name": name, "torch": torch.__version__, "triton": triton.__version__}
    result.update(dtype=str(dtype).removeprefix("torch."), shape={**shape, "window": WINDOW})
    result.update(iters=iters if device == "cuda" else 1, useful_gflop_forward=forward_flops * 1e-9)
    result.update(useful_gflop_backward=backward_flops * 1e-9, rows=[])
    results = {}
    for impl in IMPLS:
        row, output, grads = measure(impl, tensors, key_valid, shape["C"], device, iters)
        row["forward_tflops"] = forward_flops / row["forward_ms"] * 1e-9
        row["forward_backward_tflops"] = (forward_flops + backward_flops) / row["forward_backward_ms"] * 1e-9
        results[impl] = [output, *grads]
        result["rows"].append(row)
        if out is not None:
            out.write_text(json.dumps(result, indent=2) + "\n")
    ref = results["explicit (torch)"]
    for row in result["rows"]:  # worst relative (norm) difference over the output and the seven gradients
        diffs = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(results[row["impl"]], ref)]
        row["max_rel_difference"] = max(diffs)
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("fused_attention.json"))
    a = ap.parse_args(argv)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    result = run(a.device, a.iters, a.out)
    print(report(result["rows"], result))
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")
    return result


if __name__ == "__main__":
    main()
