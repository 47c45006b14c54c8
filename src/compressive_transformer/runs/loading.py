"""The public way to use a trained run from Python: ``load_run(run_dir)`` gives its config, tokenizer and model on
the device of this machine, with no corpus needed (the tokenizer is saved in the run)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from compressive_transformer.config import ConfigError, RunConfig


@dataclass
class Run:
    """A trained model ready to use: ``model`` is in eval mode on ``device``; ``encode``/``decode`` use the run's
    tokenizer. ``run_dir`` and ``checkpoint`` say where it came from (None for an exported directory)."""

    config: RunConfig
    tokenizer: Any
    model: torch.nn.Module
    run_dir: Path | None = None
    checkpoint: Path | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def step(self) -> int | None:
        """The training step of the checkpoint (None when unknown)."""
        m = re.fullmatch(r"step-(\d+)", self.checkpoint.name) if self.checkpoint is not None else None
        return int(m.group(1)) if m else None

    @property
    def seg_len(self) -> int:
        return self.config.eval.seg_len or self.config.model.seg_len

    @property
    def mem_len(self) -> int:
        """Memory length used at evaluation (``eval.mem_len``, else the training one)."""
        e = self.config.eval.mem_len
        return self.config.model.mem_len if e is None else e

    @property
    def cmem_len(self) -> int:
        e = self.config.eval.cmem_len
        return self.config.model.cmem_len if e is None else e

    def encode(self, text: str | bytes) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)


def load_run(
    path: str | Path,
    device: str | None = None,
    checkpoint: str | Path | None = None,
    *,
    threads: int | None = None,
    overrides: Sequence[str] = (),
    log: Any = None,
) -> Run:
    """Load a run directory written by ``train`` (or a directory written by ``export``).

    ``device``: ``auto`` (default: CUDA where available, else CPU), ``cpu`` or ``cuda``, whatever ``train.device``
    was; ``checkpoint``: a checkpoint directory (default: the newest that verifies); ``threads``: CPU threads (default: the run's
    ``train.num_threads``); ``overrides``: ``eval.*`` keys such as ``eval.mem_len=1024``.
    """
    from compressive_transformer.export import CONFIG_JSON, from_pretrained
    from compressive_transformer.run import load_model_from, log_stderr, open_run

    path = Path(path)
    if (path / CONFIG_JSON).is_file() and not (path / "config.toml").is_file():
        if checkpoint is not None:
            raise ConfigError(
                f"checkpoint: {path} is an exported model with one set of weights; drop the checkpoint argument"
            )
        return from_pretrained(path, device=device, threads=threads, overrides=overrides)
    bad = [o for o in overrides if not o.strip().startswith("eval.")]
    if bad:
        raise ConfigError(f"override {bad[0]!r}: only eval.* keys change how a trained run is used")
    cfg, tokenizer = open_run(path, overrides)
    model, ckpt = load_model_from(
        path, cfg, checkpoint, device=device, threads=threads, log=log if log is not None else log_stderr
    )
    return Run(config=cfg, tokenizer=tokenizer, model=model, run_dir=path, checkpoint=ckpt)


__all__ = ["Run", "load_run"]
