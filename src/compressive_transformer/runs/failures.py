"""Failures that come from the machine rather than from the code (out of memory, a full disk, Ctrl-C) turned into
one line that says what happened and what to change, at the entry points where the sizes involved are known."""

from __future__ import annotations

import contextlib
import errno
from typing import Iterator, Mapping

import torch

from compressive_transformer.core.config import ConfigError, RunConfig

# what the allocators say: torch.OutOfMemoryError (CUDA, MPS), and the CPU allocator's RuntimeError
_OOM_TEXT = ("DefaultCPUAllocator", "can't allocate memory", "not enough memory", "out of memory")


class OutOfMemory(ConfigError):
    """An allocation failed at sizes the budget check let through (it only refuses what can never fit); the
    message names the config keys that set those sizes."""


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, MemoryError):
        return True
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(text in str(error) for text in _OOM_TEXT)


@contextlib.contextmanager
def sizes_to_lower(doing: str, sizes: Mapping[str, int | str | None], remedy: str) -> Iterator[None]:
    """Turn running out of memory inside the block into :class:`OutOfMemory` naming ``sizes`` (key -> value)."""
    try:
        yield
    except BaseException as e:
        if not is_out_of_memory(e):
            raise
        named = ", ".join(f"{key} = {value}" for key, value in sizes.items())
        raise OutOfMemory(f"out of memory while {doing} ({named}); {remedy}") from None


def training_sizes(cfg: RunConfig) -> dict[str, int]:
    m = cfg.model
    return {
        "train.batch_size": cfg.train.batch_size,
        "model.seg_len": m.seg_len,
        "model.memory.mem_len": m.memory.mem_len,
    } | ({"model.memory.cmem_len": m.memory.cmem_len} if m.memory.cmem_len else {})


def evaluation_sizes(cfg: RunConfig) -> dict[str, int]:
    """The eval keys with the values they resolve to (an unset length is the model's)."""
    e, m = cfg.eval, cfg.model
    sizes = {
        "eval.batch_size": e.batch_size,
        "eval.seg_len": e.seg_len or m.seg_len,
        "eval.mem_len": m.memory.mem_len if e.mem_len is None else e.mem_len,
    }
    cmem = m.memory.cmem_len if e.cmem_len is None else e.cmem_len
    return sizes | ({"eval.cmem_len": cmem} if cmem else {})


TRAINING_REMEDY = (
    "lower them and start the run again, in the same --run-dir while it has no checkpoint (else in a new one: a run's "
    "sizes cannot change on --resume), e.g. --set train.batch_size=2"
)
EVALUATION_REMEDY = "lower them, e.g. --set eval.batch_size=1"
VALIDATION_REMEDY = "continue with lower ones, e.g. --resume --set eval.batch_size=1 (eval keys may change on --resume)"


def is_disk_full(error: BaseException) -> bool:
    text = str(error)
    return (
        (isinstance(error, OSError) and error.errno == errno.ENOSPC) or "No space left" in text or "StorageFull" in text
    )


def write_failure(error: BaseException) -> str:
    """What went wrong while writing a file, in a few words."""
    if is_disk_full(error):
        return "No space left on device"  # the words of the OS, whichever layer reported it
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return (str(error).splitlines() or [type(error).__name__])[0][:200]


# ---------------------------------------------------------------------------------------------------------------
# Ctrl-C: the advice depends on what the interrupted command leaves behind

__all__ = [
    "OutOfMemory",
    "EVALUATION_REMEDY",
    "TRAINING_REMEDY",
    "VALIDATION_REMEDY",
    "evaluation_sizes",
    "is_disk_full",
    "is_out_of_memory",
    "sizes_to_lower",
    "training_sizes",
    "write_failure",
]
