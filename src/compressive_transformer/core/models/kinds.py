"""The table of model kinds: which class a ``ModelConfig`` builds. Adding a model is one module that defines it
(implementing :class:`~compressive_transformer.core.models.protocol.MemoryModel`) and calls :func:`register_model`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.models.protocol import MemoryModel


@dataclass(frozen=True)
class ModelKind:
    """``build`` makes the model of a config that ``applies`` to it."""

    name: str
    build: Callable[[ModelConfig], MemoryModel]
    applies: Callable[[ModelConfig], bool]


MODEL_KINDS: dict[str, ModelKind] = {}


def register_model(
    name: str, build: Callable[[ModelConfig], MemoryModel], applies: Callable[[ModelConfig], bool]
) -> ModelKind:
    """Make ``build`` the model of every config ``applies`` accepts; kinds registered later are asked first, so a
    more specific kind registers after the general one. A name registered again is replaced."""
    MODEL_KINDS.pop(name, None)
    MODEL_KINDS[name] = kind = ModelKind(name, build, applies)
    return kind


def model_kind(cfg: ModelConfig) -> ModelKind:
    """The kind that builds ``cfg``: the newest registered one that applies."""
    for kind in reversed(MODEL_KINDS.values()):
        if kind.applies(cfg):
            return kind
    raise ValueError(f"no model kind applies to this configuration; registered: {', '.join(MODEL_KINDS)}")


def build_model(cfg: ModelConfig) -> MemoryModel:
    """The model a configuration describes (Transformer-QL when ``scales`` is set, else the Compressive Transformer,
    which is Transformer-XL when ``cmem_len = 0``, unless a registered kind claims it)."""
    return model_kind(cfg).build(cfg)


__all__ = ["MODEL_KINDS", "ModelKind", "build_model", "model_kind", "register_model"]
