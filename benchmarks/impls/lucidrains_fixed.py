"""compressive-transformer-pytorch 0.4.0 with its key/value freeze undone (see lucidrains.py): what a correct
training step of that implementation costs. Not a shipped configuration; reported beside the shipped one."""

from __future__ import annotations

from . import lucidrains

NAME = "lucidrains_fixed"
LABEL = "compressive-transformer-pytorch 0.4.0, k/v freeze undone"


def build(w, **kw) -> lucidrains.Impl:
    return lucidrains.Impl(w, fix=True, **kw)
