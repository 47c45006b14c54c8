"""The torch.compile path (the trainer's train.compile) on CPU: same outputs and gradients as eager mode, also
when the compile caches are warm (run it twice)."""

from __future__ import annotations

import pytest
import torch
from conftest import eager_and_compiled_steps, tiny_config

from compressive_transformer import CompressiveTransformerLM


@pytest.mark.slow
def test_compiled_model_matches_eager_through_memory_filling_and_compression():
    torch.manual_seed(0)
    model = CompressiveTransformerLM(tiny_config())
    for eager, compiled in eager_and_compiled_steps(model):  # empty memory, full memory, full compressed memory
        torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled[1], eager[1], rtol=1e-5, atol=1e-6)
        assert len(compiled[2]) == len(eager[2])
        for g_compiled, g_eager in zip(compiled[2], eager[2]):
            torch.testing.assert_close(g_compiled, g_eager, rtol=1e-4, atol=1e-6)
