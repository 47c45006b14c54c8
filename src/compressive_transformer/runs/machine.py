"""What a measurement ran on: CPU model and the instruction sets that change its speed, cores, threads, versions.
Recorded beside every benchmark and study number, since only ratios measured on one machine compare."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any, Callable

import torch

from compressive_transformer.core.config import ConfigError

# flags that change matmul speed by large factors: AVX-512 doubles fp32 width, BF16/AMX run bf16 at 2-16x fp32
SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


def cpu_model_and_flags() -> tuple[str, list[str]]:
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags.update(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model or platform.processor(), [f for f in SPEED_FLAGS if f in flags]


SMALL_MACHINE = 4  # cores; below this, PyTorch's default of one thread per core collapses when another process runs


def available_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def thread_warning(requested: int) -> str | None:
    """One line when the CPU thread count is likely to make throughput collapse, else None. ``requested`` is the
    configured count (0: PyTorch's default, one per core)."""
    cores = available_cores()
    threads = requested or torch.get_num_threads()
    if threads > cores:
        return f"warning: {threads} CPU threads on {cores} available cores; every op will wait for a core (set num_threads / --threads <= {cores})"
    if requested == 0 and cores <= SMALL_MACHINE and threads > 1:
        return (
            f"warning: num_threads is unset, so torch uses all {cores} cores; if another process shares them throughput "
            "can fall 10x (set train.num_threads = 1 or pass --threads 1)"
        )
    return None


_warned_threads: set[int] = set()


def set_threads(num_threads: int, log: Callable[[str], None] | None = None) -> None:
    """Pin torch's CPU thread count (0 leaves PyTorch's default); oversubscribed cores make every op wait, so a
    count likely to collapse throughput is reported once per process through ``log``."""
    if num_threads > 0:
        torch.set_num_threads(num_threads)
    message = thread_warning(num_threads)
    if message and log is not None and num_threads not in _warned_threads:
        _warned_threads.add(num_threads)
        log(message)


def resolve_device(name: str, key: str = "train.device") -> torch.device:
    """``auto`` is CUDA where available, else CPU; a device this machine lacks is a one-line error naming ``key``."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{key}: {name!r} asked for but CUDA is not available; use cpu or auto")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{key}: 'mps' asked for but not available; use cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{key}: unknown device {name!r}; use auto, cpu or cuda") from None


def machine_info() -> dict[str, Any]:
    model, flags = cpu_model_and_flags()
    info: dict[str, Any] = {
        "cpu": model,
        "cpu_flags": flags,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


__all__ = [
    "SMALL_MACHINE",
    "SPEED_FLAGS",
    "available_cores",
    "cpu_model_and_flags",
    "machine_info",
    "resolve_device",
    "set_threads",
    "thread_warning",
]
