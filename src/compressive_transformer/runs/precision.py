"""Which precision the matmuls run in: ``amp`` names ("auto", "none", "bf16", "fp16") resolved for a device, and the
autocast context every training, evaluation and generation call site enters.

bf16 autocast pays where the hardware has bf16 arithmetic (every recent GPU; CPUs with AVX-512 BF16 or AMX, where a
bf16 matmul runs 2-16x the fp32 rate) and costs time where it is emulated (a CPU without those instructions converts
every operand), so "auto" picks bf16 only where it is fast. The model's weights, its memory buffers, the losses and
the optimizer stay fp32 under autocast; only the products are rounded.
"""

from __future__ import annotations

import torch

from compressive_transformer.core.config import AMP_CHOICES, ConfigError, RunConfig
from compressive_transformer.core.dtypes import AMP_DTYPES, amp_dtype, autocast, compute_dtype, full_precision
from compressive_transformer.runs.machine import cpu_model_and_flags

CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # instructions that make bf16 matmuls faster than fp32 on a CPU
assert set(AMP_DTYPES) | {"auto"} == set(AMP_CHOICES)


PRECISION_NAMES = {"none": "fp32", "bf16": "bf16", "fp16": "fp16"}  # resolved amp -> what logs call it


def bf16_flags(flags: list[str]) -> list[str]:
    """The bf16 instruction sets among a CPU's ``flags`` (as /proc/cpuinfo or a recorded machine lists them)."""
    return [f for f in flags if f in CPU_BF16_FLAGS]


def cpu_bf16_flags() -> list[str]:
    """The bf16 instruction sets this machine's CPU reports (empty where it has none, or outside Linux)."""
    return bf16_flags(cpu_model_and_flags()[1])


def runs_bf16_fast(device: torch.device | str) -> bool:
    """Whether bf16 matmuls on ``device`` are native (faster than fp32) rather than emulated."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return bool(cpu_bf16_flags())
    return False


def resolve_amp(amp: str, device: torch.device | str, *, key: str = "train.amp") -> str:
    """``amp`` with "auto" replaced by "bf16" where ``device`` runs bf16 fast, else "none"; a name that is not one of
    :data:`AMP_CHOICES` is a one-line :class:`ConfigError` naming ``key``."""
    if amp not in AMP_CHOICES:
        raise ConfigError(f"{key}: unknown {amp!r}; use one of {', '.join(AMP_CHOICES)}")
    if amp == "auto":
        return "bf16" if runs_bf16_fast(device) else "none"
    return amp


def inference_amp(cfg: RunConfig, device: torch.device | str) -> str:
    """The resolved precision of evaluation and generation for a run: ``eval.amp``, or ``train.amp`` where unset."""
    return resolve_amp(cfg.eval.amp or cfg.train.amp, device, key="eval.amp" if cfg.eval.amp else "train.amp")


def generation_amp(cfg: RunConfig, device: torch.device | str) -> str:
    """The resolved precision of token-by-token generation: :func:`inference_amp`, except that "auto" means fp32 on a
    CPU. At batch 1 every product is a matrix-vector product whose time is reading the weights and per-operation
    overhead, and bf16 autocast adds a cast per operation: on a CPU with AVX-512 BF16 the decoder made 268 tokens/s
    under bf16 against 360 in fp32 (benchmarks/README.md). An explicit "bf16" is honoured."""
    configured = cfg.eval.amp or cfg.train.amp
    if configured == "auto" and torch.device(device).type == "cpu":
        return "none"
    return inference_amp(cfg, device)


def describe(amp: str, device: torch.device | str) -> str:
    """One line for the log: the precision a run uses and, for "auto", why."""
    resolved = resolve_amp(amp, device)
    name = PRECISION_NAMES[resolved] + ("" if resolved == "none" else " autocast")
    if amp != "auto":
        return f"precision {name} (amp = {amp!r})"
    why = "runs bf16 natively" if resolved == "bf16" else "has no fast bf16 (fp32 is faster there)"
    return f"precision {name} (amp = 'auto': {torch.device(device).type} {why})"


__all__ = [
    "AMP_DTYPES",
    "CPU_BF16_FLAGS",
    "PRECISION_NAMES",
    "amp_dtype",
    "autocast",
    "bf16_flags",
    "compute_dtype",
    "cpu_bf16_flags",
    "describe",
    "full_precision",
    "generation_amp",
    "inference_amp",
    "resolve_amp",
    "runs_bf16_fast",
]
