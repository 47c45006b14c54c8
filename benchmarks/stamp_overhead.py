"""What keeping the inference caches true costs: evaluation and generation with the weight-content checks
(:class:`compressive_transformer.core.stamps.ContentStamp`) against the same run with the checks replaced by a constant,
interleaved in one process on the reference workload (so a busy machine slows both alike).

    python -m benchmarks.stamp_overhead [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from compressive_transformer.core import stamps
from compressive_transformer.core.config import CompressionConfig, MemoryConfig, ModelConfig
from compressive_transformer.core.models import build_model
from compressive_transformer.runs.machine import machine_info
from compressive_transformer.training.generate import generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=256, d_model=256, n_layers=4, n_heads=4, d_ff=1024, seg_len=128,
        memory=MemoryConfig(mem_len=128, cmem_len=128),
        compression=CompressionConfig(rate=4, function="conv", loss="attention"), dropout=0.0,
    )  # fmt: skip
    model = build_model(cfg).eval()
    tokens = torch.randint(0, 256, (8, 128 * 6))
    checked, unchecked = stamps.ContentStamp.current, lambda self, w: 1

    @torch.no_grad()
    def eval_segment() -> float:
        memory, start = model.init_memory(8), time.perf_counter()
        for seg in tokens.split(cfg.seg_len, dim=1):
            memory = model(seg, memory).memory
        return (time.perf_counter() - start) / 6

    def gen_token() -> float:
        start = time.perf_counter()
        generate(model, [1, 2, 3], max_new_tokens=200, temperature=0.0, seed=0)
        return (time.perf_counter() - start) / 200

    times: dict[str, list[float]] = {"eval checked": [], "eval unchecked": [], "gen checked": [], "gen unchecked": []}
    try:
        for _ in range(args.rounds):
            for mode, current in (("checked", checked), ("unchecked", unchecked)):
                stamps.ContentStamp.current = current
                times[f"eval {mode}"].append(eval_segment())
                times[f"gen {mode}"].append(gen_token())
    finally:
        stamps.ContentStamp.current = checked
    med = {k: statistics.median(v) for k, v in times.items()}
    report = {
        "median_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
        "eval_time_ratio": round(med["eval checked"] / med["eval unchecked"], 4),
        "generate_time_ratio": round(med["gen checked"] / med["gen unchecked"], 4),
        "machine": machine_info(),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
