"""Compressive Transformer, Transformer-XL and Transformer-QL for long-range sequence modelling."""

from compressive_transformer.core.config import (
    AdaptiveConfig,
    CompressionConfig,
    ConfigError,
    DataConfig,
    EvalConfig,
    MemoryConfig,
    ModelConfig,
    PositionsConfig,
    QLConfig,
    RunConfig,
    TrainConfig,
    WaveNetConfig,
    load_run_config,
)
from compressive_transformer.core.context import (
    ContextLength,
    TemporalRange,
    context_length,
    context_length_from_config,
    temporal_range,
)
from compressive_transformer.core.memory import LayerMemory, MemoryState
from compressive_transformer.core.models import CompressiveTransformerLM, LMOutput, TransformerQL, build_model
from compressive_transformer.core.models.decode import Decoder
from compressive_transformer.core.version import __version__ as __version__
from compressive_transformer.data.units import TextSize, Units, units
from compressive_transformer.runs.export import export_run
from compressive_transformer.runs.loading import Run, from_pretrained, load_run
from compressive_transformer.training.evaluate import EvalResult, evaluate
from compressive_transformer.training.generate import SamplingConfig, filter_logits, generate
from compressive_transformer.training.text_eval import evaluate_text
from compressive_transformer.training.trainer import Trainer, TrainingError

__all__ = [
    "ConfigError",
    "ModelConfig",
    "MemoryConfig",
    "CompressionConfig",
    "PositionsConfig",
    "QLConfig",
    "WaveNetConfig",
    "AdaptiveConfig",
    "DataConfig",
    "TrainConfig",
    "EvalConfig",
    "RunConfig",
    "load_run_config",
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
    "Trainer",
    "TrainingError",
    "evaluate",
    "EvalResult",
    "generate",
    "filter_logits",
    "SamplingConfig",
    "Decoder",
    "Run",
    "load_run",
    "evaluate_text",
    "export_run",
    "from_pretrained",
    "TextSize",
    "Units",
    "units",
]
