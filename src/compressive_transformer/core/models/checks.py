"""Checks at the models' API boundary: inputs, targets and memories that cannot be right fail in one line here,
instead of deep inside torch or (worse) giving a wrong loss silently.

Inside ``forward`` they read metadata only (shapes, dtypes, devices), so a forward never waits on the device and
compiles as one graph. Token ids are range-checked where their values are on the host: in ``forward`` for CPU
tensors in eager mode, and by :func:`check_token_ids` where data enters (batches, prompts) before it is moved to a
device; on a GPU an id out of range that slips past reaches the embedding's own device-side assert.
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor

from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.constants import IGNORE_INDEX
from compressive_transformer.core.memory import KEY_ALIGN, MemoryState


def _tracing() -> bool:
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()


def check_inputs(cfg: ModelConfig, inputs: Tensor, targets: Tensor | None, input_mask: Tensor | None) -> None:
    """inputs (B, T) integer token ids in [0, vocab) (or (B, T, input_dim) floats), B >= 1, T >= 1; targets and
    input_mask (B, T) like the inputs, targets in [0, vocab) or -100."""
    if not isinstance(inputs, Tensor):
        raise TypeError(f"inputs: expected a torch.Tensor of shape (B, T), got {type(inputs).__name__}")
    shape = tuple(inputs.shape)
    if cfg.input_dim > 0:
        if inputs.dim() != 3 or shape[-1] != cfg.input_dim or not inputs.is_floating_point():
            raise ValueError(
                f"inputs: expected floats of shape (B, T, {cfg.input_dim}), got {inputs.dtype} of shape {shape}"
            )
    else:
        if inputs.dim() != 2:
            raise ValueError(
                f"inputs: expected token ids of shape (B, T), got shape {shape}; add a batch dimension with inputs[None]"
                if inputs.dim() == 1
                else f"inputs: expected token ids of shape (B, T), got shape {shape}"
            )
        if inputs.is_floating_point() or inputs.is_complex() or inputs.dtype == torch.bool:
            raise ValueError(f"inputs: token ids must be an integer tensor (torch.long), got {inputs.dtype}")
    B, T = shape[:2]
    if B < 1 or T < 1:
        raise ValueError(f"inputs: need at least one row and one position, got shape {shape} (B = {B}, T = {T})")
    if targets is not None:
        if not isinstance(targets, Tensor) or tuple(targets.shape) != (B, T):
            got = tuple(targets.shape) if isinstance(targets, Tensor) else type(targets).__name__
            hint = " (transposed? targets are (B, T) like the inputs)" if got == (T, B) else ""
            raise ValueError(f"targets: expected shape (B, T) = {(B, T)}, got {got}{hint}")
        if targets.is_floating_point() or targets.dtype == torch.bool:
            raise ValueError(f"targets: must be integer token ids (torch.long), got {targets.dtype}")
    if input_mask is not None and (not isinstance(input_mask, Tensor) or tuple(input_mask.shape) != (B, T)):
        got = tuple(input_mask.shape) if isinstance(input_mask, Tensor) else type(input_mask).__name__
        raise ValueError(f"input_mask: expected shape (B, T) = {(B, T)}, got {got}")
    if _tracing() or inputs.device.type != "cpu":
        return
    check_token_ids(cfg, inputs if cfg.input_dim == 0 else None, targets)


def check_token_ids(cfg: ModelConfig, inputs: Tensor | None, targets: Tensor | None, *, name: str = "inputs") -> None:
    """Input ids in [0, vocab) and targets in [0, vocab) or -100, for tensors whose values are on the host (one
    reduction each; call it before moving a batch or a prompt to a device)."""
    V = cfg.vocab_size
    if inputs is not None and inputs.numel() and bool(((inputs < 0) | (inputs >= V)).any()):
        raise ValueError(f"{name}: token ids must be in [0, {V}), got min {int(inputs.min())}, max {int(inputs.max())}")
    if targets is not None and V > 0 and bool((((targets < 0) & (targets != IGNORE_INDEX)) | (targets >= V)).any()):
        raise ValueError(
            f"targets: token ids must be in [0, {V}) or {IGNORE_INDEX} (ignored), got min {int(targets.min())}, max {int(targets.max())}"
        )


def check_step_tokens(cfg: ModelConfig, tokens: object, *, batch_size: int, device: torch.device) -> None:
    """A decoder step's input: one integer token id per memory row, shape (B,) or (B, 1), on the model's device,
    ids in [0, vocab) (checked where the values are on the host)."""
    if not isinstance(tokens, Tensor):
        raise TypeError(f"tokens: expected a torch.Tensor of {batch_size} token ids, got {type(tokens).__name__}")
    shape = tuple(tokens.shape)
    if tokens.numel() != batch_size or tokens.dim() not in (1, 2) or (tokens.dim() == 2 and shape[1] != 1):
        raise ValueError(
            f"tokens: expected one token id per memory row, shape ({batch_size},), got shape {shape}; a decoder "
            f"steps the {batch_size} rows of the memory it was made from (model.init_memory(B) for another B)"
        )
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise ValueError(f"tokens: token ids must be an integer tensor (torch.long), got {tokens.dtype}")
    if tokens.device.type != device.type:
        raise ValueError(f"tokens: are on {tokens.device}, the model on {device}; move them with tokens.to(device)")
    if not _tracing() and tokens.device.type == "cpu":
        check_token_ids(cfg, tokens, None, name="tokens")


def check_batch_size(batch_size: object) -> None:
    """``init_memory``'s row count: a whole number >= 0 (torch would fail deep inside on a negative one)."""
    try:
        rows = operator.index(batch_size)  # int, numpy and 0-dim integer tensors; not floats
    except TypeError:
        rows = -1
    if isinstance(batch_size, bool) or rows < 0:
        raise ValueError(f"batch_size: the memory's number of rows must be a whole number >= 0, got {batch_size!r}")


