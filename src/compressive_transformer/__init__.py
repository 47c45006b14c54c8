"""Compressive Transformer, Transformer-XL and Transformer-QL for long-range sequence modelling.

The names below are imported on first use (PEP 562), so that ``import compressive_transformer`` itself imports
nothing heavy: the console entry point (:mod:`compressive_transformer.launch`) then owns the seconds ``import torch``
takes, and Ctrl-C during them ends in one line.
"""

from __future__ import annotations

from compressive_transformer.core.lazy import lazy_names
from compressive_transformer.core.version import __version__ as __version__

# public name -> the module (below this package) that defines it
_EXPORTS = {
    **dict.fromkeys(
        (
            "AdaptiveConfig", "CompressionConfig", "ConfigError", "DataConfig", "EvalConfig", "MemoryConfig",
            "ModelConfig", "PositionsConfig", "QLConfig", "RunConfig", "TrainConfig", "WaveNetConfig",
            "load_run_config",
        ),
        "core.config",
    ),
    **dict.fromkeys(
        ("ContextLength", "TemporalRange", "context_length", "context_length_from_config", "temporal_range"),
        "core.context",
    ),
    **dict.fromkeys(("LayerMemory", "MemoryState"), "core.memory"),
    **dict.fromkeys(("CompressiveTransformerLM", "LMOutput", "TransformerQL", "build_model"), "core.models"),
    "Decoder": "core.models.decode",
    **dict.fromkeys(("TextSize", "Units", "units"), "data.units"),
    "export_run": "runs.export",
    **dict.fromkeys(("Run", "from_pretrained", "load_run"), "runs.loading"),
    **dict.fromkeys(("EvalResult", "evaluate"), "inference.evaluate"),
    **dict.fromkeys(("SamplingConfig", "filter_logits", "generate"), "inference.generate"),
    "evaluate_text": "inference.text_eval",
    **dict.fromkeys(("Trainer", "TrainingError"), "training.trainer"),
}  # fmt: skip


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)


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
