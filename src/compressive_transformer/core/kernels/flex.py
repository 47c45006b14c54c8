"""The ``flex`` kernel: PyTorch's FlexAttention computes the relative attention, its positional term read from two
precomputed score buffers by the distance i - j, its mask a ``BlockMask`` with the full blocks marked.

For query i and key j (C compressed keys, then M memory keys, then the T segment keys; the queries biased and scaled
by the caller, as for every kernel):

    score = qu_i . k_j + pc[i, j - i + T - 1]            (j < C: the compressed stream's scores qc @ rc^T)
                       + pm[i, (j - C) - i + T - 1]      (j >= C: memory + segment, qv @ r^T)

``pm`` (B, H, T, Lm) and ``pc`` (B, H, T, Lc) are two matmuls in the compute dtype; the ``score_mod`` gathers one
entry of each per score. Gradients reach every input through the captured buffers: FlexAttention's backward returns
the gradient of each buffer the ``score_mod`` reads (the score gradient scattered to the entry it read), and autograd
takes it through the two matmuls into qv, r, qc and rc. That keeps one fused backward for the content term and the
softmax, with nothing of ours to keep in step with it; the price is that both buffers are saved for the backward:
2 T (Lm + Lc) values per (b, h): at the ``gpu`` workload (B 16, H 8, T 512, Lm 1040, Lc 1024, bf16) 258 MiB per
layer, 2.0 GiB for its 8 layers, against 193 MiB per layer for the (B, H, T, K) bias ``sdpa-bias`` keeps and none for
``fused`` (``benchmarks/fused_attention.py`` measures what each kernel saves). The rule is the :class:`~compressive_transformer.core.attention.KeyMask`'s, evaluated once
per forward into a ``BlockMask`` (:func:`prepare`); a row without an allowed key gives zeros.

FlexAttention fuses only under ``torch.compile`` (on CUDA; the CPU backend compiles the forward only). Called
eagerly it runs PyTorch's unfused math; on the CPU its backward exists only there, so eager CPU calls are made with
the public function's refusal of a CPU backward lifted for the call (what the CPU tests run).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace
from unittest import mock

import torch
from torch import Tensor
from torch.nn.attention import flex_attention as flex

from compressive_transformer.core.attention import AttentionInputs, KeyMask

BLOCK = 128  # FlexAttention's default block on both axes


def _rule(valid: Tensor, C: int, M: int, win: int):
    """The mask_mod of a KeyMask: a compressed key where valid; a memory or segment key where valid, in the past and
    at most ``win`` back, or the query itself."""

    def mask_mod(b, h, i, j):
        dist = (M + i) - (j - C)
        ok = valid[b, j]
        return torch.where(j < C, ok, (ok & (dist >= 0) & (dist <= win)) | (dist == 0))

    return mask_mod


def block_mask(mask: KeyMask, T: int) -> flex.BlockMask:
    """The mask's rule over T queries and its K keys as a BlockMask (full blocks marked, so their tiles skip the
    mask_mod). With ``self_in_valid`` (a decoder's ring) valid alone is the rule."""
    valid = mask.valid
    B, K = valid.shape
    C = mask.n_cmem
    M = K - C - T
    win = mask.window if mask.window > 0 else M + T
    if mask.self_in_valid:
        mask_mod = lambda b, h, i, j: valid[b, j]  # noqa: E731
    else:
        mask_mod = _rule(valid, C, M, win)
    return flex.create_block_mask(mask_mod, B, None, T, K, device=valid.device, BLOCK_SIZE=BLOCK)


def prepare(mask: KeyMask, T: int, dtype: torch.dtype) -> KeyMask:
    """The KeyMask with its BlockMask, made once per forward and read by every layer."""
    return replace(mask, block=block_mask(mask, T))


def _score_mod(pm: Tensor, pc: Tensor | None, C: int, T: int):
    Lm = pm.shape[-1]
    Lc = pc.shape[-1] if pc is not None else 0

    def score_mod(score, b, h, i, j):
        mem = score + pm[b, h, i, (j - C - i + T - 1).clamp(0, Lm - 1)]
        if pc is None:
            return mem
        return torch.where(j < C, score + pc[b, h, i, (j - i + T - 1).clamp(0, Lc - 1)], mem)

    return score_mod


def _cpu_backward() -> contextlib.AbstractContextManager:
    """FlexAttention's eager math has a backward on the CPU; its public function refuses to record one there."""
    return mock.patch.object(flex, "_validate_device", lambda *tensors: None)


def flex_relative_attention(a: AttentionInputs) -> Tensor:
    """(B, H, T, dh): the attention of a's queries (B, H, T, dh) over its keys and values (B, H, K, dh) and tables
    r (H, Lm, dh), rc (H, Lc, dh), as :mod:`this module <.flex>` describes; its mask with a BlockMask
    (:func:`prepare`) or without (made here)."""
    qu, k, v, qv, r, qc, rc, mask = a.qu, a.k, a.v, a.qv, a.r, a.qc, a.rc, a.mask
    T = qu.shape[2]
    if os.environ.get("TORCHDYNAMO_DISABLE") == "1" and torch.is_grad_enabled() and qu.requires_grad:
        # without TorchDynamo FlexAttention's eager path drops the captured buffers' gradients without a word
        raise RuntimeError("attn_impl 'flex' trains only with TorchDynamo: unset TORCHDYNAMO_DISABLE")
    pm = qv @ r.transpose(-1, -2)  # (B, H, T, Lm)
    pc = qc @ rc.transpose(-1, -2) if mask.n_cmem > 0 else None  # (B, H, T, Lc)
    blocks = mask.block if mask.block is not None else block_mask(mask, T)
    score_mod = _score_mod(pm, pc, mask.n_cmem, T)
    eager_cpu = qu.device.type == "cpu" and not torch.compiler.is_compiling()
    with _cpu_backward() if eager_cpu else contextlib.nullcontext():
        return flex.flex_attention(qu, k, v, score_mod=score_mod, block_mask=blocks, scale=1.0)


def flex_attention(a: AttentionInputs) -> tuple[Tensor, None]:
    """The ``flex`` row's kernel."""
    return flex_relative_attention(a), None
