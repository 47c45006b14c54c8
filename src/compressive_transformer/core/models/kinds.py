"""Building a model from its config: the kind ``model.kind`` names, looked up in the table of model kinds
(:data:`~compressive_transformer.core.registry.MODEL_KINDS`, where the built-in kinds are listed as rows). Adding a
model is one module that defines it (implementing :class:`~compressive_transformer.core.models.protocol.MemoryModel`)
plus one row: :func:`register_model` from the user's module, or a row in the table for a built-in kind."""

from __future__ import annotations

from typing import Any, Callable

from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.models.protocol import MemoryModel
from compressive_transformer.core.registry import (
    MODEL_KINDS,
    ModelKind,
    find_model_kind,
    model_kind,
    register_model_kind,
)


def register_model(
    name: str,
    build: Callable[[ModelConfig], MemoryModel] | str,
    *,
    check: Callable[[ModelConfig], None] | str | None = None,
    label: Callable[[ModelConfig], str] | str | None = None,
    context_length: Callable[[ModelConfig], Any] | str | None = None,
    temporal_range: Callable[[ModelConfig], Any] | str | None = None,
    fixed_memory: str = "",
    decoder: Callable[..., Any] | str | None = None,
) -> ModelKind:
    """Make ``build`` the model of every config with ``model.kind = name`` (each callable may also be given as
    ``"package.module:attr"``, imported when first used); your name registered again is replaced, a built-in one
    is refused. The kind shares the common [model] keys; its own rules go in ``check``."""
    return register_model_kind(
        ModelKind(
            name,
            build,
            check=check,
            label=label,
            context_length=context_length,
            temporal_range=temporal_range,
            fixed_memory=fixed_memory,
            decoder=decoder,
        )
    )


def build_model(cfg: ModelConfig) -> MemoryModel:
    """The model ``cfg.kind`` names: the Compressive Transformer (Transformer-XL when ``memory.cmem_len = 0``),
    Transformer-QL, WaveNet, or a kind registered by the user."""
    return model_kind(cfg).build(cfg)


__all__ = ["MODEL_KINDS", "ModelKind", "build_model", "find_model_kind", "model_kind", "register_model"]
