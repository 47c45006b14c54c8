"""Compressive Transformer, Transformer-XL and Transformer-QL for long-range sequence modelling."""

from compressive_transformer.config import ConfigError, ModelConfig
from compressive_transformer.memory import LayerMemory, MemoryState
from compressive_transformer.context import ContextLength, context_length, context_length_from_config
from compressive_transformer.models import CompressiveTransformerLM, LMOutput, TransformerQL, build_model
from compressive_transformer.ranges import TemporalRange, temporal_range

__all__ = [
    "ConfigError",
    "ModelConfig",
    "MemoryState",
    "LayerMemory",
    "CompressiveTransformerLM",
    "TransformerQL",
    "build_model",
    "LMOutput",
    "ContextLength",
    "context_length",
    "context_length_from_config",
    "TemporalRange",
    "temporal_range",
]
__version__ = "0.1.0"
