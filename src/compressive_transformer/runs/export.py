"""A trained run as a Hugging Face-style directory: ``config.json`` (the model's hyperparameters at the top level,
the whole run config under ``run_config``), ``model.safetensors`` and the tokenizer's ``tokenizer.json``; and
:func:`~compressive_transformer.runs.loading.from_pretrained` (re-exported here) to load such a directory back with one
call."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import safetensors.torch

from compressive_transformer.core.config import ConfigError, to_dict
from compressive_transformer.core.version import __version__
from compressive_transformer.runs.loading import CONFIG_JSON, MODEL_TYPE, WEIGHTS, Run, from_pretrained, load_run


def export_run(run_dir: str | Path, out_dir: str | Path, *, checkpoint: str | Path | None = None) -> Path:
    """Write the run's newest (or ``checkpoint``'s) model into the new directory ``out_dir``; never into one that
    already holds something."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"export: {out} already holds files; choose a new output directory")
    return write_export(load_run(run_dir, device="cpu", checkpoint=checkpoint), out)


def write_export(run: Run, out_dir: str | Path) -> Path:
    """Write ``run`` (its config, weights and tokenizer) as the new directory ``out_dir``, atomically."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"export: {out} already holds files; choose a new output directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".", suffix=".tmp"))
    try:
        config = {
            "model_type": MODEL_TYPE,
            "architectures": [type(run.model).__name__],
            **to_dict(run.config.model),
            "tokenizer_kind": run.tokenizer.kind,
            "checkpoint_step": run.step,
            "library_version": __version__,
            "run_config": to_dict(run.config),
        }
        (tmp / CONFIG_JSON).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        safetensors.torch.save_model(run.model, str(tmp / WEIGHTS))
        run.tokenizer.save(tmp)
        if out.exists():
            out.rmdir()  # empty, checked above
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


__all__ = ["export_run", "write_export", "from_pretrained", "CONFIG_JSON", "WEIGHTS"]
