"""The model family: the shared block, the Compressive Transformer / Transformer-XL LM, Transformer-QL and WaveNet,
behind the :class:`MemoryModel` protocol; ``build_model`` makes the kind a config names (the kinds are rows of
:data:`~compressive_transformer.core.registry.MODEL_KINDS`)."""

from __future__ import annotations

from compressive_transformer.core.constants import IGNORE_INDEX
from compressive_transformer.core.models.block import Block
from compressive_transformer.core.models.decode import Decoder
from compressive_transformer.core.models.kinds import MODEL_KINDS, ModelKind, build_model, model_kind, register_model
from compressive_transformer.core.models.lm import CompressiveTransformerLM, LMOutput
from compressive_transformer.core.models.protocol import MemoryModel
from compressive_transformer.core.models.ql import TransformerQL, ql_scales
from compressive_transformer.core.models.wavenet import WaveNet

__all__ = [
    "Block",
    "CompressiveTransformerLM",
    "Decoder",
    "IGNORE_INDEX",
    "LMOutput",
    "MODEL_KINDS",
    "MemoryModel",
    "ModelKind",
    "TransformerQL",
    "WaveNet",
    "build_model",
    "model_kind",
    "ql_scales",
    "register_model",
]
