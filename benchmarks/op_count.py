"""How many operators that launch a kernel one training step (or one generated token) issues, by operator.

On a GPU at small batch a step is bounded by how many kernels it launches rather than by its arithmetic, and the count
does not depend on the device: it is the same aten operators in the same order. So it is measured here on the CPU,
with a :class:`~torch.utils._python_dispatch.TorchDispatchMode` that sees every aten operator the step dispatches,
forward, backward (the autograd engine runs CPU work on the calling thread) and the update.

The rule for what counts as a kernel:

- counted: every aten (or custom) operator, except those below. An operator that runs several kernels (a ``_foreach``
  over many tensors, the fused attention's custom op, the fused Adam step) counts once; an operator that runs none on
  a GPU but reads a device value to the host (``_local_scalar_dense``, from ``.item()``) counts too (it is a copy and
  a synchronisation).
- not counted: views, whose schema says the output aliases an input without writing it (``OpOverload.is_view``:
  ``view``, ``slice``, ``transpose``, ``expand``, ``split``, ``unbind``, ``detach``, ``as_strided``, ...), and the
  operators that only allocate or relabel memory (:data:`METADATA`: ``empty``, ``empty_strided``, ``_unsafe_view``,
  ...), and the profiler's markers (``profiler._record_function_enter_new``). They are listed separately in the
  results.

A training step is the trainer's eager update over one batch, on the device: the forward under the run's autocast,
the task and compression losses, the backward and :func:`~compressive_transformer.training.update.apply_update`
(clipping and the fused Adam step) with the gradients zeroed, counted once the memories are full (every step after
that issues the same operators). The trainer's host bookkeeping (reading the losses, the data position) is left out.
The layer structure is a workload's (``benchmarks/workloads.py``: ``gpu`` has d_model 512, 8 layers, n_s = n_m =
n_cm = 512, c = 4, batch 16); batch and lengths may be cut (by default to 1 and 32) (``--batch``, ``--seg-len``, ...) without changing which
operators run, so the CPU counts it in seconds. A token is one :meth:`Decoder.step` at batch 1 after a prompt that
fills the memories, averaged over c consecutive tokens (one of which compresses).

    python -m benchmarks.op_count --workload gpu --amp bf16 --name train-gpu       # the gpu structure, cut lengths
    python -m benchmarks.op_count --phase decode --workload reference --name decode-reference
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.impls.ours import model_config
from benchmarks.workloads import WORKLOADS, Workload, write_report
from compressive_transformer.core.config import TrainConfig
from compressive_transformer.core.dtypes import amp_dtype, autocast
from compressive_transformer.core.models import build_model
from compressive_transformer.core.models.decode import Decoder
from compressive_transformer.training.trainer import build_optimizer
from compressive_transformer.training.update import apply_update

try:  # the trainer's copies of the matmul weights under autocast (code before them counts autocast's own casts)
    from compressive_transformer.training.low_precision import LowPrecisionWeights, WithLowPrecisionWeights
except ImportError:  # pragma: no cover - earlier code, counted for the "before" numbers
    LowPrecisionWeights = WithLowPrecisionWeights = None

HERE = Path(__file__).resolve().parent
aten = torch.ops.aten

# Operators that allocate or relabel memory without reading or writing it: no kernel on any device.
METADATA = frozenset(
    str(op)
    for op in (
        aten.empty.memory_format,
        aten.empty_strided.default,
        aten.empty_like.default,
        aten.new_empty.default,
        aten.new_empty_strided.default,
        aten._unsafe_view.default,
        aten.set_.source_Storage_storage_offset,
        aten.resize_.default,
    )
)


def launches_kernel(func) -> bool:
    """The counting rule of the module docstring."""
    bookkeeping = str(func).startswith("profiler.")  # record_function's markers (the optimizer's step)
    return not (getattr(func, "is_view", False) or bookkeeping) and str(func) not in METADATA


@dataclass
class Counts:
    kernels: Counter = field(default_factory=Counter)  # operator name -> calls that launch a kernel
    other: Counter = field(default_factory=Counter)  # views and allocations

    @property
    def total(self) -> int:
        return sum(self.kernels.values())


class OpCounter(TorchDispatchMode):
    """Counts every aten operator dispatched while it is active (an operator's own inner operators are not seen: the
    mode is off while it runs one)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts = Counts()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket).removeprefix("aten.")
        (self.counts.kernels if launches_kernel(func) else self.counts.other)[name] += 1
        return func(*args, **(kwargs or {}))


