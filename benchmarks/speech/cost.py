"""What each arm of a speech study costs: parameters, FLOPs per update and training CPU seconds per update.

    python -m benchmarks.speech.cost benchmarks/speech/fair.toml [--variants A B] [--updates 10 50] [--out DIR]

- FLOPs per update: the forward and backward pass of one training batch (``train.batch_size`` streams x
  ``model.seg_len`` samples, memories full, the compression loss included), counted by ``torch.utils.flop_counter``;
  the attention layers' and compressors' share from the forward pass alone.
- CPU seconds per update (the cost pilot): the study's own training (``train_run``) of each arm for the two numbers
  of updates given, one torch thread, process CPU time (``time.process_time``, so pauses and other processes do not
  count); the difference divided by the difference of updates leaves out start-up (token cache, model building).
  Periodic validation is switched off; the final one is cut to one batch.

Writes ``cost.json`` and ``cost.md`` into ``--out`` (default: the folder named after the spec, e.g. fair/).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.flops import cost_arguments, count, matching, save_cost
from compressive_transformer.core.config import RunConfig
from compressive_transformer.core.models.kinds import build_model
from compressive_transformer.experiments.study import load_study
from compressive_transformer.runs.machine import machine_info
from compressive_transformer.training.workflows import train_run


def flops_per_update(cfg: RunConfig) -> dict[str, int]:
    """FLOPs of one update's forward + backward with every memory full (random samples: the count does not depend
    on them), in total and in the attention layers and the compressors."""
    torch.manual_seed(0)
    m = cfg.model
    model = build_model(m)
    b, n = cfg.train.batch_size, m.seg_len
    tokens = torch.randint(0, m.vocab_size, (b, n))
    memory = model.init_memory(b)
    reach = m.memory.mem_len + m.compression.rate * m.memory.cmem_len
    with torch.no_grad():
        for _ in range(math.ceil(reach / n) + 1):  # fill memory and compressed memory
            memory = model(tokens, memory).memory

    def step() -> None:
        out = model(tokens, memory, targets=tokens)
        (out.loss + out.aux_loss).backward()

    total, _ = count(step)
    # per module from a forward pass alone: the counter charges backward work to whichever module ran last
    forward, per_module = count(lambda: model(tokens, memory, targets=tokens))
    return {
        "total": total,
        "forward": forward,
        "attention_forward": matching(per_module, r"blocks\.\d+\.attn"),
        "compressors_forward": matching(per_module, r"compressors\.\d+"),
    }


def cpu_seconds_per_update(cfg: RunConfig, updates: tuple[int, int], scratch: Path) -> float:
    """Process CPU seconds per update of the study's training, from two runs of ``updates`` (fewer, more)."""
    seconds = []
    for i, steps in enumerate(updates):
        train = dataclasses.replace(
            cfg.train,
            steps=steps,
            val_every=0,
            val_batches=1,
            checkpoint_every=0,
            num_threads=1,
            progress=False,
            warmup_steps=min(cfg.train.warmup_steps, steps),
        )
        run = dataclasses.replace(cfg, train=train)
        t0 = time.process_time()
        train_run(run, scratch / f"run-{i}", log=lambda _: None)
        seconds.append(time.process_time() - t0)
    return (seconds[1] - seconds[0]) / (updates[1] - updates[0])


def measure(spec: Path, variants: list[str] | None, updates: tuple[int, int]) -> dict[str, Any]:
    torch.set_num_threads(1)
    study = load_study(spec)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg in study.configs.items():
            if variants and name not in variants:
                continue
            cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, cache_dir=str(Path(tmp) / "cache")))
            model = build_model(cfg.model)
            flops = flops_per_update(cfg)
            cpu = cpu_seconds_per_update(cfg, updates, Path(tmp) / name)
            out[name] = {
                "parameters": sum(p.numel() for p in model.parameters()),
                "updates": cfg.train.steps,
                "flops_per_update": flops,
                "train_flops": flops["total"] * cfg.train.steps,
                "cpu_seconds_per_update": cpu,
                "train_cpu_seconds_estimate": cpu * cfg.train.steps,
            }
            print(
                f"{name}: {out[name]['parameters']:,} parameters, {flops['total'] / 1e9:.2f} GFLOP and "
                f"{cpu:.3f} CPU s per update",
                flush=True,
            )
    return out


def markdown(result: dict[str, Any]) -> list[str]:
    lines = [
        f"# Cost per arm: {result['spec']}",
        "",
        f"`{result['command']}`. FLOPs: forward + backward of one update with full memory (torch.utils.flop_counter: "
        "matrix products and convolutions). CPU seconds per update: the difference of two training runs of "
        f"{result['pilot_updates'][0]} and {result['pilot_updates'][1]} updates (process CPU time, one torch thread).",
        "",
        "| variant | parameters | updates | GFLOP / update | forward | of which attention | of which compressor | "
        "training PFLOP | CPU s / update | training CPU s (estimate) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in result["variants"].items():
        f = c["flops_per_update"]
        lines.append(
            f"| {name} | {c['parameters']:,} | {c['updates']} | {f['total'] / 1e9:.3f} | {f['forward'] / 1e9:.3f} | "
            f"{f['attention_forward'] / 1e9:.3f} | {f['compressors_forward'] / 1e9:.3f} | "
            f"{c['train_flops'] / 1e15:.3f} | {c['cpu_seconds_per_update']:.3f} | "
            f"{c['train_cpu_seconds_estimate']:,.0f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = cost_arguments(__doc__, "variants", (10, 50), argv)
    result = {
        "spec": str(args.spec),
        "command": "python -m benchmarks.speech.cost " + " ".join(sys.argv[1:] if argv is None else argv),
        "pilot_updates": list(args.updates),
        "machine": machine_info() | {"torch_threads": 1},
        "variants": measure(args.spec, args.arms, tuple(args.updates)),
    }
    save_cost(args.out, result, "variants", markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
