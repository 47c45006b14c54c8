"""Checkpoints: safetensors for tensors, JSON for everything else, written atomically.

A checkpoint is a directory ``<run>/checkpoints/step-00000100/`` holding

- ``model.safetensors``      the unwrapped model's weights
- ``optimizer.safetensors``  optimizer state tensors, ``optimizer.json`` the rest (param groups, hyperparameters)
- ``memory.safetensors``     the model memory carried into the next batch
- ``rng.safetensors``        torch / numpy RNG states
- ``state.json``             step, data-iterator position, python RNG, counters
- ``config.toml``            the resolved run config that wrote it
- ``manifest.json``          size and sha256 of every file above (see :mod:`compressive_transformer.runs.integrity`)

It is assembled in a temporary sibling directory, fsynced, and renamed into place with ``os.replace``, so a crash
mid-write leaves the previous checkpoints untouched and never a half-written ``step-*`` directory. Weights that are
not finite are never written. Loading verifies the manifest first and reports a damaged file in one line naming it;
:func:`newest_good_checkpoint` is how readers fall back to an older checkpoint that verifies.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import safetensors.torch
import torch

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import inside, remove
from compressive_transformer.runs.failures import is_disk_full, write_failure
from compressive_transformer.runs.integrity import IntegrityError, fsync_dir, verify_files, write_manifest

CHECKPOINTS = "checkpoints"
_NAME = re.compile(r"^step-(\d{8,})$")


class CheckpointError(ConfigError):
    """A checkpoint is missing, damaged, or was written by a different model or config."""


class NonFiniteWeights(CheckpointError):
    """The model holds NaN or infinite weights; such a state is never written as a checkpoint."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (a full disk, a lost mount); the earlier ones are untouched."""


# what each use of a checkpoint cannot do without (a checkpoint without memory/optimizer is only written by callers
# that pass none; its manifest then does not list them, and resuming from it is refused)
WEIGHTS_FILES = ("model.safetensors",)
RESUME_FILES = (
    "model.safetensors",
    "optimizer.safetensors",
    "optimizer.json",
    "memory.safetensors",
    "rng.safetensors",
    "state.json",
    "config.toml",
)


@dataclass
class Checkpoint:
    """What :func:`load_checkpoint` restores besides the weights (those go straight into the model)."""

    path: Path
    step: int
    memory: dict[str, torch.Tensor] | None
    data_state: Any
    extra: dict[str, Any] = field(default_factory=dict)
    optimizer_loaded: bool = False


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary directories of interrupted writes are ignored)."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def checkpoint_step(path: str | Path) -> int:
    """The update count a checkpoint directory of :func:`list_checkpoints` was written at (from its name)."""
    m = _NAME.match(Path(path).name)
    if m is None:
        raise CheckpointError(f"{path}: not a checkpoint directory (step-NNNNNNNN)")
    return int(m.group(1))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


# ---------------------------------------------------------------------------------------------------------------
# RNG and JSON helpers


def capture_rng() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Every RNG a training step may draw from: torch (CPU and CUDA), numpy's global one, python's."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = s
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["numpy"] = torch.from_numpy(np.asarray(keys, dtype=np.uint32).astype(np.int64))
    meta = {"numpy": [kind, int(pos), int(has_gauss), float(cached)], "python": encode(random.getstate())}
    return tensors, meta


def restore_rng(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted((k for k in tensors if k.startswith("cuda.")), key=lambda k: int(k[5:]))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])
    kind, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((kind, tensors["numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(decode(meta["python"]))


def encode(obj: Any) -> Any:
    """Make a data-iterator state (tuples, numpy arrays, tensors) JSON-safe and reversible with :func:`decode`."""
    if isinstance(obj, dict):
        return {"__dict__": [[encode(k), encode(v)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v) for v in obj]}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return {"__tensor__": obj.tolist(), "dtype": str(obj.dtype).removeprefix("torch.")}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} in a checkpoint")


def decode(obj: Any) -> Any:
    """The inverse of :func:`encode`: JSON in, plain values, tuples, tensors and arrays out (nothing else is built;
    a tensor's or array's dtype must name a number or bool type, else ``TypeError``)."""
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, dict):
        if "__dict__" in obj:
            return {decode(k): decode(v) for k, v in obj["__dict__"]}
        if "__tuple__" in obj:
            return tuple(decode(v) for v in obj["__tuple__"])
        if "__tensor__" in obj:
            return torch.tensor(obj["__tensor__"], dtype=_torch_dtype(obj["dtype"]))
        if "__ndarray__" in obj:
            return np.asarray(obj["__ndarray__"], dtype=_numpy_dtype(obj["dtype"]))
        return {k: decode(v) for k, v in obj.items()}
    return obj


def _torch_dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name!r} is not a torch dtype")
    return dtype


