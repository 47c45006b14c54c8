"""The first fused Triton relative attention, frozen as a baseline (see :mod:`.launch`); not a model adapter."""

from .launch import fused_relative_attention_v1

__all__ = ["fused_relative_attention_v1"]
