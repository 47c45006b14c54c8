"""Compile every tuned configuration of every fused-attention pass, one process per configuration, all in parallel,
into the Triton cache that the later measurements read, before anything is tuned or timed.

    python -m benchmarks.warm_kernels [--device cuda] [--jobs 16] [--out warm.json]

On a fresh GPU machine the first call of each pass tunes its tiles, compiling about twenty configurations one
after another; here each is compiled at the ``gpu`` workload's attention shape exactly as the tuning will launch it
(the same arguments, hence the same specialisation and the same cache entry: ``fused_attention.attention_shape``
sizes the tables as the model does), so that the tuning and the model's step only read the cache. Also compiled, each
in its own process: the first fused kernel (``benchmarks/impls/fused_v1``), FlexAttention under torch.compile
(forward and backward, into inductor's cache) and the `gpu` workload's training step compiled and captured as
``profile_gpu_step`` builds it (two updates: inductor's cache then holds the step's kernels). On the CPU (a dry run) each job runs its pass once through Triton's
interpreter at a tiny shape with its configuration, one job per pass (the interpreter has nothing to cache).
Writes ``--out`` with each job's status and seconds; exits non-zero when a job failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

from benchmarks.fused_attention import CPU_SHAPE, GPU_SHAPE, flex, make_inputs
from benchmarks.impls.fused_v1 import launch as first
from compressive_transformer.core.attention import KeyMask
from compressive_transformer.core.kernels import fused_triton as current
from compressive_transformer.core.kernels.flex import prepare
from compressive_transformer.core.kernels.triton_interpreter import interpreted

PASSES = {"forward": current.FORWARD, "key": current.KEY_GRADS, "query": current.QUERY_GRADS}


def jobs(device: str) -> list[str]:
    """One name per compilation: ``<pass>:<config index>``, ``first``, ``flex`` and ``step`` (on the CPU the first
    config of each pass only)."""
    names = [f"{p}:{i}" for p, k in PASSES.items() for i in range(len(k.configs) if device == "cuda" else 1)]
    return names + ["first", "flex", "step"]


def _inputs(device: str):
    shape = GPU_SHAPE if device == "cuda" else CPU_SHAPE
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tensors, key_valid = make_inputs(shape, device, dtype)
    return shape, [t.detach() for t in tensors], key_valid


def _recorded(module, call) -> list[tuple]:
    """The launches ``call`` makes through ``module._launch``, recorded, not made."""
    launches: list[tuple] = []
    with mock.patch.object(module, "_launch", lambda *a: launches.append(a)):
        call()
    return launches


def _both_passes(module, shape, tensors, key_valid, *sizes):
    def call():
        out, lse = module._forward(*tensors, key_valid, shape["C"], 0, *sizes)
        module._backward(torch.ones_like(out), *tensors, key_valid, out, lse, shape["C"], 0, *sizes)

    return call


def run_job(name: str, device: str) -> None:
    """Compile (CUDA) or run once in the interpreter (CPU) what job ``name`` stands for."""
    if name == "step":  # on the CPU the dry run's step: tiny, eager, with sdpa-bias (the interpreter is slow)
        from benchmarks import profile_gpu_step, workloads

        cuda = device == "cuda"
        w = workloads.get("gpu" if cuda else "tiny")
        step, x, y, memory = profile_gpu_step.build(w, "fused" if cuda else "sdpa-bias", torch.device(device), cuda)
        mask = torch.ones_like(x, dtype=torch.bool)
        for _ in range(2):  # eager (compiling), then the capture
            (stats, _), memory = step.captured(x, y, mask, memory)
        float(stats[0])
        return
    shape, tensors, key_valid = _inputs(device)
    if name == "flex":
        leaves = [t.requires_grad_() for t in tensors]
        mask = prepare(KeyMask(key_valid, shape["C"], 0), shape["T"], tensors[0].dtype)
        out = flex(*leaves, mask)
        torch.autograd.grad(out, leaves, torch.ones_like(out))
        return
    if name == "first":
        for kernel, grid, args, meta, _dev in _recorded(first, _both_passes(first, shape, tensors, key_valid)):
            if device == "cuda":
                kernel.run(*args, grid=grid, warmup=True, **meta)
            else:
                interpreted(kernel)[grid](*args, **meta)
        return
    pass_name, index = name.split(":")
    target = PASSES[pass_name]
    launches = _recorded(current, _both_passes(current, shape, tensors, key_valid, 0, 0))
    for kernel, grid, args, meta, dev, _tiles in launches:
        if kernel is not target:
            continue
        if device == "cuda":
            kernel.compile_only(grid, args, meta, kernel.triton_configs()[int(index)])
        else:
            kernel(grid, args, meta, dev, kernel.configs[int(index)])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes at once")
    ap.add_argument("--job", default=None, help=argparse.SUPPRESS)  # one job, in a child process
    ap.add_argument("--out", type=Path, default=Path("warm.json"))
    a = ap.parse_args(argv)
    if a.job is not None:
        run_job(a.job, a.device)
        return {}
    pending = jobs(a.device)
    running: dict[str, tuple[subprocess.Popen, float]] = {}
    logs: dict = {}
    result = {"device": a.device, "jobs": {}}
    t_start = time.perf_counter()
    while pending or running:
        while pending and len(running) < a.jobs:
            name = pending.pop(0)
            cmd = [sys.executable, "-m", "benchmarks.warm_kernels", "--device", a.device, "--job", name]
            log = tempfile.TemporaryFile("w+")  # not a pipe: a chatty compiler cannot fill it and stall the child
            running[name] = (
                subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True),
                time.perf_counter(),
            )
            logs[name] = log
        for name, (proc, t0) in list(running.items()):
            if proc.poll() is None:
                continue
            logs[name].seek(0)
            output = logs.pop(name).read()
            entry = {"status": "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"}
            entry["seconds"] = round(time.perf_counter() - t0, 1)
            if proc.returncode != 0:
                entry["output_tail"] = output[-1500:]
                print(f"[warm] {name}: {entry['status']}\n{output[-1500:]}", flush=True)
            result["jobs"][name] = entry
            del running[name]
            print(f"[warm] {name}: {entry['status']} in {entry['seconds']}s", flush=True)
            result["seconds"] = round(time.perf_counter() - t_start, 1)
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(result, indent=1) + "\n")
        time.sleep(0.2)
    failed = [n for n, e in result["jobs"].items() if e["status"] != "ok"]
    print(f"[warm] {len(result['jobs'])} jobs in {result.get('seconds', 0)}s, {len(failed)} failed", flush=True)
    if failed:
        raise SystemExit(f"warm: failed: {', '.join(failed)}")
    return result


if __name__ == "__main__":
    main()