def _autocast(device: torch.device) -> bool:
    try:
        return torch.is_autocast_enabled(device.type)
    except TypeError:  # torch < 2.4 takes no device type
        return torch.is_autocast_enabled()


def expected_capacity(mem_len: int, cmem_len: int, compression_rate: int) -> int:
    """Memory slots a layer has for ``mem_len`` (see :func:`compressive_transformer.core.memory.empty_layer`)."""
    pending = compression_rate - 1 if cmem_len > 0 else 0
    if pending:
        pending += -(cmem_len + mem_len + pending) % KEY_ALIGN
    return mem_len + pending


def check_memory(
    cfg: ModelConfig,
    memory: MemoryState,
    *,
    batch_size: int,
    n_layers: int,
    dtype: torch.dtype,
    device: torch.device,
    compressive: bool,
) -> None:
    """A memory made by this model's ``init_memory`` (or returned by its forward) for ``batch_size`` rows: layer
    count, width, dtype (outside autocast), device, and for the Compressive Transformer the compression rate and
    whether it has a compressed memory at all."""
    if not isinstance(memory, MemoryState):
        raise TypeError(f"memory: expected a MemoryState from model.init_memory, got {type(memory).__name__}")
    if len(memory.layers) != n_layers:
        raise ValueError(f"memory has {len(memory.layers)} layers, the model {n_layers}; use model.init_memory")
    if memory.batch_size != batch_size:
        raise ValueError(
            f"memory holds {memory.batch_size} rows but the input has {batch_size}; use model.init_memory({batch_size})"
        )
    autocast = _autocast(device)
    for i, layer in enumerate(memory.layers):
        for name in ("mem", "cmem"):
            t = getattr(layer, name)
            if t.shape[-1] != cfg.d_model:
                raise ValueError(
                    f"memory: layer {i} {name} has width {t.shape[-1]}, the model d_model = {cfg.d_model}; it comes from another model, use model.init_memory"
                )
            if t.device.type != device.type:
                raise ValueError(
                    f"memory: layer {i} is on {t.device}, the model on {device}; move it with memory.to(device)"
                )
            if not autocast and t.dtype != dtype:
                raise ValueError(
                    f"memory: layer {i} {name} is {t.dtype}, the model {dtype}; convert it with memory.to(dtype=...) or use model.init_memory"
                )
        if compressive:
            if layer.cmem_len > 0 and not cfg.uses_compression:
                raise ValueError(
                    "memory: has a compressed memory but this model has none (cmem_len = 0); use model.init_memory"
                )
            if layer.rate and layer.cmem_len > 0 and layer.rate != cfg.compression.rate:
                raise ValueError(
                    f"memory: layer {i} was compressed at rate {layer.rate}, this model's compression_rate is {cfg.compression.rate}; use model.init_memory"
                )
            want = expected_capacity(layer.mem_len, layer.cmem_len, cfg.compression.rate)
            if layer.capacity != want:
                raise ValueError(
                    f"memory: layer {i} has {layer.capacity} slots for mem_len {layer.mem_len}, this model (compression_rate "
                    f"{cfg.compression.rate}) uses {want}; it comes from another model, use model.init_memory"
                )
