"""Where the `gpu` workload's training step spends its time on a GPU, per attention kernel: the eager step's kernel
time by kind and its kernel launches, and the step captured as one CUDA graph (capture time, replay times).

    python -m benchmarks.profile_gpu_step --out benchmarks/results/gpu/profile_step.json [--kernels fused,sdpa-bias]

What limits a step that misses its target: how much of it is the attention kernels, the matmuls, elementwise
passes, launches (eager) — and whether capturing the step removes what launches cost.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks import workloads
from benchmarks.impls import ours
from compressive_transformer.core import graphs
from compressive_transformer.training.captured import CapturedUpdate, make_capturable

HERE = Path(__file__).resolve().parent
KINDS = (  # kernel-name fragments -> kind, first match wins
    ("fused", "fused attention"),
    ("forward_kernel", "fused attention"),  # the fused kernels: forward, key/value and query gradients
    ("_grad_kernel", "fused attention"),
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


def setup(w: workloads.Workload, kernel: str, device: torch.device):
    impl = ours.build(w, attn_impl=kernel)
    model = impl.model.to(device).train()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, w.vocab, (w.batch, w.seg_len + 1), generator=g).to(device)
    x, y = tokens[:, :-1], tokens[:, 1:]
    memory = model.init_memory(w.batch, device=device)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        for _ in range(w.fill_segments):
            memory = model(x, memory=memory).memory
    return impl, model, x, y, memory


def eager_profile(w, kernel: str, device: torch.device) -> dict:
    impl, model, x, y, memory = setup(w, kernel, device)

    def step(memory):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = model(x, memory=memory, targets=y)
        (out.loss + out.aux_loss).backward()
        impl.opt.step()
        impl.opt.zero_grad(set_to_none=True)
        return out.memory

    for _ in range(2):
        memory = step(memory)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    memory = step(memory)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step(memory)
        torch.cuda.synchronize()
    by_kind: dict[str, float] = defaultdict(float)
    launches = 0
    top = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", 0.0) or getattr(e, "cuda_time_total", 0.0)
        if t <= 0 or e.key.startswith(("aten::", "cuda")):
            continue
        by_kind[kind_of(e.key)] += t / 1e3
        launches += e.count
        top.append((t / 1e3, e.count, e.key[:90]))
    top.sort(reverse=True)
    return {
        "wall_ms": 1e3 * wall,
        "gpu_ms_by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "kernel_launches": launches,
        "top_kernels_ms_count": top[:15],
    }


def captured_times(w, kernel: str, device: torch.device, replays: int = 3) -> dict:
    impl, model, x, y, memory = setup(w, kernel, device)
    make_capturable(impl.opt)
    update = CapturedUpdate(model, impl.opt, amp="bf16", grad_clip=0.0)
    mask = torch.ones_like(x, dtype=torch.bool)
    times = []
    for _ in range(2 + replays):  # eager, capture + replay, replays
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        (stats, _), memory = update(x, y, mask, memory)
        float(stats[0])
        times.append(1e3 * (time.perf_counter() - t0))
    return {"ms_eager_capture_then_replays": times, "graphs": len(update.graphs.graphs)}


def op_capture(device: torch.device, replays: int = 3) -> dict:
    """The fused kernel alone at the workload's attention shape, forward + backward: eager, and captured."""
    from benchmarks.fused_attention import GPU_SHAPE, make_inputs
    from compressive_transformer.core.kernels.fused_triton import fused_relative_attention

    tensors, key_valid = make_inputs(GPU_SHAPE, "cuda", torch.bfloat16)
    grad = torch.randn(GPU_SHAPE["B"], GPU_SHAPE["H"], GPU_SHAPE["T"], GPU_SHAPE["dh"], device=device).bfloat16()

    def run():
        out = fused_relative_attention(*tensors, key_valid, n_cmem=GPU_SHAPE["C"])
        return torch.autograd.grad(out, tensors, grad)

    def timed(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return 1e3 * (time.perf_counter() - t0)

    eager = [timed(run) for _ in range(3)]
    graph = torch.cuda.CUDAGraph()
    t_capture = time.perf_counter()
    with torch.cuda.graph(graph):
        run()
    t_capture = 1e3 * (time.perf_counter() - t_capture)
    return {"eager_ms": eager, "capture_ms": t_capture, "replay_ms": [timed(graph.replay) for _ in range(replays)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="gpu")
    ap.add_argument("--kernels", default="fused,sdpa-bias")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "gpu" / "profile_step.json")
    a = ap.parse_args()
    w = workloads.get(a.workload)
    if not torch.cuda.is_available():  # the prepared check's dry run on the CPU: the command parses, nothing to time
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"workload": a.workload, "skipped": "no CUDA device"}))
        print("profile: no CUDA device, nothing to time")
        return
    device = torch.device("cuda")
    graphs.DEFAULT_GRAPH = graphs.CudaGraph
    result = {"workload": a.workload, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "kernels": {}}
    try:
        result["fused_op_capture"] = op_capture(device)
    except Exception as e:  # noqa: BLE001
        result["fused_op_capture"] = {"error": f"{type(e).__name__}: {e}"[:500]}
    print("fused op", json.dumps(result["fused_op_capture"]), flush=True)
    for kernel in a.kernels.split(","):
        entry = result["kernels"][kernel] = {}
        for name, fn in (("captured", captured_times), ("eager", eager_profile)):
            try:
                entry[name] = fn(w, kernel, device)
            except Exception as e:  # noqa: BLE001 - a failing part is reported, the others still run
                entry[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
            print(kernel, name, json.dumps(entry[name])[:1500], flush=True)
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(result, indent=1))
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
