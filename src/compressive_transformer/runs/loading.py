"""The public way to use a trained run from Python: ``load_run(run_dir)`` gives its config, tokenizer and model on
the device of this machine, with no corpus needed (the tokenizer is saved in the run); ``from_pretrained`` does the
same for a directory written by ``export``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import safetensors
import safetensors.torch
import torch

from compressive_transformer.core.config import ConfigError, RunConfig, apply_run_overrides
from compressive_transformer.core.modality import run_modality
from compressive_transformer.core.models import build_model
from compressive_transformer.data import load_tokenizer
from compressive_transformer.runs.budget import check_model_size
from compressive_transformer.runs.checkpoint import weights_finite
from compressive_transformer.runs.machine import resolve_device, set_threads
from compressive_transformer.runs.rundir import load_model_from, log_stderr, open_run, read_run_config

CONFIG_JSON = "config.json"
WEIGHTS = "model.safetensors"
MODEL_TYPE = "compressive-transformer"


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
    def modality(self) -> str:
        """``text``, ``audio`` or ``continuous`` (:mod:`compressive_transformer.core.modality`)."""
        return run_modality(self.config)

    @property
    def seg_len(self) -> int:
        return self.config.eval.lengths(self.config.model).seg_len

    @property
    def mem_len(self) -> int:
        """Memory length used at evaluation (``eval.mem_len``, else the training one)."""
        return self.config.eval.lengths(self.config.model).mem_len

    @property
    def cmem_len(self) -> int:
        return self.config.eval.lengths(self.config.model).cmem_len

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


def from_pretrained(
    directory: str | Path, *, device: str | None = None, threads: int | None = None, overrides: Sequence[str] = ()
) -> Run:
    """Load a directory written by :func:`~compressive_transformer.runs.export.export_run` as a :class:`Run`
    (``device`` as in ``load_run``; ``overrides``: ``eval.*`` keys)."""
    directory = Path(directory)
    path = directory / CONFIG_JSON
    if not path.is_file():
        raise ConfigError(f"from_pretrained: {directory} has no {CONFIG_JSON}; give a directory written by `export`")
    bad = [o for o in overrides if not o.strip().startswith("eval.")]
    if bad:
        raise ConfigError(f"override {bad[0]!r}: only eval.* keys change how an exported model is used")
    cfg = export_config(directory, overrides)
    set_threads(threads if threads is not None else cfg.train.num_threads)
    target = resolve_device(device or "auto", key="--device")
    check_model_size(cfg.model, device=target, key=f"from_pretrained: {path}: model")
    model = build_model(cfg.model).to(target)
    try:
        safetensors.torch.load_model(
            model, str(directory / WEIGHTS), strict=True, device=str(next(model.parameters()).device)
        )
    except (OSError, RuntimeError, ValueError, safetensors.SafetensorError) as e:
        raise ConfigError(
            f"from_pretrained: {directory / WEIGHTS} does not fit {CONFIG_JSON} ({str(e).splitlines()[0][:200]})"
        ) from None
    if not weights_finite(model):
        raise ConfigError(
            f"from_pretrained: {directory / WEIGHTS} holds non-finite weights (NaN or infinity); it cannot be used: "
            "export the run again from a good checkpoint"
        )
    model.eval()
    return Run(config=cfg, tokenizer=load_tokenizer(directory), model=model, run_dir=None, checkpoint=None)


def export_config(directory: Path, overrides: Sequence[str] = ()) -> RunConfig:
    """The run config an export directory records (in its ``config.json``), without loading its weights."""
    path = directory / CONFIG_JSON
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"from_pretrained: {path} does not parse ({type(e).__name__}); export the run again"
        ) from None
    if not isinstance(config, dict) or config.get("model_type") != MODEL_TYPE or "run_config" not in config:
        raise ConfigError(f"from_pretrained: {path} is not a {MODEL_TYPE} export")
    return RunConfig.from_raw(apply_run_overrides(config["run_config"], list(overrides)))


def read_config(path: str | Path) -> RunConfig:
    """The config of a run directory or an export directory, read without its weights (to check an input's
    modality, say, before loading a model)."""
    path = Path(path)
    if (path / CONFIG_JSON).is_file() and not (path / "config.toml").is_file():
        return export_config(path)
    return read_run_config(path)


def read_modality(path: str | Path) -> str:
    """The modality of a run or export directory (:func:`read_config`)."""
    return run_modality(read_config(path))


__all__ = [
    "CONFIG_JSON",
    "MODEL_TYPE",
    "Run",
    "WEIGHTS",
    "export_config",
    "from_pretrained",
    "load_run",
    "read_config",
    "read_modality",
]