def count(fn) -> tuple[Counts, object]:
    """The operators ``fn()`` dispatches, and its result."""
    with OpCounter() as counter:
        result = fn()
    return counter.counts, result


# ---------------------------------------------------------------------------------------------------------------
# what is counted


def sized(w: Workload, a: argparse.Namespace) -> Workload:
    """The workload's layer structure with the batch and lengths the command line cuts it to."""
    cut = {"batch": a.batch, "seg_len": a.seg_len, "mem_len": a.mem_len, "cmem_len": a.cmem_len}
    if a.phase == "train":  # the defaults: small enough for the CPU in seconds
        default = {"batch": 1} | {k: min(getattr(w, k), 32) for k in ("seg_len", "mem_len", "cmem_len")}
        cut = {k: default[k] if v is None else v for k, v in cut.items()}
    return w.replace(**{k: v for k, v in cut.items() if v is not None})


class TrainingStep:
    """The trainer's eager update over one batch (see the module docstring), on a model of workload ``w``."""

    def __init__(self, w: Workload, *, amp: str, attn_impl: str, grad_clip: float) -> None:
        self.autocast = lambda: autocast("cpu", amp)  # noqa: E731
        self.model = build_model(model_config(w, attn_impl=attn_impl)).train()
        self.forward, self.weights = self.model, None
        if amp_dtype(amp) is not None and LowPrecisionWeights is not None:  # the trainer's copies of the weights
            self.weights = LowPrecisionWeights(self.model, amp_dtype(amp))
            self.forward = WithLowPrecisionWeights(self.model, self.weights)
        self.optimizer = build_optimizer(self.model, TrainConfig(lr=w.lr))
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.max_norm = grad_clip if grad_clip > 0 else float("inf")
        self.memory = self.model.init_memory(w.batch)
        g = torch.Generator().manual_seed(0)
        self.batch = torch.randint(0, w.vocab, (w.batch, w.seg_len + 1), generator=g)
        self.mask = torch.ones(w.batch, w.seg_len, dtype=torch.bool)

    @torch.no_grad()
    def fill(self, segments: int) -> None:
        """Memories full (forwards without gradients: Triton's interpreter makes every kernel slow)."""
        tokens = self.batch[:, :-1]
        for _ in range(segments):
            with self.autocast():
                self.memory = self.model(tokens, memory=self.memory, input_mask=self.mask).memory

    def __call__(self) -> None:
        tokens, targets = self.batch[:, :-1], self.batch[:, 1:]
        with self.autocast():
            out = self.forward(tokens, memory=self.memory, targets=targets, input_mask=self.mask)
        (out.loss.float() + out.aux_loss.float()).backward()
        refresh = {} if self.weights is None else {"weights": self.weights}
        apply_update(self.optimizer, self.params, max_norm=self.max_norm, **refresh)
        self.optimizer.zero_grad(set_to_none=True)
        self.memory = out.memory


class DecodingStep:
    """One :meth:`Decoder.step` at batch 1 after a prompt that fills the memories (``generate``'s decoder)."""

    def __init__(self, w: Workload, *, amp: str, attn_impl: str) -> None:
        self.autocast = lambda: autocast("cpu", amp)  # noqa: E731
        self.model = build_model(model_config(w, attn_impl=attn_impl)).eval()
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, w.vocab, (1, w.fill_segments * w.seg_len), generator=g)
        memory = self.model.init_memory(1)
        with torch.no_grad(), self.autocast():
            for segment in prompt.split(w.seg_len, dim=1):
                memory = self.model(segment, memory=memory).memory
            self.decoder = Decoder(self.model, memory)
        self.token = torch.zeros(1, dtype=torch.long)

    def __call__(self) -> None:
        with self.autocast():
            self.token = self.decoder.step(self.token).argmax(-1)


