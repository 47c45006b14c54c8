"""The torch.compile path (the trainer's train.compile) on CPU: same outputs and gradients as eager mode, also
when the compile caches are warm (run it twice)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

from compressive_transformer import CompressiveTransformerLM
from compressive_transformer.train import compile_model


@pytest.mark.slow
def test_compiled_model_matches_eager_through_memory_filling_and_compression():
    torch.manual_seed(0)
    model = CompressiveTransformerLM(tiny_config())
    compiled = compile_model(model)  # what the trainer runs with train.compile = true
    memories = [model.init_memory(2), model.init_memory(2)]
    for _ in range(3):  # empty memory, full memory, full compressed memory
        tokens = torch.randint(0, 32, (2, 8))
        outs = []
        for i, fn in enumerate((model, compiled)):
            model.zero_grad(set_to_none=True)
            out = fn(tokens, memory=memories[i], targets=tokens)
            (out.loss + out.aux_loss).backward()
            memories[i] = out.memory
            outs.append((out.logits.detach(), out.aux_loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(outs[1][1], outs[0][1], rtol=1e-5, atol=1e-6)
        assert len(outs[1][2]) == len(outs[0][2])
        for g_compiled, g_eager in zip(outs[1][2], outs[0][2]):
            torch.testing.assert_close(g_compiled, g_eager, rtol=1e-4, atol=1e-6)
