"""Which kernel computes the relative attention (``model.attn_impl``), and the measured table ``auto`` reads.

Every backend computes the same scores, ``(q + u)·k + shift((q + v)·W_r R) + mask``, scaled, then softmax and the
value product; they differ only in which buffers they write:

- ``explicit``: the scores in one (B, H, T, K) buffer (:func:`~.attention.attention_scores`), an explicit softmax and
  a batched matmul. The reference, and the only path that returns the attention weights (analyses, the most-used
  compressor).
- ``sdpa-bias``: the positional scores plus the mask as the float ``attn_mask`` of
  ``F.scaled_dot_product_attention``, which does q·k, the softmax and the value product. Without gradients PyTorch
  runs its fused flash kernel on CPU; with gradients into the mask (the positional term always has them in training)
  it runs the unfused math kernel on CPU (measured with torch.profiler, torch 2.13).
- ``flex``: ``torch.nn.attention.flex_attention`` with a ``score_mod`` that adds the positional scores looked up by
  relative distance from a (H, B, T, W) table (one column per distance, not per key) and a block mask of the
  memory + causal mask. It trains on CUDA only: PyTorch has no CPU backward for it.

A backend that cannot do what a step asks falls back, with one warning naming why: weights wanted -> ``explicit``;
``flex`` with gradients on CPU or with attention dropout in training -> ``sdpa-bias``.
"""

from __future__ import annotations

import functools
import warnings
import weakref

import torch
from torch import Tensor

BACKENDS = ("explicit", "sdpa-bias", "flex")
ALIASES = {"math": "explicit", "sdpa": "sdpa-bias"}  # the names configs and checkpoints used before

# What ``auto`` takes, per (device type, phase, compute dtype), and why: tokens/s ratios from one interleaved run of
# benchmarks/bench.py --backends (benchmarks/results/backends/reference.md, the reference workload on a shared 2-core
# AVX-512 BF16 CPU, 1 thread; ratios only, the machine's load moved absolute numbers ~9x).
_TRAIN = "sdpa-bias {:.2f}x explicit: a mask that needs a gradient sends SDPA to its unfused math kernel"
_EVAL = "sdpa-bias {:.2f}x, flex {:.2f}x explicit: the fused kernels still read a (B, H, T, K) bias"
AUTO: dict[tuple[str, str, str], tuple[str, str]] = {
    ("cpu", "train", "fp32"): ("explicit", _TRAIN.format(0.94)),
    ("cpu", "train", "bf16"): ("explicit", _TRAIN.format(0.80)),
    ("cpu", "eval", "fp32"): ("explicit", _EVAL.format(0.95, 0.77)),
    ("cpu", "eval", "bf16"): ("explicit", _EVAL.format(0.93, 0.60)),
}
# Devices without a row (CUDA: no GPU measurement yet) take the fused kernel with the positional bias.
AUTO_DEFAULT = ("sdpa-bias", "not measured on this device: the fused kernel, the positional scores as its bias")


def canonical(impl: str) -> str:
    """The backend name of a configured ``attn_impl`` (``auto`` stays ``auto``)."""
    return ALIASES.get(impl, impl)


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def auto_choice(device: torch.device, training: bool, dtype: torch.dtype) -> tuple[str, str]:
    """``auto``'s backend and the reason for it, for one device, phase (gradients or not) and compute dtype."""
    return AUTO.get((device.type, "train" if training else "eval", _dtype_name(dtype)), AUTO_DEFAULT)


@functools.cache
def _say_once(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def choose_backend(
    impl: str, *, device: torch.device, grad: bool, dtype: torch.dtype, need_weights: bool, dropout: float
) -> str:
    """The backend that runs one forward. ``grad``: gradients are recorded (training); ``dtype``: the compute dtype
    (autocast's); ``need_weights``: the caller or the compressor reads the attention weights; ``dropout``: the
    attention dropout in effect (0 in evaluation)."""
    if need_weights:
        return "explicit"
    backend = canonical(impl)
    if backend == "auto":
        backend = auto_choice(device, grad, dtype)[0]
    if backend == "flex" and grad and device.type == "cpu":
        _say_once("attn_impl 'flex' cannot train on CPU (PyTorch has no CPU backward for it): using 'sdpa-bias'")
        return "sdpa-bias"
    if backend == "flex" and dropout > 0:
        _say_once("attn_impl 'flex' has no attention dropout: using 'sdpa-bias' while attn_dropout > 0 in training")
        return "sdpa-bias"
    return backend


def positional_table(q: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    """(q + v)·W_r R for every query and distance: q (B, T, H, dh) biased, scaled queries, r (H, dh, W) ->
    the head-major queries (H, B * T, dh) and the table (H, B, T, W), column m holding distance W - 1 - m + const."""
    B, T, H, dh = q.shape
    qh = q.permute(2, 0, 1, 3).reshape(H, B * T, dh)
    return qh, torch.bmm(qh, r).view(H, B, T, -1)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_kernel():
    """flex_attention compiled (eager it is an unfused reference); inside a compiled model, the plain function."""
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention if torch.compiler.is_compiling() else _compiled_flex()


_last_block_mask: list = [None, None]  # a weak reference to the last additive mask, and its block mask


def _block_mask(mask: Tensor):
    """The block mask of an additive (B, 1, T, K) mask (0 where a key may be read). Every layer of one forward gets
    the same mask tensor, so the block mask is built once per forward."""
    from torch.nn.attention.flex_attention import create_block_mask

    ref, cached = _last_block_mask
    if ref is not None and ref() is mask and cached is not None:
        return cached
    B, _, T, K = mask.shape
    allowed = mask[:, 0] == 0  # (B, T, K)

    def mask_mod(b, h, q_idx, kv_idx):
        return allowed[b, q_idx, kv_idx]

    block = create_block_mask(mask_mod, B, None, T, K, device=mask.device)
    _last_block_mask[:] = [weakref.ref(mask), block]
    return block


def flex_relative_attention(
    qu: Tensor, k: Tensor, v: Tensor, qv: Tensor, r: Tensor, qc: Tensor | None, rc: Tensor | None, mask: Tensor, C: int
) -> Tensor:
    """Relative attention with FlexAttention: (B, H, T, dh) outputs. qu: (B, H, T, dh) scaled queries + u; k, v:
    (B, H, K, dh); qv / qc: (B, T, H, dh) scaled queries + v / + the compressed stream's v; r / rc: (H, dh, W)
    projected tables (see :func:`~.attention.make_positions`); mask: (B, 1, T, K) additive; C: compressed slots."""
    T = qu.shape[2]
    raw = positional_table(qv, r)[1]  # (H, B, T, W)
    W = raw.shape[-1]
    rawc = positional_table(qc, rc)[1] if rc is not None and C > 0 else None
    Wc = rawc.shape[-1] if rawc is not None else 0

    def score_mod(score, b, h, q_idx, kv_idx):
        # key kv_idx of the [mem; x] stream at distance d is column kv_idx - C + T - 1 - q_idx of its table; columns
        # out of range belong to keys the block mask hides (future keys, the other stream's keys), so are clamped
        pos = raw[h, b, q_idx, (kv_idx - C + T - 1 - q_idx).clamp(0, W - 1)]
        if rawc is not None:
            posc = rawc[h, b, q_idx, (kv_idx + T - 1 - q_idx).clamp(0, Wc - 1)]
            pos = torch.where(kv_idx < C, posc, pos)
        return score + pos

    dt = qu.dtype
    return flex_kernel()(qu, k.to(dt), v.to(dt), score_mod=score_mod, block_mask=_block_mask(mask), scale=1.0)
