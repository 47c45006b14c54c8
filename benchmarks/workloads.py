"""Named benchmark workloads and the analytical model-FLOP count every implementation is measured against.

A workload fixes everything that decides the amount of work: widths, lengths, compression rate, batch, dtype.
Every adapter in ``impls/`` builds its model from one of these, so all implementations do the same job.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Workload:
    name: str
    vocab: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 1024
    seg_len: int = 128  # n_s
    mem_len: int = 128  # n_m
    cmem_len: int = 128  # n_cm
    rate: int = 4  # c
    batch: int = 8
    lr: float = 3e-4
    train: bool = True  # long_memory is an evaluation-only workload
    gen_batch: int = 1
    gen_prompts: tuple[int, ...] = (128, 1024, 4096)  # tokens consumed before timing per-token generation cost
    gen_new: int = 64  # new tokens timed after each prompt (per-token cost)
    gen_long: int = 1000  # new tokens for the tokens/s figure
    gen_long_prompt: int = 128
    steps: int = 10
    warmup: int = 2  # extra warm-up steps *after* the memories are full (see fill_segments)
    matmul_n: int = 2048  # size of the fp32 torch.mm whose rate MFU is measured against

    @property
    def attn_len(self) -> int:
        """Keys per query at steady state: compressed memory + memory + segment."""
        return self.cmem_len + self.mem_len + self.seg_len

    @property
    def fill_segments(self) -> int:
        """Segments until both memories are full (steady state): n_s * k >= n_m + c * n_cm."""
        span = self.mem_len + self.rate * self.cmem_len
        return -(-span // self.seg_len) + 1

    def optimizer(self, params) -> torch.optim.Adam:
        """The optimizer every implementation steps with: Adam at ``lr``, the fused kernel (the same for all)."""
        return torch.optim.Adam(list(params), lr=self.lr, fused=True)

    def replace(self, **kw) -> "Workload":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


WORKLOADS: dict[str, Workload] = {
    # The reference CPU workload of the issue.
    "reference": Workload("reference"),
    # Long-memory evaluation: same model, memories as long as the paper's evaluation (n_m 512, n_cm 1024).
    "long_memory": Workload("long_memory", mem_len=512, cmem_len=1024, train=False, steps=10, gen_prompts=()),
    # A GPU-sized model (benchmarks/gpu.py): the reference is far too small to keep a GPU busy.
    "gpu": Workload(
        "gpu",
        d_model=512,
        n_layers=8,
        n_heads=8,
        d_ff=2048,
        seg_len=512,
        mem_len=512,
        cmem_len=512,
        batch=16,
        steps=10,
        warmup=3,
        gen_prompts=(512, 4096),
        gen_new=32,
        gen_long=500,
        gen_long_prompt=512,
        matmul_n=8192,
    ),
    # Seconds-long smoke test of the whole harness.
    "tiny": Workload(
        "tiny",
        vocab=64,
        d_model=32,
        n_layers=2,
        n_heads=2,
        d_ff=128,
        seg_len=16,
        mem_len=16,
        cmem_len=8,
        rate=2,
        batch=2,
        steps=2,
        warmup=1,
        gen_prompts=(16, 64),
        gen_new=4,
        gen_long=16,
        gen_long_prompt=16,
        matmul_n=512,
    ),
}


def get(name: str) -> Workload:
    if name not in WORKLOADS:
        raise SystemExit(f"unknown workload {name!r}; use one of {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


# ------------------------------------------------------------------------------------------------------------------
# Model FLOPs (the same count for every implementation of a workload, PaLM-style "model FLOPs", recomputation and
# auxiliary losses not counted):
#   N        = n_layers * (4 d^2 + 2 d d_ff) + d * vocab          (matmul parameters: q, k, v, o, FFN, LM head)
#   attn/tok = 2 * n_layers * d * L * 2                             (Q K^T and A V, forward, L = n_cm + n_m + n_s keys)
#   forward  = 2 N + attn/tok                       per token
#   training = 3 * forward = 6 N + 12 n_layers d L  per token
# The relative-position term (Q R^T), the key/value projection of the memories and the compression network are
# real work too, but they are not part of the model-FLOP definition; they lower MFU, which is the point.


def matmul_params(w: Workload) -> int:
    return w.n_layers * (4 * w.d_model**2 + 2 * w.d_model * w.d_ff) + w.d_model * w.vocab


def forward_flops_per_token(w: Workload, attn_len: int | None = None) -> float:
    L = w.attn_len if attn_len is None else attn_len
    return 2.0 * matmul_params(w) + 4.0 * w.n_layers * w.d_model * L


def train_flops_per_token(w: Workload, attn_len: int | None = None) -> float:
    return 3.0 * forward_flops_per_token(w, attn_len)


def in_process_script(
    doc: str, out: Path, *, steps: tuple[int, str], repeats: tuple[int, str]
) -> tuple[argparse.Namespace, Workload]:
    """Arguments and set-up shared by the single-process measurement scripts (overhead.py, roofline.py): the
    workload, threads (set), a fixed seed, ``--steps`` / ``--repeats`` with the script's defaults and help."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="reference", choices=sorted(WORKLOADS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=steps[0], help=steps[1])
    ap.add_argument("--repeats", type=int, default=repeats[0], help=repeats[1])
    ap.add_argument("--out", type=Path, default=out)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    return a, WORKLOADS[a.workload]


def write_report(out: Path, name: str, result: dict, lines: list[str], *, echo: bool = True) -> None:
    """``name``.json and ``name``.md under ``out``, and (``echo``) the markdown on stdout."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    if echo:
        print("\n".join(lines))
