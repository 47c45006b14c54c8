"""The model family: the shared block, the Compressive Transformer / Transformer-XL LM, and Transformer-QL."""

from __future__ import annotations

from compressive_transformer.config import ModelConfig
from compressive_transformer.models.block import Block
from compressive_transformer.models.io import IGNORE_INDEX
from compressive_transformer.models.lm import CompressiveTransformerLM, LMOutput
from compressive_transformer.models.ql import TransformerQL, ql_scales


def build_model(cfg: ModelConfig) -> CompressiveTransformerLM | TransformerQL:
    """The model a configuration describes: Transformer-QL when ``scales`` is set, else the Compressive
    Transformer (Transformer-XL when ``cmem_len = 0``)."""
    return TransformerQL(cfg) if cfg.is_ql else CompressiveTransformerLM(cfg)


__all__ = ["Block", "CompressiveTransformerLM", "TransformerQL", "LMOutput", "IGNORE_INDEX", "build_model", "ql_scales"]