def _numpy_dtype(name: Any) -> np.dtype:
    dtype = np.dtype(name) if isinstance(name, str) and name.isidentifier() else None
    if dtype is None or dtype.kind not in "biuf":
        raise TypeError(f"{name!r} is not a numeric numpy dtype")
    return dtype


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, allow_nan=True), encoding="utf-8")


def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    # looked up at call time so tests can simulate a failing disk by patching safetensors.torch.save_file
    safetensors.torch.save_file({k: v.detach().contiguous().cpu().clone() for k, v in tensors.items()}, str(path))


# ---------------------------------------------------------------------------------------------------------------
# Optimizer state: tensors into safetensors, the rest into JSON


def _split_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], Any]:
    """Tensors keyed ``<param id>.<name>`` for safetensors; the rest encoded (tuples kept) for JSON."""
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[int, dict[str, Any]] = {}
    for pid, pstate in state["state"].items():
        for key, value in pstate.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{pid}.{key}"] = value
            else:
                plain.setdefault(int(pid), {})[key] = value
    # A captured run's learning rates are device tensors and its groups capturable: the checkpoint keeps the values, so
    # it resumes anywhere (a captured resume makes them tensors again).
    groups = [
        {k: float(v) if isinstance(v, torch.Tensor) else (False if k == "capturable" else v) for k, v in g.items()}
        for g in state["param_groups"]
    ]
    return tensors, encode({"param_groups": groups, "state": plain})


def _join_optimizer(tensors: dict[str, torch.Tensor], meta: Any) -> dict[str, Any]:
    meta = decode(meta)
    state: dict[int, dict[str, Any]] = {pid: dict(v) for pid, v in meta["state"].items()}
    for name, value in tensors.items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = value
    return {"state": dict(sorted(state.items())), "param_groups": meta["param_groups"]}


# ---------------------------------------------------------------------------------------------------------------
# Save / load


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    memory: dict[str, torch.Tensor] | None,
    data_state: Any,
    config_toml: str,
    extra: dict[str, Any] | None = None,
    keep: int = 3,
) -> Path:
    """Write checkpoint ``step`` atomically, then delete all but the newest ``keep``. Returns its directory.

    Raises :class:`NonFiniteWeights` (writing nothing) when a weight is NaN or infinite, and
    :class:`CheckpointWriteError` (leaving the earlier checkpoints as they were) when the files cannot be written."""
    if not weights_finite(model):
        raise NonFiniteWeights(f"the model's weights are not finite at step {step}; no checkpoint was written")
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    inside(run_dir, root)  # pruning deletes step-* folders: only the run's own
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        safetensors.torch.save_model(model, str(tmp / "model.safetensors"))
        if optimizer is not None:
            opt_tensors, opt_meta = _split_optimizer(optimizer.state_dict())
            _save_tensors(opt_tensors, tmp / "optimizer.safetensors")
            _write_json(tmp / "optimizer.json", opt_meta)
        if memory is not None:
            _save_tensors(memory, tmp / "memory.safetensors")
        rng_tensors, rng_meta = capture_rng()
        _save_tensors(rng_tensors, tmp / "rng.safetensors")
        (tmp / "config.toml").write_text(config_toml, encoding="utf-8")
        state = {"step": step, "rng": rng_meta, "data": encode(data_state), "extra": extra or {}}
        _write_json(tmp / "state.json", state)
        write_manifest(tmp, {"step": step})  # fsyncs every file, then records its sha256
        if final.exists():  # re-saving a step (e.g. the final step of a resumed run): swap, then drop the old one
            old = root / f".old-{final.name}-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(root)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, (OSError, safetensors.SafetensorError)):
            raise _write_error(run_dir, step, e) from None
        raise
    for stale in list_checkpoints(run_dir)[:-keep]:
        remove(stale, base=root)
    for debris in root.glob(".tmp-*"):  # left by a process killed mid-write
        shutil.rmtree(debris, ignore_errors=True)
    return final


