"""What the measuring child process and the quality runs share: where the repository is, and running a function
under autocast. Kept apart from :mod:`benchmarks.child` so that the two import it, not each other."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def repo_path(path: str | Path) -> str:
    """A path as results record it: relative to the repository root where it lies inside it (symlinks not followed),
    else as given, so committed results do not carry the directory layout of the machine that made them."""
    p = Path(path).absolute()
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(path)


def under_autocast(fn, device: str, amp: str):
    """``fn`` run under ``torch.autocast`` to ``amp`` (bf16 | fp16) on ``device``, or ``fn`` itself for "none"."""
    import torch

    if amp == "none":
        return fn
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[amp]

    def run(*args):
        with torch.autocast(torch.device(device).type, dtype=dtype):
            return fn(*args)

    return run


__all__ = ["HERE", "ROOT", "repo_path", "under_autocast"]
