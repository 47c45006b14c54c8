"""The table of model kinds: which class a ``ModelConfig`` builds, and what each kind answers for its configs (its
config check, its name in tables, its context-length and temporal-range formulas, its decoder). Adding a model is one module that
defines it (implementing :class:`~compressive_transformer.core.models.protocol.MemoryModel`) and calls
:func:`register_model`. The table itself lives in :mod:`compressive_transformer.core.registry`, below the config, so
that ``ModelConfig`` can run the kind's check."""

from __future__ import annotations

from typing import Any, Callable

from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.models.protocol import MemoryModel
from compressive_transformer.core.registry import MODEL_KINDS, ModelKind, find_model_kind, model_kind


def register_model(
    name: str,
    build: Callable[[ModelConfig], MemoryModel],
    applies: Callable[[ModelConfig], bool],
    *,
    check: Callable[[ModelConfig], None] | None = None,
    label: Callable[[ModelConfig], str] | None = None,
    context_length: Callable[[ModelConfig], Any] | None = None,
    temporal_range: Callable[[ModelConfig], Any] | None = None,
    fixed_memory: str = "",
    decoder: Callable[..., Any] | None = None,
) -> ModelKind:
    """Make ``build`` the model of every config ``applies`` accepts; kinds registered later are asked first, so a
    more specific kind registers after the general one. A name registered again is replaced."""
    MODEL_KINDS.pop(name, None)
    MODEL_KINDS[name] = kind = ModelKind(
        name,
        build,
        applies,
        check=check,
        label=label or (lambda cfg: name),
        context_length=context_length,
        temporal_range=temporal_range,
        fixed_memory=fixed_memory,
        decoder=decoder,
    )
    return kind


def build_model(cfg: ModelConfig) -> MemoryModel:
    """The model a configuration describes (Transformer-QL when ``scales`` is set, else the Compressive Transformer,
    which is Transformer-XL when ``cmem_len = 0``, unless a registered kind claims it)."""
    return model_kind(cfg).build(cfg)


__all__ = ["MODEL_KINDS", "ModelKind", "build_model", "find_model_kind", "model_kind", "register_model"]
