"""FLOPs of a piece of work, counted by PyTorch's own ``torch.utils.flop_counter`` (matrix products and
convolutions, forward and backward; element-wise work is not counted), in total and per module."""

from __future__ import annotations

import re
from typing import Any, Callable

from torch.utils.flop_counter import FlopCounterMode


def count(work: Callable[[], Any]) -> tuple[int, dict[str, int]]:
    """(total FLOPs, FLOPs per module path) of ``work()``; a module's count includes its submodules'."""
    counter = FlopCounterMode(display=False)
    with counter:
        work()
    per_module = {name: int(sum(ops.values())) for name, ops in counter.get_flop_counts().items()}
    return int(counter.get_total_flops()), per_module


def matching(per_module: dict[str, int], pattern: str) -> int:
    """FLOPs summed over the modules whose path ends with ``pattern`` (a regular expression), e.g. every layer's
    attention ``blocks\\.\\d+\\.attn``."""
    rx = re.compile(rf"(^|\.){pattern}$")
    return sum(v for k, v in per_module.items() if rx.search(k))


__all__ = ["count", "matching"]
