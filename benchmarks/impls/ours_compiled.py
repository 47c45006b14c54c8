"""Our model with its ring-buffer decoder under ``torch.compile`` (``Decoder(..., compile=True)``,
``generate --compile``): generation only, since training and evaluation run eagerly (compiled, they were slower on
this CPU). The compilation happens in the harness's warm-up generation and is reported as its ``first_call_s``."""

from __future__ import annotations

from . import ours

NAME = "ours_compiled"
LABEL = "ours (compressive), compiled decoder"


def build(w, **kw) -> ours.Impl:
    impl = ours.build(w, **kw)
    impl.compile_decoder = True
    return impl
