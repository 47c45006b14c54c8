"""The model family: the shared block, the Compressive Transformer / Transformer-XL LM, and Transformer-QL, behind
the :class:`MemoryModel` protocol and the table of model kinds."""

from __future__ import annotations

from compressive_transformer.core.constants import IGNORE_INDEX
from compressive_transformer.core.context import context_length_from_config, temporal_range
from compressive_transformer.core.models import lm, ql, wavenet
from compressive_transformer.core.models.block import Block
from compressive_transformer.core.models.decode import Decoder
from compressive_transformer.core.models.kinds import MODEL_KINDS, ModelKind, build_model, model_kind, register_model
from compressive_transformer.core.models.lm import CompressiveTransformerLM, LMOutput
from compressive_transformer.core.models.protocol import MemoryModel
from compressive_transformer.core.models.ql import TransformerQL, ql_scales
from compressive_transformer.core.models.wavenet import WaveNet

register_model(
    "compressive",
    CompressiveTransformerLM,
    lambda cfg: True,
    label=lm.label,
    context_length=context_length_from_config,
    temporal_range=temporal_range,
    decoder=Decoder,
)
register_model(
    "transformer-ql",
    TransformerQL,
    lambda cfg: cfg.is_ql,
    check=ql.check_config,
    label=lambda cfg: "Transformer-QL",
    context_length=context_length_from_config,
    fixed_memory="Transformer-QL's memories are fixed by its scales",
)
register_model(
    "wavenet",
    WaveNet,
    lambda cfg: cfg.is_wavenet,
    check=wavenet.check_config,
    label=lambda cfg: "WaveNet",
    fixed_memory="WaveNet's memory is its receptive field (1 + the sum of its dilations)",
)

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
    "register_model",
]
