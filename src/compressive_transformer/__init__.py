"""Compressive Transformer, Transformer-XL and Transformer-QL for long-range sequence modelling."""

from compressive_transformer.config import (
    ConfigError,
    DataConfig,
    EvalConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    load_run_config,
)
from compressive_transformer.context import (
    ContextLength,
    TemporalRange,
    context_length,
    context_length_from_config,
    temporal_range,
)
from compressive_transformer.evaluate import EvalResult, evaluate
from compressive_transformer.export import export_run, from_pretrained
from compressive_transformer.generate import filter_logits, generate
from compressive_transformer.loading import Run, load_run
from compressive_transformer.memory import LayerMemory, MemoryState
from compressive_transformer.models import CompressiveTransformerLM, LMOutput, TransformerQL, build_model
from compressive_transformer.models.decode import Decoder
from compressive_transformer.text_eval import evaluate_text
from compressive_transformer.train import Trainer, TrainingError
from compressive_transformer.units import TextSize, Units, units

__all__ = [
    "ConfigError",
    "ModelConfig",
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
__version__ = "0.1.0"
