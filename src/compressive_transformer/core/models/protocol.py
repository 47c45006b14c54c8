"""What training, evaluation, generation and the analyses may assume of a model: the :class:`MemoryModel` protocol.

Every model kind is a ``torch.nn.Module`` that takes its memory as an explicit value and returns the updated one; the
code above ``models/`` is written against this protocol (and ``nn.Module``'s own API), never a concrete class.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.memory import MemoryState
from compressive_transformer.core.models.lm import LMOutput


@runtime_checkable
class MemoryModel(Protocol):
    """A language model with explicit recurrent memory."""

    cfg: ModelConfig
    training: bool

    def init_memory(
        self,
        batch_size: int,
        *,
        mem_len: int | None = None,
        cmem_len: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> MemoryState:
        """An empty memory of ``batch_size`` rows (lengths default to the config's)."""
        ...

    def forward(
        self,
        inputs: Tensor,
        memory: MemoryState | None = None,
        targets: Tensor | None = None,
        *,
        input_mask: Tensor | None = None,
        need_weights: bool = False,
        compression_loss: bool | None = None,
    ) -> LMOutput:
        """One segment: outputs, loss where ``targets`` are given, and the memory the next segment reads."""
        ...

    def __call__(self, *args: Any, **kwargs: Any) -> LMOutput: ...

    def parameters_of(self, group: str) -> list[nn.Parameter]:
        """``"compressor"`` (trained by the compression loss, its own learning-rate scale) or ``"model"``."""
        ...

    def weights_changed(self) -> None:
        """Declare a hand-made write of the weights (``p.data = ...``) that no optimizer hook or version counter sees."""
        ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...


__all__ = ["MemoryModel"]
