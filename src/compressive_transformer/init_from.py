"""Starting a run from another run's (or an export's) weights: ``train --init-from`` and ``train.freeze``.

Parameters present in both models are copied (their shapes must agree); the new model's other parameters (a
compressor, the compressed memory's positional stream) keep their usual initialisation and are listed. Frozen
parameter groups (``"model"``: everything but the compressor; ``"compressor"``) get no gradient and no optimizer
state, so ``train.freeze = ["model"]`` trains only the compression network of a Transformer-XL turned Compressive
Transformer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from compressive_transformer.config import ConfigError
from compressive_transformer.models.protocol import MemoryModel

FREEZABLE = ("model", "compressor")


@dataclass
class Transfer:
    """What :func:`copy_weights` did, by parameter name."""

    copied: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)  # only in the new model: initialised as usual
    unused: list[str] = field(default_factory=list)  # only in the source

    def summary(self, source: str | Path) -> str:
        def names(items: list[str]) -> str:
            return ", ".join(items[:6]) + (f" and {len(items) - 6} more" if len(items) > 6 else "") or "none"

        return (
            f"init-from {source}: copied {len(self.copied)} tensors; new (initialised as usual): {names(self.new)}; "
            f"in the source only: {names(self.unused)}"
        )


def copy_weights(target: torch.nn.Module, source: torch.nn.Module) -> Transfer:
    """Copy every tensor ``source`` and ``target`` both name; all shared names must have equal shapes."""
    src, tgt = source.state_dict(), target.state_dict()
    mismatched = [k for k in tgt if k in src and src[k].shape != tgt[k].shape]
    if mismatched:
        k = mismatched[0]
        more = f" (and {len(mismatched) - 1} more: {', '.join(mismatched[1:4])})" if len(mismatched) > 1 else ""
        raise ConfigError(
            f"--init-from: {k} is {tuple(src[k].shape)} in the source but {tuple(tgt[k].shape)} in this config{more}; "
            "make the shared model settings (d_model, n_heads, d_ff, vocabulary, adaptive, ...) equal"
        )
    shared = [k for k in tgt if k in src]
    with torch.no_grad():
        for k in shared:
            tgt[k].copy_(src[k].to(tgt[k].dtype))
    return Transfer(copied=shared, new=[k for k in tgt if k not in src], unused=[k for k in src if k not in tgt])


def freeze(model: MemoryModel, groups: tuple[str, ...]) -> None:
    """Turn off the gradients of the named parameter groups; at least one parameter must stay trainable."""
    for group in groups:
        for p in model.parameters_of(group):
            p.requires_grad_(False)
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(
            f"train.freeze: {list(groups)} freezes every parameter of this model; freeze fewer groups"
            + (" (it has no compressor: set cmem_len > 0 to train only one)" if "model" in groups else "")
        )


def load_source(path: str | Path) -> "object":
    """The run or export ``path`` on the CPU (its tokenizer and model)."""
    from compressive_transformer.loading import load_run

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"--init-from: {path} does not exist; give a run directory or an export directory")
    return load_run(path, device="cpu", log=lambda message: None)


__all__ = ["FREEZABLE", "Transfer", "copy_weights", "freeze", "load_source"]
