"""Our model as a plain Transformer-XL (cmem_len = 0) with the same attention size: mem_len = n_m + n_cm."""

from __future__ import annotations

from . import ours

NAME = "ours_txl"
LABEL = "ours, Transformer-XL (n_cm=0, n_m+n_cm memory)"


def build(w, **kw) -> ours.Impl:
    cfg = ours.model_config(w, compressive=False, mem_len=kw.pop("mem_len", None), cmem_len=kw.pop("cmem_len", None))
    return ours.Impl(w, cfg, **kw)
