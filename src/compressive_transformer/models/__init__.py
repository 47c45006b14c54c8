"""The model family: the shared block and the language-model wrapper around it."""

from compressive_transformer.models.block import Block
from compressive_transformer.models.lm import IGNORE_INDEX, CompressiveTransformerLM, LMOutput

__all__ = ["Block", "CompressiveTransformerLM", "LMOutput", "IGNORE_INDEX"]
