"""Where the compressive model's extra training time goes, and what one batch-1 forward costs against its length.

Part 1 (training step, reference widths): variants of our model timed interleaved in one process (step k of every
variant before step k+1 of any), so outside load hits them alike:

- ``compressive``: the benchmark model (conv compression, attention-reconstruction loss);
- ``no_aux_loss``: the same model and memories, the step without the reconstruction loss (compressor untrained);
- ``max_pool``: parameter-free compression, no auxiliary loss (what is left: the compressed positional stream,
  compressing and the memory update);
- ``transformer_xl``: n_m = n_m + n_cm, n_cm = 0 (the same number of keys per query).

Part 2 (generation at batch 1): the cost of one forward of T new tokens over full memories, T = 1, 8, 32, 64, 128.
At batch 1 on a CPU a forward reads every weight once whatever T is, so its cost grows far slower than T: this is
what bounds how much faster one-token-per-step generation can be than re-encoding a window of tokens.

    python -m benchmarks.overhead                 # writes results/overhead.{json,md}
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

import torch

from benchmarks.impls import ours
from benchmarks.workloads import in_process_script, write_report
from compressive_transformer import CompressiveTransformerLM

HERE = Path(__file__).resolve().parent


class Variant:
    def __init__(self, w, cfg, aux: bool) -> None:
        self.model = CompressiveTransformerLM(cfg).train()
        self.opt = w.optimizer(self.model.parameters())
        self.memory = self.model.init_memory(w.batch)
        self.aux = aux

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        out = self.model(x, memory=self.memory, targets=y, compression_loss=self.aux)
        loss = out.loss + out.aux_loss if self.aux else out.loss
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.memory = out.memory


def training_breakdown(w, steps: int) -> dict:
    base = ours.model_config(w)
    variants = {
        "compressive": Variant(w, base, aux=True),
        "no_aux_loss": Variant(w, base, aux=False),
        "max_pool": Variant(
            w,
            dataclasses.replace(
                base, compression=dataclasses.replace(base.compression, function="max_pool", loss="none")
            ),
            aux=False,
        ),
        "transformer_xl": Variant(w, ours.model_config(w, compressive=False), aux=False),
    }
    x, y = torch.randint(0, w.vocab, (w.batch, w.seg_len)), torch.randint(0, w.vocab, (w.batch, w.seg_len))
    for v in variants.values():
        for _ in range(w.fill_segments + 2):
            v.step(x, y)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(steps):
        order = list(variants)[i % len(variants) :] + list(variants)[: i % len(variants)]
        for k in order:
            t0 = time.perf_counter()
            variants[k].step(x, y)
            times[k].append(time.perf_counter() - t0)
    xl = statistics.median(times["transformer_xl"])
    return {
        k: {
            "median_ms": statistics.median(t) * 1e3,
            "min_ms": min(t) * 1e3,
            "vs_transformer_xl": statistics.median(t) / xl,
        }
        for k, t in times.items()
    }


@torch.no_grad()
def forward_cost_by_length(w, lengths: list[int], repeats: int) -> dict:
    model = CompressiveTransformerLM(ours.model_config(w)).eval()
    memory = model.init_memory(1)
    for _ in range(w.fill_segments):
        memory = model(torch.randint(0, w.vocab, (1, w.seg_len)), memory=memory).memory
    out = {}
    for T in lengths:
        tok = torch.randint(0, w.vocab, (1, T))
        for _ in range(3):
            model(tok, memory=memory)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(tok, memory=memory)  # the same full memories every time: only the cost of T matters here
            times.append(time.perf_counter() - t0)
        out[T] = statistics.median(times) * 1e3
    return out


def main() -> None:
    a, w = in_process_script(
        __doc__,
        HERE / "results",
        steps=(16, "timed training steps per variant"),
        repeats=(30, "timed forwards per length"),
    )
    lengths = [t for t in (1, 8, 32, 64, 128) if t <= w.seg_len]
    result = {
        "workload": w.to_dict(),
        "threads": a.threads,
        "training": training_breakdown(w, a.steps),
        "forward_ms_by_length": forward_cost_by_length(w, lengths, a.repeats),
    }
    tr, fw = result["training"], result["forward_ms_by_length"]
    lines = [
        f"# Compression overhead and batch-1 forward cost (`{a.workload}`, {a.threads} threads)",
        "",
        "| training step | median ms | min ms | / Transformer-XL |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {k} | {v['median_ms']:.1f} | {v['min_ms']:.1f} | {v['vs_transformer_xl']:.3f} |" for k, v in tr.items()
    ]
    lines += [
        "",
        "| new tokens per forward (batch 1, full memories) | ms per forward | ms per token |",
        "|---|---|---|",
    ]
    lines += [f"| {T} | {ms:.2f} | {ms / T:.3f} |" for T, ms in fw.items()]
    write_report(a.out, "overhead", result, lines)


if __name__ == "__main__":
    main()
