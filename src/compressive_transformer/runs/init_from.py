"""Starting a run from another run's (or an export's) weights: ``train --init-from`` and ``train.freeze``.

Parameters present in both models are copied (their shapes must agree); the new model's other parameters (a
compressor, the compressed memory's positional stream) keep their usual initialisation and are listed. Frozen
parameter groups get no gradient and no optimizer state: ``"copied"`` (what came from the source: a Transformer-XL
turned Compressive Transformer then trains its compressor and the compressed memory's positional stream only),
``"model"`` (everything but the compression network) and ``"compressor"``. The copied names are recorded in the run
(``init_from.json``), so a resumed run freezes the same ones without the source.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.core.models.protocol import MemoryModel
from compressive_transformer.runs.loading import load_run

FREEZABLE = ("copied", "model", "compressor")
RECORD = "init_from.json"


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


def freeze(model: MemoryModel, groups: tuple[str, ...], copied: list[str] = ()) -> None:
    """Turn off the gradients of the named groups (:data:`FREEZABLE`); at least one parameter must stay trainable."""
    if "copied" in groups and not copied:
        raise ConfigError('train.freeze: "copied" needs a run started with --init-from; remove it or add --init-from')
    named = dict(model.named_parameters(remove_duplicate=False))
    for group in groups:
        params = [named[n] for n in copied if n in named] if group == "copied" else model.parameters_of(group)
        for p in params:
            p.requires_grad_(False)
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(
            f"train.freeze: {list(groups)} freezes every parameter of this model; freeze fewer groups"
            + (" (nothing is new or a compressor: set cmem_len > 0 to add one)" if groups else "")
        )


def copied_names(
    run_dir: Path,
    t: "object",
    model: torch.nn.Module,
    source: torch.nn.Module | None,
    log: Callable[[str], None] | None,
) -> list[str]:
    """Copy ``source``'s weights into ``model`` (a new run) and record the copied names in the run, or read them
    back (a resumed run); [] for a run not started with ``--init-from``."""
    record = Path(run_dir) / RECORD
    if source is not None:
        transfer = copy_weights(model, source)
        if log is not None:
            log(transfer.summary(t.init_from))
            payload = {"source": t.init_from, "copied": transfer.copied, "new": transfer.new, "unused": transfer.unused}
            write_text_atomic(record, json.dumps(payload, indent=1) + "\n")
        return transfer.copied
    if t.init_from and record.is_file():
        try:
            copied = json.loads(record.read_text(encoding="utf-8"))["copied"]
            if not isinstance(copied, list) or not all(isinstance(n, str) for n in copied):
                raise ValueError("copied is not a list of names")
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigError(
                f"{record}: does not parse ({type(e).__name__}); it records what --init-from copied"
            ) from None
        return copied
    return []


def load_source(path: str | Path) -> "object":
    """The run or export ``path`` on the CPU (its tokenizer and model)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"--init-from: {path} does not exist; give a run directory or an export directory")
    return load_run(path, device="cpu", log=lambda message: None)


__all__ = ["FREEZABLE", "RECORD", "Transfer", "copied_names", "copy_weights", "freeze", "load_source"]