def measure(a: argparse.Namespace) -> dict:
    w = sized(WORKLOADS[a.workload], a)
    if a.phase == "train":
        step = TrainingStep(w, amp=a.amp, attn_impl=a.attn_impl, grad_clip=a.grad_clip)
        step.fill(w.fill_segments)
        step()  # the optimizer's state made
        counted = [count(step)[0] for _ in range(a.repeats)]
    else:
        step = DecodingStep(w, amp=a.amp, attn_impl=a.attn_impl)
        for _ in range(w.rate):  # past the first token's one-off work
            step()
        counted = [count(step)[0] for _ in range(w.rate * a.repeats)]
    per_step = [c.total for c in counted]
    kernels, other = Counter(), Counter()
    for c in counted:
        kernels.update(c.kernels)
        other.update(c.other)
    n = len(counted)
    return {
        "phase": a.phase,
        "workload": w.to_dict(),
        "structure_of": a.workload,
        "amp": a.amp,
        "attn_impl": a.attn_impl,
        "grad_clip": a.grad_clip,
        "torch": torch.__version__,
        "steps_counted": n,
        "kernels_per_step": sum(per_step) / n,
        "kernels_each_step": per_step,
        "by_operator": {k: v / n for k, v in kernels.most_common()},
        "not_counted_per_step": sum(other.values()) / n,
        "not_counted_by_operator": {k: v / n for k, v in other.most_common()},
    }


def markdown(r: dict, name: str) -> list[str]:
    w = r["workload"]
    what = "training step" if r["phase"] == "train" else "generated token (batch 1)"
    lines = [
        f"# Kernel-launching operators per {what}: `{name}`",
        "",
        f"Structure of the `{r['structure_of']}` workload: d_model {w['d_model']}, {w['n_layers']} layers, "
        f"{w['n_heads']} heads, d_ff {w['d_ff']}, c {w['rate']}; counted at batch {w['batch'] if r['phase'] == 'train' else 1}, "
        f"n_s {w['seg_len']}, n_m {w['mem_len']}, n_cm {w['cmem_len']} (the operators do not depend on the sizes). "
        f"Autocast: {r['amp']}; attn_impl {r['attn_impl']}; torch {r['torch']}. Rule and command: "
        "`benchmarks/op_count.py`.",
        "",
        f"**{r['kernels_per_step']:,.1f} kernel-launching operators per step** (each counted step: "
        f"{', '.join(str(x) for x in r['kernels_each_step'])}); views and allocations, not counted: "
        f"{r['not_counted_per_step']:,.1f}.",
        "",
        "| operator | per step |",
        "|---|---|",
    ]
    lines += [f"| `{k}` | {v:g} |" for k, v in r["by_operator"].items()]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phase", choices=["train", "decode"], default="train")
    ap.add_argument("--workload", default="gpu", choices=sorted(WORKLOADS), help="whose layer structure")
    cut = "(training: default 1 and lengths of at most 32; generation: the workload's)"
    ap.add_argument("--batch", type=int, help=f"training batch {cut}")
    ap.add_argument("--seg-len", type=int, help="n_s")
    ap.add_argument("--mem-len", type=int, help="n_m")
    ap.add_argument("--cmem-len", type=int, help="n_cm")
    ap.add_argument(
        "--amp", choices=["none", "bf16", "fp16"], help="autocast (default: training bf16, generation none as on a CPU)"
    )
    ap.add_argument(
        "--attn-impl",
        help="the attention kernel (default: training the GPU's choice in bf16, fused, through Triton's interpreter "
        "on the CPU; generation auto)",
    )
    ap.add_argument("--grad-clip", type=float, default=0.1, help="train.grad_clip (the paper's 0.1)")
    ap.add_argument("--repeats", type=int, default=2, help="steps counted (each must issue the same operators)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", required=True, help="results/op_count/NAME.json and .md")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "op_count")
    a = ap.parse_args(argv)
    if a.amp is None:
        a.amp = "bf16" if a.phase == "train" else "none"
    if a.attn_impl is None:  # the GPU's choice in bf16 for training; generation's own on the CPU
        a.attn_impl = "fused" if a.phase == "train" else "auto"
    if a.attn_impl == "fused" and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    result = measure(a)
    write_report(a.out, a.name, result, markdown(result, a.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
