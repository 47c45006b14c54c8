"""One measurement in its own process: one implementation, one phase (train | eval | generate), or the matmul rate.

Run by bench.py / scaling.py / gpu.py; writes one JSON object to --out. Peak resident memory is this process's
high-water mark (VmHWM), so every phase gets a fresh process and its own peak; on a GPU (``--device cuda``) the peak
of the CUDA allocator is reported beside it. Every step returns its loss as a Python float, which waits for the
device, so wall-clock step times are the device's too.
"""

from __future__ import annotations

import argparse
import importlib
import json
import resource
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common import repo_path, under_autocast


def rss_mb(field: str) -> float:
    """VmHWM (peak) or VmRSS (current) of this process in MiB, from /proc; ru_maxrss as a fallback."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def summary(times: list[float]) -> dict:
    s = sorted(times)
    q = lambda f: s[min(len(s) - 1, int(round(f * (len(s) - 1))))]  # noqa: E731
    return {"median_s": statistics.median(s), "p25_s": q(0.25), "p75_s": q(0.75), "min_s": s[0], "n": len(s)}


def matmul_rate(n: int, repeats: int, device: str = "cpu", dtype: str = "float32") -> dict:
    """The rate of an n x n x n ``torch.mm`` in ``dtype`` on ``device`` (fp32 on a GPU without TF32): what MFU is
    measured against."""
    import torch

    from benchmarks.impls import stamp

    kw = dict(device=device, dtype=getattr(torch, dtype))
    a, b = torch.randn(n, n, **kw), torch.randn(n, n, **kw)
    c = torch.empty(n, n, **kw)
    for _ in range(3):
        torch.mm(a, b, out=c)
    times = []
    for _ in range(repeats):
        t0 = stamp()
        torch.mm(a, b, out=c)
        times.append(stamp() - t0)
    s = summary(times)
    flops = 2.0 * n**3
    return {
        **s,
        "size": n,
        "dtype": dtype,
        "gflops_median": flops / s["median_s"] / 1e9,
        "gflops_best": flops / s["min_s"] / 1e9,
    }


def batches(w, n: int, seed: int, batch: int, seg_len: int, device: str = "cpu"):
    import torch

    g = torch.Generator().manual_seed(seed)
    stream = torch.randint(0, w.vocab, (batch, n * seg_len + 1), generator=g).to(device)
    return [
        (stream[:, i * seg_len : (i + 1) * seg_len], stream[:, i * seg_len + 1 : (i + 1) * seg_len + 1])
        for i in range(n)
    ]


class _AutocastGenerate:
    """``impl`` whose ``generate`` runs under autocast to ``amp``: nothing else about the implementation changes."""

    def __init__(self, impl, device: str, amp: str) -> None:
        self.impl, self.device, self.amp = impl, device, amp

    def generate(self, prompt, n_new: int):
        return under_autocast(self.impl.generate, self.device, self.amp)(prompt, n_new)


def warmed_up(impl, w, phase: str, steps: int, warmup: int, device: str = "cpu", amp: str = "none"):
    """The step function, the batches of the ``steps`` timed steps, and the warm-up time: memories filled to steady
    state with cheap no-grad evaluation steps (same memory update), then ``warmup`` steps of the timed kind."""
    step = under_autocast(impl.train_step if phase == "train" else impl.eval_step, device, amp)
    eval_step = under_autocast(impl.eval_step, device, amp)
    fill = w.fill_segments
    n_warm = fill + warmup
    data = [
        impl.prepare(x, y)
        for x, y in batches(w, n_warm + steps, seed=0, batch=w.batch, seg_len=w.seg_len, device=device)
    ]
    impl.reset()
    t0 = time.perf_counter()
    for i, b in enumerate(data[:n_warm]):
        (eval_step if i < fill else step)(b)
    return step, data[n_warm:], time.perf_counter() - t0


def run_steps(impl, w, phase: str, steps: int, warmup: int, device: str = "cpu", amp: str = "none") -> dict:
    step, timed, warm_s = warmed_up(impl, w, phase, steps, warmup, device, amp)
    n_warm = w.fill_segments + warmup
    times, losses = [], []
    for b in timed:
        t0 = time.perf_counter()
        losses.append(step(b))
        times.append(time.perf_counter() - t0)
    s = summary(times)
    tokens = w.batch * w.seg_len
    out = {
        **s,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / s["median_s"],
        "warmup_steps": n_warm,
        "warmup_s": warm_s,
        "last_loss": losses[-1],
    }
    if hasattr(impl, "frozen_kv"):
        out["frozen_kv_layers"] = impl.frozen_kv()
    return out


def run_profile(impl, w, phase: str, steps: int, warmup: int, device: str = "cpu", amp: str = "none") -> dict:
    """``steps`` steps of ``phase`` under ``torch.profiler``: each operator's self CPU time per step (what the step
    spends where; benchmarks/profile_step.py groups the operators), the profiled wall time per step, and the wall
    time of as many steps without the profiler just before."""
    from torch.profiler import profile

    step, timed, _ = warmed_up(impl, w, phase, steps, warmup, device, amp)
    t0 = time.perf_counter()
    for b in timed:  # the same steps unprofiled first: what the profiler itself adds
        step(b)
    plain = time.perf_counter() - t0
    with profile() as prof:
        t0 = time.perf_counter()
        for b in timed:
            step(b)
        wall = time.perf_counter() - t0
    ops = {e.key: e.self_cpu_time_total / 1e3 / steps for e in prof.key_averages()}
    calls = {e.key: e.count / steps for e in prof.key_averages()}
    return {
        "profiled_phase": phase,
        "steps": steps,
        "wall_ms_per_step": 1e3 * wall / steps,
        "unprofiled_ms_per_step": 1e3 * plain / steps,
        "self_ms_per_step": dict(sorted(ops.items(), key=lambda kv: -kv[1])),
        "calls_per_step": calls,
    }


def serve_steps(impl, w, phase: str, warmup: int, device: str = "cpu", amp: str = "none") -> dict:
    """Interleaved mode: the parent says when to run each timed step (so that every implementation's k-th step runs
    in the same stretch of time and outside load hits all alike). Protocol on stdin/stdout, one line each:
    ``fill`` -> ``@@ ok``; ``step`` -> ``@@ <seconds>``; ``quit`` -> return."""
    n_warm = w.fill_segments + warmup
    times, losses = [], []
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "fill":
            step, extra, _ = warmed_up(
                impl, w, phase, 1, warmup, device, amp
            )  # timed steps reuse one batch (memory still moves)
            print("@@ ok", flush=True)
        elif cmd == "step":
            t0 = time.perf_counter()
            losses.append(step(extra[0]))
            dt_ = time.perf_counter() - t0
            times.append(dt_)
            print(f"@@ {dt_:.6f}", flush=True)
        elif cmd == "quit":
            break
    s = summary(times)
    tokens = w.batch * w.seg_len
    out = {
        **s,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / s["median_s"],
        "warmup_steps": n_warm,
        "last_loss": losses[-1],
        "interleaved": True,
        "step_times_s": times,
    }
    if hasattr(impl, "frozen_kv"):
        out["frozen_kv_layers"] = impl.frozen_kv()
    return out


def run_generate(impl, w, device: str = "cpu", amp: str = "none") -> dict:
    """Per-token cost after each prompt length, and tokens/s of a long generation; under autocast to ``amp`` (the
    implementation's own generation code, unchanged, inside ``torch.autocast``)."""
    import torch

    impl = _AutocastGenerate(impl, device, amp)
    g = torch.Generator().manual_seed(1)
    per_prompt = []
    prompts = list(w.gen_prompts)
    first_call_s = None
    for p in prompts:
        prompt = torch.randint(0, w.vocab, (w.gen_batch, p), generator=g).to(device)
        start = time.perf_counter()
        impl.generate(prompt[:, : w.seg_len], min(8, w.gen_new))  # warm-up (allocator, caches, compilation)
        first_call_s = time.perf_counter() - start if first_call_s is None else first_call_s
        stamps = impl.generate(prompt, w.gen_new)
        dts = [b - a for a, b in zip(stamps, stamps[1:])]
        s = summary(dts)
        per_prompt.append(
            {
                "prompt": p,
                "new": w.gen_new,
                "ms_per_token_median": 1e3 * s["median_s"],
                "ms_per_token_mean": 1e3 * (stamps[-1] - stamps[0]) / (len(stamps) - 1),
                "ms_per_token_p25": 1e3 * s["p25_s"],
                "ms_per_token_p75": 1e3 * s["p75_s"],
            }
        )
    prompt = torch.randint(0, w.vocab, (w.gen_batch, w.gen_long_prompt), generator=g).to(device)
    stamps = impl.generate(prompt, w.gen_long)
    elapsed = stamps[-1] - stamps[0]  # tokens 2..N (the first comes with reading the prompt)
    tps = w.gen_batch * (len(stamps) - 1) / elapsed
    # Per-token cost over the long run in quarters: constant cost gives four equal numbers.
    q = (len(stamps) - 1) // 4
    quarters = [1e3 * (stamps[(i + 1) * q] - stamps[i * q]) / q for i in range(4)] if q > 0 else []
    return {
        "batch": w.gen_batch,
        "per_prompt": per_prompt,
        "first_call_s": first_call_s,
        "long": {
            "prompt": w.gen_long_prompt,
            "new": w.gen_long,
            "seconds": elapsed,
            "tokens_per_s": tps,
            "ms_per_token_by_quarter": quarters,
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", required=True)
    ap.add_argument(
        "--phase",
        required=True,
        choices=["train", "eval", "generate", "matmul", "build", "all", "profile_train", "profile_eval", "quality"],
    )
    ap.add_argument("--workload", required=True, help="name, or a JSON object of Workload fields")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build-kw", default="{}", help="JSON keyword arguments for the adapter's build()")
    ap.add_argument("--matmul-n", type=int, default=0, help="0: the workload's matmul_n")
    ap.add_argument("--serve", action="store_true", help="interleaved mode: timed steps on request (see serve_steps)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N: where the model, data and memories live")
    ap.add_argument(
        "--amp",
        default="none",
        choices=["none", "bf16", "fp16"],
        help="autocast of every phase's steps (train, eval, generate, profile, quality)",
    )
    ap.add_argument(
        "--seed", type=int, default=0, help="quality: the seed of the initial weights and of the data order"
    )
    ap.add_argument("--budget", type=float, default=600.0, help="quality: seconds of training (wall clock)")
    ap.add_argument(
        "--data", default="", help="quality: a PG-19-layout directory (train/ and validation/ of .txt books)"
    )
    ap.add_argument(
        "--val-segments", type=int, default=256, help="quality: validation segments per stream (0: the whole split)"
    )
    ap.add_argument("--matmul-dtype", default="float32", help="dtype of the --phase matmul product")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed if a.phase == "quality" else 0)
    from benchmarks import workloads

    if a.workload.startswith("{"):
        spec = json.loads(a.workload)
        name = spec.pop("name")
        spec = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()}
        w = workloads.Workload(name, **spec)
    else:
        w = workloads.get(a.workload)
    if a.phase == "quality":
        w = w.replace(vocab=256)  # the PG-19 sample as bytes, whatever vocabulary the workload's random tokens use
    steps = w.steps if a.steps is None else a.steps
    warmup = w.warmup if a.warmup is None else a.warmup
    result: dict = {
        "impl": a.impl,
        "phase": a.phase,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": repo_path(sys.executable),
        "device": a.device,
        "amp": a.amp,
    }
    cuda = a.device.startswith("cuda")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32
        result["gpu"] = torch.cuda.get_device_name(a.device)
    rss_start = rss_mb("VmRSS")
    if a.phase == "matmul":
        result.update(matmul_rate(a.matmul_n or w.matmul_n, max(steps, 10), a.device, a.matmul_dtype))
    else:
        mod = importlib.import_module(f"benchmarks.impls.{a.impl}")
        t0 = time.perf_counter()
        impl = mod.build(w, **json.loads(a.build_kw))
        impl.model.to(a.device)  # in place: the optimizer built with the model keeps the same parameters
        result.update(
            label=getattr(mod, "LABEL", a.impl),
            module_file=repo_path(mod.__file__),
            param_count=impl.param_count,
            config=getattr(impl, "config", {}),
            build_s=time.perf_counter() - t0,
            rss_after_import_mb=rss_start,
            rss_after_build_mb=rss_mb("VmRSS"),
        )
        peers = {
            name: repo_path(sys.modules[name].__file__)
            for name in ("compressive_transformer", "compressive_transformer_pytorch", "labml_nn")
            if name in sys.modules
        }
        result["loaded_packages"] = peers
        if a.phase in ("train", "eval") and a.serve:
            result.update(serve_steps(impl, w, a.phase, warmup, a.device, a.amp))
        elif a.phase in ("train", "eval"):
            result.update(run_steps(impl, w, a.phase, steps, warmup, a.device, a.amp))
        elif a.phase.startswith("profile_"):
            result.update(run_profile(impl, w, a.phase.removeprefix("profile_"), steps, warmup, a.device, a.amp))
        elif a.phase == "generate":
            result.update(run_generate(impl, w, a.device, a.amp))
        elif a.phase == "quality":
            from benchmarks.quality import run_quality

            result.update(
                run_quality(
                    impl,
                    w,
                    data=Path(a.data),
                    seed=a.seed,
                    budget_s=a.budget,
                    val_segments=a.val_segments,
                    device=a.device,
                    amp=a.amp,
                )
            )
        elif a.phase == "all":  # every phase in this one process (peak RSS is cumulative; the GPU's peak is not)
            for phase in ("train", "eval", "generate"):
                if (phase == "train" and not w.train) or (phase == "generate" and not w.gen_prompts):
                    continue
                if cuda:  # the last phase's memories released before the allocator's peak is reset
                    impl.reset()
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(a.device)
                r = (
                    run_steps(impl, w, phase, steps, warmup, a.device, a.amp)
                    if phase != "generate"
                    else run_generate(impl, w, a.device, a.amp)
                )
                result[phase] = {**r, "peak_rss_mb": rss_mb("VmHWM"), "cumulative_rss": True}
                if cuda:
                    result[phase]["peak_cuda_mb"] = torch.cuda.max_memory_allocated(a.device) / 2**20
    result["peak_rss_mb"] = rss_mb("VmHWM")
    if cuda:
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated(a.device) / 2**20
    Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
