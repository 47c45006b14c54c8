"""The `gpu` workload's training step as a run makes it on a GPU, built through the trainer's own path
(``training.step.training_step``: the kept bf16 weight copies, the trainer's autocast, fused Adam, gradient clipping
at ``train.grad_clip``), compiled (``train.compile``) and captured (``train.cuda_graphs``) together, per attention
kernel: tokens/s of the replayed update, MFU against this GPU's measured bf16 matmul rate, peak memory, and one
graph replay profiled by kernel kind (attention, matmuls, copies, ...).

    python -m benchmarks.profile_gpu_step --out benchmarks/results/gpu/step.json [--kernels fused,flex] [--no-compile]
    python -m benchmarks.profile_gpu_step --workload tiny --device cpu --out /tmp/step.json   # a dry run

The first update at a shape runs eagerly (and compiles), the second captures, the rest replay; the times are of
replays after the memories are full. On the CPU (a dry run) the recorded stand-in replaces the capture and the
profile is of CPU operators: the code path, not a measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from unittest import mock

import torch

from benchmarks import workloads
from benchmarks.impls import ours
from compressive_transformer.core import graphs
from compressive_transformer.core.config import TrainConfig
from compressive_transformer.training import step as training

HERE = Path(__file__).resolve().parent
KINDS = (  # kernel-name fragments -> kind, first match wins
    ("fused", "fused attention"),
    ("forward_kernel", "fused attention"),  # the fused kernels: forward, key/value and query gradients
    ("_grad_kernel", "fused attention"),
    ("flex", "flex attention"),
    ("fmha", "sdpa"),
    ("attention", "sdpa"),
    ("gemm", "matmul"),
    ("sm90", "matmul"),
    ("cutlass", "matmul"),
    ("nvjet", "matmul"),
    ("softmax", "softmax"),
    ("adam", "optimizer"),
    ("norm", "norms"),
    ("reduce", "reductions"),
    ("cat", "copies"),
    ("copy", "copies"),
)


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for frag, kind in KINDS if frag in low), "elementwise/other")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(device: torch.device, n: int) -> float:
    """This device's bf16 torch.mm rate (the MFU's denominator), median of a few products."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    times = []
    for _ in range(5):
        sync(device)
        t0 = time.perf_counter()
        a @ a
        sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times[1:]) / 1e9


def build(w: workloads.Workload, kernel: str, device: torch.device, compile: bool):
    """The model and its step as the trainer makes them (bf16 on CUDA, the capture allowed on the CPU for a dry
    run), the batch, and the memory filled to steady state."""
    torch.manual_seed(0)
    model = ours.build(w, attn_impl=kernel).model.to(device).train()
    amp = "bf16" if device.type == "cuda" else "none"
    t = TrainConfig(amp=amp, compile=compile, cuda_graphs=True)
    cpu = device.type == "cpu"
    if cpu:
        graphs.DEFAULT_GRAPH = graphs.RecordedGraph
    with mock.patch.object(training, "capture_reason", lambda *a: None) if cpu else contextlib.nullcontext():
        step = training.training_step(model, t, device, amp)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, w.vocab, (w.batch, w.seg_len + 1), generator=g).to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    memory = model.init_memory(w.batch, device=device)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp == "bf16"):
        for _ in range(w.fill_segments):
            memory = model(x, memory=memory).memory
    return step, x, y, memory


def profiled(fn, device: torch.device) -> dict:
    """Kernel time by kind of one call of ``fn`` (a graph replay on CUDA)."""
    activity = torch.profiler.ProfilerActivity.CUDA if device.type == "cuda" else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        fn()
        sync(device)
    by_kind: dict[str, float] = defaultdict(float)
    launches, top = 0, []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", 0.0) or getattr(e, "cuda_time_total", 0.0)
        if device.type == "cpu":
            t = e.self_cpu_time_total
        if t <= 0 or (device.type == "cuda" and e.key.startswith(("aten::", "cuda"))):
            continue
        by_kind[kind_of(e.key)] += t / 1e3
        launches += e.count
        top.append((round(t / 1e3, 3), e.count, e.key[:90]))
    top.sort(reverse=True)
    return {
        "kernel_ms_by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "kernel_ms": sum(by_kind.values()),
        "kernels": launches,
        "top_kernels_ms_count": top[:12],
    }


def measure(w: workloads.Workload, kernel: str, device: torch.device, compile: bool, replays: int, gflops) -> dict:
    step, x, y, memory = build(w, kernel, device, compile)
    mask = torch.ones_like(x, dtype=torch.bool)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    t_first = time.perf_counter()
    for i in range(2 + replays):  # eager (and compiling), capture + replay, replays
        sync(device)
        t0 = time.perf_counter()
        (stats, _), memory = step.captured(x, y, mask, memory)
        loss = float(stats[0])
        times.append(time.perf_counter() - t0)
        if i == 1:
            first_two_s = time.perf_counter() - t_first
    median = statistics.median(times[2:])
    tokens_per_s = w.batch * w.seg_len / median
    result = {
        "compiled": compile,
        "eager_and_capture_s": first_two_s,
        "replay_ms": [1e3 * t for t in times[2:]],
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * workloads.train_flops_per_token(w) / (gflops * 1e9) if gflops else None,
        "loss": loss,
        "graphs": len(step.captured.graphs.graphs),
        "kept_bf16_copies": step.low_precision is not None,
    }
    if device.type == "cuda":
        result["peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20

    def replay():
        nonlocal memory
        (_, _), memory = step.captured(x, y, mask, memory)

    result["profile_of_one_replay"] = profiled(replay, device)
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="gpu", choices=sorted(workloads.WORKLOADS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--kernels", default="fused", help="comma-separated model.attn_impl values")
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="captured, not compiled")
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "gpu" / "step.json")
    a = ap.parse_args(argv)
    w = workloads.get(a.workload)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here; use --device cpu for a dry run")
    if device.type == "cuda":
        graphs.DEFAULT_GRAPH = graphs.CudaGraph
    gflops = matmul_gflops(device, w.matmul_n) if device.type == "cuda" else None
    result = {"workload": w.to_dict(), "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    result.update(torch=torch.__version__, matmul_bf16_gflops=gflops, kernels={})
    failed = []
    for kernel in [k.strip() for k in a.kernels.split(",") if k.strip()]:
        try:
            entry = measure(w, kernel, device, a.compile, a.replays, gflops)
        except Exception as e:  # noqa: BLE001 - a failing kernel is reported, the others still run
            entry = {"error": f"{type(e).__name__}: {e}"[:800]}
            failed.append(kernel)
        result["kernels"][kernel] = entry
        summary = entry.get("error") or (
            f"{entry['tokens_per_s']:,.0f} tokens/s, MFU {entry['mfu'] or 0:.1%}, peak {entry.get('peak_mib', 0):.0f} "
            f"MiB, {entry['profile_of_one_replay']['kernel_ms']:.1f} ms of kernels in one replay"
        )
        print(f"[step] {kernel} (compiled {a.compile}): {summary}", flush=True)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1) + "\n")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if failed:
        raise SystemExit(f"step: failed for {', '.join(failed)}")
    return result


if __name__ == "__main__":
    main()
