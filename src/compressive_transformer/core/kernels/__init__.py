"""The kernels that compute :func:`~compressive_transformer.core.attention.relative_attention` (``model.attn_impl``),
and the choice among them.

Every kernel is a function of one :class:`~compressive_transformer.core.attention.AttentionInputs` to the output
(B, H, T, dh) and, where it has them, the attention weights; they differ only in what they write to memory:

- ``reference``: the readable math (:func:`~compressive_transformer.core.attention.relative_attention`).
- ``explicit``: the same scores in one buffer through a hand-written backward, for the CPU in eager mode.
- ``sdpa-bias``: ``F.scaled_dot_product_attention`` with the positional scores and the mask as its float bias.
- ``fused``: Triton kernels forward and backward that compute the positional scores inside their tiles, never
  writing a (B, H, T, K) buffer; compiled on CUDA, through Triton's interpreter for CPU tensors (exact and slow: for
  tests; ``auto`` never picks it there).
- ``flex``: FlexAttention with the positional scores precomputed as two (B, H, T, L) buffers read by distance in its
  ``score_mod`` and the mask as a ``BlockMask`` (:mod:`.flex`); fused only under ``torch.compile``. ``auto`` does not
  pick it: whether it beats ``fused`` on a GPU is for ``benchmarks/fused_attention.py`` to measure.

``auto`` picks ``fused`` on CUDA in bf16 / fp16, compiled or not (a ``torch.library`` custom op, which
``torch.compile`` traces without a graph break while it compiles everything around it), else ``sdpa-bias`` on CUDA,
``reference`` under ``torch.compile`` and ``explicit`` on the CPU. A kernel that cannot do what a step asks is
replaced, with one warning naming why: weights wanted -> ``explicit`` (or ``reference`` under ``torch.compile``);
attention dropout -> ``sdpa-bias``; ``fused`` without Triton, in fp64 or on another device -> ``sdpa-bias``;
``explicit`` under ``torch.compile`` -> ``reference``, and so does ``flex`` compiled on the CPU with gradients.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings

import torch
from torch import Tensor

from compressive_transformer.core.attention import Kernel, KeyMask, key_mask
from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.dtypes import compute_dtype
from compressive_transformer.core.memory import LayerMemory
from compressive_transformer.core.registry import KERNEL_ALIASES, KERNELS, KernelSpec, Ref, canonical_kernel

ALIASES = KERNEL_ALIASES  # the earlier names of kernels (the table's, under the name this module gave it)
canonical = canonical_kernel


def fused_attention(a):
    """The ``fused`` row's kernel: imported on first use (Triton's import costs seconds, and only CUDA or the
    interpreter reach here)."""
    from compressive_transformer.core.kernels.fused_triton import fused_relative_attention

    m = a.mask
    return fused_relative_attention(
        a.qu, a.k, a.v, a.qv, a.r, a.qc, a.rc, m.valid, n_cmem=m.n_cmem, window=m.window
    ), None


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def fused_runs_on(device: torch.device, dtype: torch.dtype = torch.float32) -> bool:
    """Where the fused kernel can run: with Triton, on CUDA or (through Triton's interpreter, which the kernel module
    chooses for CPU tensors itself) on the CPU; not in fp64."""
    return triton_available() and dtype in FUSED_DTYPES and device.type in ("cuda", "cpu")


def auto_choice(device: torch.device, *, compiling: bool, dtype: torch.dtype = torch.float32) -> tuple[str, str]:
    """``auto``'s kernel and the reason for it (``dtype``: the compute dtype)."""
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and fused_runs_on(device, dtype):
        # a torch.library custom op: torch.compile traces it whole and compiles everything around it
        return "fused", "no (B, H, T, K) buffer in memory, forward or backward (benchmarks/results/gpu)"
    if compiling:
        return "reference", "torch.compile fuses the reference's plain tensor code"
    if device.type == "cuda":
        return "sdpa-bias", "fp32 (the fused kernel's exact fp32 products run off the tensor cores) or no Triton"
    return "explicit", "on the CPU the scores in one buffer beat a bias read by SDPA (benchmarks/results/backends)"


@functools.cache
def _say_once(message: str) -> None:
    warnings.warn(message, stacklevel=4)


def _warn(message: str) -> None:
    """Once per message, and not while torch.compile traces (a warning there would break the graph)."""
    if not torch.compiler.is_compiling():
        _say_once(message)


def choose_kernel(
    impl: str,
    *,
    device: torch.device,
    need_weights: bool,
    dropout: float,
    dtype: torch.dtype = torch.float32,
) -> str:
    """The kernel that runs one forward. ``need_weights``: the caller or the compressor reads the attention weights;
    ``dropout``: the attention dropout in force (0 in evaluation); ``dtype``: the compute dtype."""
    compiling = torch.compiler.is_compiling()
    name = canonical_kernel(impl)
    if name == "auto":
        name = auto_choice(device, compiling=compiling, dtype=dtype)[0]
    spec = KERNELS[name]
    if need_weights and not spec.weights:
        name = "reference" if compiling else "explicit"
    elif dropout > 0 and not spec.dropout:
        _warn(f"attn_impl {name!r} has no attention dropout: using 'sdpa-bias' while attn_dropout > 0 in training")
        name = "sdpa-bias"
    elif name == "fused" and not fused_runs_on(device, dtype):
        _warn("attn_impl 'fused' needs Triton, a CUDA device or the CPU, and fp32/bf16/fp16: using 'sdpa-bias'")
        name = "sdpa-bias"
    elif name == "fused" and device.type == "cpu":
        _warn("attn_impl 'fused' on the CPU runs through Triton's interpreter: exact but slow, meant for tests")
    if name == "explicit" and compiling:
        name = "reference"  # its strided views do not trace; compile fuses the reference
    if name == "flex" and compiling and device.type == "cpu" and torch.is_grad_enabled():
        name = "reference"  # the CPU backend compiles FlexAttention's forward only
    return name


def plan(
    cfg: ModelConfig, x_mask: Tensor, first: LayerMemory, *, window: int, h: Tensor, need_weights: bool, training: bool
) -> tuple[Kernel, KeyMask]:
    """The kernel of one forward and the mask it reads, over the keys [cmem; mem; x] of memories shaped as ``first``
    (every layer pushes the same positions and resets the same rows, so the first layer's masks serve all layers).
    h: the first block's input (device, dtype); x_mask: (B, T) the segment's valid positions."""
    name = choose_kernel(
        cfg.attn_impl,
        device=h.device,
        need_weights=need_weights or cfg.needs_attention_weights,
        dropout=cfg.attn_dropout if training else 0.0,
        dtype=compute_dtype(h.device, h.dtype),
    )
    spec = KERNELS[name]
    mask = key_mask(x_mask, first.mem_mask, first.cmem_mask, window=window)
    run = spec.run.resolve() if isinstance(spec.run, Ref) else spec.run
    return run, spec.prepare(mask, x_mask.shape[1], compute_dtype(h.device, h.dtype))


__all__ = [
    "ALIASES",
    "KERNELS",
    "KernelSpec",
    "auto_choice",
    "canonical",
    "choose_kernel",
    "fused_attention",
    "fused_runs_on",
    "plan",
]
