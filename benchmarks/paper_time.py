"""How long the paper's enwik8 model takes to train on this GPU: one training update of ``configs/enwik8.toml``
(24 layers, d 1024, n_s = n_m = 768, n_cm = 1152, c = 3, batch 16, bf16) as ``train.cuda_graphs`` runs it, timed at
steady state (memories full), and the hours its whole schedule (``train.steps`` with the late switch to
``accumulate`` batches per update) takes at that speed.

    python -m benchmarks.paper_time --out benchmarks/results/gpu                      # on the GPU
    python -m benchmarks.paper_time --device cpu --set model.n_layers=2 --set model.d_model=64 ...   # a dry run

The seeds do not state the paper's number of training tokens; the schedule of configs/enwik8.toml is this project's
reading of its recipe (Adam, warm-up, cosine decay, four times fewer updates late in training), and its token count
is what the hours are for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks import workloads
from compressive_transformer.core.models import build_model
from compressive_transformer.runs.precision import resolve_amp
from compressive_transformer.runs.rundir import config_from_text
from compressive_transformer.training.captured import CapturedUpdate, make_capturable
from compressive_transformer.training.trainer import build_optimizer

HERE = Path(__file__).resolve().parent


def schedule_tokens(cfg) -> int:
    """Tokens the whole schedule reads: every update's batches (``train.accumulate``) of batch x seg_len tokens."""
    t, per_batch = cfg.train, cfg.train.batch_size * cfg.model.seg_len
    return sum(t.accumulation_at(step) for step in range(t.steps)) * per_batch


def workload_of(cfg) -> workloads.Workload:
    """The config as a benchmark workload, for the model-FLOP count."""
    m = cfg.model
    return workloads.Workload(
        "paper",
        vocab=m.vocab_size,
        d_model=m.d_model,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        d_ff=m.d_ff,
        seg_len=m.seg_len,
        mem_len=m.memory.mem_len,
        cmem_len=m.memory.cmem_len,
        rate=m.compression.rate,
        batch=cfg.train.batch_size,
    )


def timed_updates(cfg, device: torch.device, steps: int) -> dict:
    """Median seconds of the captured update after the memories are full and the graph is captured."""
    torch.manual_seed(0)
    model = build_model(cfg.model).to(device).train()
    optimizer = build_optimizer(model, cfg.train)
    amp = resolve_amp(cfg.train.amp, device)
    make_capturable(optimizer)
    update = CapturedUpdate(model, optimizer, amp=amp, grad_clip=cfg.train.grad_clip)
    w = workload_of(cfg)
    B, T = w.batch, w.seg_len
    tokens = torch.randint(0, w.vocab, (B, T + 1), device=device)
    x, y, mask = tokens[:, :-1], tokens[:, 1:], torch.ones(B, T, dtype=torch.bool, device=device)
    memory = model.init_memory(B, device=device)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp == "bf16"):
        for _ in range(w.fill_segments):  # steady state: both memories full
            memory = model(x, memory=memory).memory
    times = []
    for i in range(steps + 2):  # the first runs eagerly, the second captures
        sync(device)
        t0 = time.perf_counter()
        (stats, _), memory = update(x, y, mask, memory)
        float(stats[0])
        if i >= 2:
            times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return {"median_s": statistics.median(times), "times_s": times, "amp": amp, "peak_cuda_mb": peak}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=HERE.parent / "configs" / "enwik8.toml")
    ap.add_argument("--set", action="append", default=[], help="a dotted override (dry runs at small sizes)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "gpu")
    a = ap.parse_args()
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here; use --device cpu for a dry run")
    if device.type == "cpu":  # the capture has no CPU form: the recorded stand-in runs everything around it
        from compressive_transformer.core import graphs

        graphs.DEFAULT_GRAPH = graphs.RecordedGraph
    cfg = config_from_text(a.config.read_text(), [f"train.device={a.device}", *a.set])
    timing = timed_updates(cfg, device, a.steps)
    w = workload_of(cfg)
    tokens_per_s = w.batch * w.seg_len / timing["median_s"]
    total = schedule_tokens(cfg)
    result = {
        "config": str(a.config.name),
        "overrides": a.set,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "params": sum(p.numel() for p in build_model(cfg.model).parameters()),
        "tokens_per_update_batch": w.batch * w.seg_len,
        "tokens_per_s": tokens_per_s,
        "model_tflops_per_s": tokens_per_s * workloads.train_flops_per_token(w) / 1e12,
        "schedule_tokens": total,
        "hours": total / tokens_per_s / 3600,
        **timing,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "paper_time.json").write_text(json.dumps(result, indent=1))
    print(
        f"{result['device']}: {tokens_per_s:,.0f} tokens/s ({result['model_tflops_per_s']:.0f} model TFLOP/s), "
        f"{total / 1e9:.2f}B tokens in {result['hours']:.1f} h"
    )


if __name__ == "__main__":
    main()
