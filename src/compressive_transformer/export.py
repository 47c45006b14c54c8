"""A trained run as a Hugging Face-style directory: ``config.json`` (the model's hyperparameters at the top level,
the whole run config under ``run_config``), ``model.safetensors`` and the tokenizer's ``tokenizer.json``; and
:func:`from_pretrained` to load such a directory back with one call."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import safetensors.torch

from compressive_transformer.config import ConfigError, RunConfig, apply_overrides, to_dict

if TYPE_CHECKING:
    from compressive_transformer.loading import Run

CONFIG_JSON = "config.json"
WEIGHTS = "model.safetensors"
MODEL_TYPE = "compressive-transformer"


def export_run(run_dir: str | Path, out_dir: str | Path, *, checkpoint: str | Path | None = None) -> Path:
    """Write the run's newest (or ``checkpoint``'s) model into the new directory ``out_dir``; never into one that
    already holds something."""
    from compressive_transformer.loading import load_run

    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"export: {out} already holds files; choose a new output directory")
    return write_export(load_run(run_dir, device="cpu", checkpoint=checkpoint), out)


def write_export(run: "Run", out_dir: str | Path) -> Path:
    """Write ``run`` (its config, weights and tokenizer) as the new directory ``out_dir``, atomically."""
    from compressive_transformer import __version__

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


def from_pretrained(
    directory: str | Path, *, device: str | None = None, threads: int | None = None, overrides: Sequence[str] = ()
) -> "Run":
    """Load a directory written by :func:`export_run` as a :class:`~compressive_transformer.loading.Run`
    (``device`` as in ``load_run``; ``overrides``: ``eval.*`` keys)."""
    from compressive_transformer.data import load_tokenizer
    from compressive_transformer.loading import Run
    from compressive_transformer.models import build_model
    from compressive_transformer.train import resolve_device, set_threads

    directory = Path(directory)
    path = directory / CONFIG_JSON
    if not path.is_file():
        raise ConfigError(f"from_pretrained: {directory} has no {CONFIG_JSON}; give a directory written by `export`")
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("model_type") != MODEL_TYPE or "run_config" not in config:
        raise ConfigError(f"from_pretrained: {path} is not a {MODEL_TYPE} export")
    bad = [o for o in overrides if not o.strip().startswith("eval.")]
    if bad:
        raise ConfigError(f"override {bad[0]!r}: only eval.* keys change how an exported model is used")
    cfg = RunConfig.from_raw(apply_overrides(config["run_config"], list(overrides)))
    set_threads(threads if threads is not None else cfg.train.num_threads)
    model = build_model(cfg.model).to(resolve_device(device or "auto", key="--device"))
    try:
        safetensors.torch.load_model(
            model, str(directory / WEIGHTS), strict=True, device=str(next(model.parameters()).device)
        )
    except (OSError, RuntimeError, ValueError) as e:
        raise ConfigError(
            f"from_pretrained: {directory / WEIGHTS} does not fit {CONFIG_JSON} ({str(e).splitlines()[0][:200]})"
        ) from None
    model.eval()
    return Run(config=cfg, tokenizer=load_tokenizer(directory), model=model, run_dir=None, checkpoint=None)


__all__ = ["export_run", "write_export", "from_pretrained", "CONFIG_JSON", "WEIGHTS"]
