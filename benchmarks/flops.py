"""FLOPs of a piece of work, counted by PyTorch's own ``torch.utils.flop_counter`` (matrix products and
convolutions, forward and backward; element-wise work is not counted), in total and per module."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any, Callable

from torch.utils.flop_counter import FlopCounterMode

from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.runs.provenance import report_provenance


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


def cost_arguments(doc: str, arms: str, updates: tuple[int, int], argv: list[str] | None) -> argparse.Namespace:
    """The cost scripts' command line: a spec, the arms to measure (default all), the two pilot lengths, the output
    folder (default: the spec's folder / the spec's name, set as ``out``)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("spec", type=Path)
    p.add_argument(f"--{arms}", nargs="*", dest="arms", help="default: every one of the spec")
    p.add_argument("--updates", type=int, nargs=2, default=updates, metavar=("FEWER", "MORE"))
    p.add_argument("--out", type=Path, help="default: the spec's folder / the spec's name")
    args = p.parse_args(argv)
    args.out = args.out or args.spec.parent / args.spec.stem
    return args


def save_cost(out: Path, result: dict[str, Any], arms: str, markdown: Callable[[dict[str, Any]], list[str]]) -> None:
    """``cost.json`` and ``cost.md`` in ``out``; the arms of ``result[arms]`` join those an earlier call measured
    (a call may measure only some arms), each with the code and machine that measured it; the table is printed."""
    made = report_provenance(exclude=[out])  # per arm: a later call measuring other arms keeps each arm's own
    for entry in result[arms].values():
        entry.setdefault("provenance", made)
    previous = out / "cost.json"
    if previous.is_file():
        result[arms] = json.loads(previous.read_text(encoding="utf-8")).get(arms, {}) | result[arms]
    write_text_atomic(out / "cost.json", json.dumps(result, indent=1) + "\n")
    write_text_atomic(out / "cost.md", "\n".join(markdown(result)) + "\n")
    print("\n".join(markdown(result)))


__all__ = ["cost_arguments", "count", "matching", "save_cost"]