def _write_error(run_dir: str | Path, step: int, error: BaseException) -> CheckpointWriteError:
    previous = latest_checkpoint(run_dir)
    where = f"from {previous}, which is intact" if previous is not None else "from step 0 (no earlier checkpoint)"
    remedy = "free some space, then" if is_disk_full(error) else "fix that, then"
    return CheckpointWriteError(
        f"the checkpoint of step {step} could not be written ({write_failure(error)}); "
        f"{remedy} continue with --resume, {where}"
    )


def weights_finite(model: torch.nn.Module) -> bool:
    """Whether every parameter and floating buffer is finite (one device sync for the whole model)."""
    tensors = [t for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point()]
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def non_finite(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """The first floating tensor of ``tensors`` holding NaN or infinity, described as ``"NAME (N of M values)"``,
    or None when every one is finite: loaded numbers are checked before anything computes with them."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return f"{name} ({int((~torch.isfinite(t)).sum()):,} of {t.numel():,} values)"
    return None


def verify_checkpoint(path: str | Path, required: tuple[str, ...] = WEIGHTS_FILES) -> None:
    """Check the manifest's sizes and sha256 and that every ``required`` file is there; one-line error otherwise."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a directory")
    try:
        verify_files(path, required)
    except IntegrityError as e:
        raise CheckpointError(f"checkpoint {path} is damaged: {e}") from None


def load_weights(path: str | Path, model: torch.nn.Module, *, verify: bool = True) -> None:
    """Load ``model.safetensors`` of a checkpoint into ``model`` after verifying it; a damaged file, non-finite
    weights, or a shape or key mismatch is a one-line error."""
    path = Path(path)
    file = path / "model.safetensors"
    if verify:
        verify_checkpoint(path, WEIGHTS_FILES)
    if not file.is_file():
        raise CheckpointError(f"checkpoint {path} has no model.safetensors; it is incomplete or not a checkpoint")
    try:
        safetensors.torch.load_model(model, str(file), strict=True, device=str(next(model.parameters()).device))
    except safetensors.SafetensorError as e:
        raise CheckpointError(
            f"checkpoint {path}: {file.name} does not parse ({str(e).splitlines()[0][:200]})"
        ) from None
    except (RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:3])[:300]
        raise CheckpointError(
            f"checkpoint {path} was written by a model of another shape or vocabulary ({detail}); "
            "use the config the run was trained with"
        ) from None
    if not weights_finite(model):
        raise CheckpointError(f"checkpoint {path}: {file.name} holds non-finite weights; it cannot be used")


