"""Our model as a plain Transformer-XL (cmem_len = 0) with the same attention size: mem_len = n_m + n_cm."""

from __future__ import annotations

from . import ours

NAME = "ours_txl"
LABEL = "ours, Transformer-XL (n_cm=0, n_m+n_cm memory)"


def build(w, **kw) -> ours.Impl:
    geometry = {k: kw.pop(k) for k in ("mem_len", "cmem_len", "attn_impl") if k in kw}
    cfg = ours.model_config(w, compressive=False, **geometry)
    return ours.Impl(w, cfg, **kw)
