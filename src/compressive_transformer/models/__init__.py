"""The model family: the shared block, the Compressive Transformer / Transformer-XL LM, and Transformer-QL, behind
the :class:`MemoryModel` protocol and the table of model kinds."""

from __future__ import annotations

from compressive_transformer.constants import IGNORE_INDEX
from compressive_transformer.models.block import Block
from compressive_transformer.models.kinds import MODEL_KINDS, ModelKind, build_model, model_kind, register_model
from compressive_transformer.models.lm import CompressiveTransformerLM, LMOutput
from compressive_transformer.models.protocol import MemoryModel
from compressive_transformer.models.ql import TransformerQL, ql_scales
from compressive_transformer.models.wavenet import WaveNet, receptive_field

register_model("compressive", CompressiveTransformerLM, lambda cfg: True)
register_model("transformer-ql", TransformerQL, lambda cfg: cfg.is_ql)
register_model("wavenet", WaveNet, lambda cfg: cfg.is_wavenet)

__all__ = [
    "Block",
    "CompressiveTransformerLM",
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
    "receptive_field",
    "register_model",
]