def load_newest_weights(
    run_dir: str | Path,
    model: torch.nn.Module,
    checkpoint: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Load ``checkpoint`` (when given: no fallback, it was asked for) or else the newest checkpoint of the run whose
    weights verify and are finite, reporting each newer one that does not through ``log``. Returns the path used."""
    if checkpoint is not None:
        load_weights(checkpoint, model)
        return Path(checkpoint)
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise CheckpointError(f"{run_dir}: has no checkpoint yet; train it first (or resume it with --resume)")
    failures: list[CheckpointError] = []
    for path in reversed(ckpts):
        try:
            load_weights(path, model)
        except CheckpointError as e:
            failures.append(e)
            continue
        report_fallback(failures, log)
        return path
    raise CheckpointError(f"{failures[0]}; no older checkpoint of {run_dir} loads either")


def report_fallback(failures: list[CheckpointError], log: Callable[[str], None] | None) -> None:
    """One line per newer checkpoint that was passed over (said only once an older one was found to work)."""
    if log is not None:
        for e in failures:
            log(f"warning: {e}; falling back to an older checkpoint")


def newest_good_checkpoint(
    run_dir: str | Path, required: tuple[str, ...] = WEIGHTS_FILES, log: Callable[[str], None] | None = None
) -> Path | None:
    """The newest checkpoint of a run that verifies, reporting (through ``log``) each newer one that does not.
    None when the run has no checkpoint; a :class:`CheckpointError` when it has some but none verifies."""
    failures: list[CheckpointError] = []
    for path in reversed(list_checkpoints(run_dir)):
        try:
            verify_checkpoint(path, required)
        except CheckpointError as e:
            failures.append(e)
            continue
        report_fallback(failures, log)
        return path
    if failures:
        raise CheckpointError(
            f"{failures[0]}; no older checkpoint of {run_dir} verifies; move {checkpoint_dir(run_dir)} aside to start again from step 0"
        )
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path.parent}: {path.name} is missing") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint {path.parent}: {path.name} does not parse ({type(e).__name__})") from None


def _require_finite(path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    bad = non_finite(tensors)
    if bad is not None:
        raise CheckpointError(
            f"checkpoint {path.parent}: {path.name} holds non-finite values in {bad}; it cannot be resumed"
        )


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return safetensors.torch.load_file(str(path))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path.parent}: {path.name} is missing") from None
    except (safetensors.SafetensorError, ValueError, RuntimeError, OSError) as e:
        raise CheckpointError(
            f"checkpoint {path.parent}: {path.name} does not parse ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})"
        ) from None


def checkpoint_extra(path: str | Path) -> dict[str, Any]:
    """The ``extra`` record a checkpoint was saved with, after verifying its weights and state.json (what a reader
    of a weights-only checkpoint needs, without building a model)."""
    path = Path(path)
    verify_checkpoint(path, ("model.safetensors", "state.json"))
    state = _read_json(path / "state.json")
    extra = state.get("extra") if isinstance(state, dict) else None
    return extra if isinstance(extra, dict) else {}


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    restore_rng_state: bool = True,
) -> Checkpoint:
    """Restore weights (and optimizer, RNG states when given/asked) from checkpoint ``path``, after verifying that
    every file resuming needs is present and unchanged. Any damaged or missing file is a one-line
    :class:`CheckpointError` naming it (nothing is restored from a checkpoint that fails verification)."""
    path = Path(path)
    verify_checkpoint(
        path, RESUME_FILES if optimizer is not None else ("model.safetensors", "rng.safetensors", "state.json")
    )
    state = _read_json(path / "state.json")
    memory = _load_tensors(path / "memory.safetensors") if (path / "memory.safetensors").is_file() else None
    _require_finite(path / "memory.safetensors", memory or {})
    rng = _load_tensors(path / "rng.safetensors")
    opt_state = None
    if optimizer is not None:
        opt_tensors, opt_meta = _load_tensors(path / "optimizer.safetensors"), _read_json(path / "optimizer.json")
        _require_finite(path / "optimizer.safetensors", opt_tensors)
        try:
            opt_state = _join_optimizer(opt_tensors, opt_meta)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CheckpointError(f"checkpoint {path}: optimizer.json lacks a valid entry ({e!r})") from None
    try:
        step = int(state["step"])
        data_state = decode(state["data"])
        rng_meta = state["rng"]
        extra = state.get("extra", {})
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path}: state.json lacks a valid entry ({e!r})") from None
    load_weights(path, model, verify=False)
    if opt_state is not None:
        try:
            optimizer.load_state_dict(opt_state)
        except (ValueError, RuntimeError, KeyError) as e:
            raise CheckpointError(f"checkpoint {path}: optimizer state does not fit this model ({e})") from None
    if restore_rng_state:
        try:
            restore_rng(rng, rng_meta)
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise CheckpointError(
                f"checkpoint {path}: rng.safetensors / state.json hold no valid RNG state ({e!r})"
            ) from None
    return Checkpoint(
        path=path,
        step=step,
        memory=memory,
        data_state=data_state,
        extra=extra if isinstance(extra, dict) else {},
        optimizer_loaded=opt_state is not None,
    )
