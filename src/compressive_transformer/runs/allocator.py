"""Keep freed tensor memory in the process (glibc), so a CPU step does not page-fault its temporaries back in.

Every training or evaluation step allocates and frees the same large temporaries (attention scores, positional
biases, MLP activations). glibc hands big freed blocks back to the kernel (``munmap``, heap trimming), so the next
step touches fresh pages again: measured ~2,000–10,000 page faults per reference evaluation step and 10–20% of its
time. Raising the mmap and trim thresholds keeps those blocks for reuse; the peak memory is unchanged (it is reached
every step anyway). A process-wide setting, so only the command line applies it (``compressive-transformer ...``),
never the library; ``CT_KEEP_FREED_MEMORY=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>
MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed: blocks up to 32 MiB come from the reusable heap
TRIM_THRESHOLD = 1 << 30  # keep up to 1 GiB of free heap top instead of returning it after every step


def keep_freed_memory() -> bool:
    """Apply the thresholds; returns whether they took effect (glibc Linux only, and not turned off)."""
    if os.environ.get("CT_KEEP_FREED_MEMORY", "1") == "0":
        return False
    return set_thresholds(mmap=MMAP_THRESHOLD, trim=TRIM_THRESHOLD)


def set_thresholds(*, mmap: int, trim: int) -> bool:
    """Set glibc's mmap and trim thresholds (bytes); False where there is no glibc ``mallopt``."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, mmap)) and bool(mallopt(M_TRIM_THRESHOLD, trim))
