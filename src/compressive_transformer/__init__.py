"""Compressive Transformer, Transformer-XL and Transformer-QL for long-range sequence modelling."""

from compressive_transformer.config import ConfigError, ModelConfig
from compressive_transformer.memory import LayerMemory, MemoryState
from compressive_transformer.models import CompressiveTransformerLM, LMOutput
from compressive_transformer.ranges import TemporalRange, temporal_range

__all__ = [
    "ConfigError",
    "ModelConfig",
    "MemoryState",
    "LayerMemory",
    "CompressiveTransformerLM",
    "LMOutput",
    "TemporalRange",
    "temporal_range",
]
__version__ = "0.1.0"
