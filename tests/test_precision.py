"""Mixed precision: bf16 autocast on CPU tracks fp32, with memory buffers and the loss kept in fp32."""

from __future__ import annotations

import copy

import torch
from conftest import tiny_config

from compressive_transformer import CompressiveTransformerLM, build_model


def run(model, tokens, autocast: bool):
    memory, losses = model.init_memory(tokens.shape[0]), []
    for t in range(0, tokens.shape[1], 8):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(tokens[:, t : t + 8], memory=memory, targets=tokens[:, t : t + 8])
        memory = out.memory
        losses.append(out.loss)
    return torch.stack(losses), memory, out


def test_bf16_autocast_tracks_fp32_and_keeps_memory_in_fp32():
    torch.manual_seed(0)
    model = CompressiveTransformerLM(tiny_config(d_model=32, n_heads=4)).eval()
    tokens = torch.randint(0, 32, (2, 48))
    ref, _, _ = run(model, tokens, autocast=False)
    low, memory, out = run(model, tokens, autocast=True)
    assert out.logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32
    assert all(layer.mem.dtype == torch.float32 and layer.cmem.dtype == torch.float32 for layer in memory.layers)
    torch.testing.assert_close(low, ref, rtol=2e-2, atol=2e-2)


def test_bf16_autocast_backward_reaches_every_weight():
    torch.manual_seed(0)
    model = build_model(tiny_config(d_model=32, n_heads=4)).train()
    memory = model.init_memory(2)
    for _ in range(3):
        tokens = torch.randint(0, 32, (2, 8))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(tokens, memory=memory, targets=tokens)
        (out.loss + out.aux_loss).backward()
        memory = out.memory
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_inference_under_autocast_then_without_it_uses_tables_of_each_precision():
    """The projected positional tables reused at inference are keyed by the autocast dtype too: a bf16 table from an
    autocast evaluation is never fed to an fp32 one (a dtype error), nor the reverse (silently lower precision)."""
    torch.manual_seed(0)
    model = CompressiveTransformerLM(tiny_config(d_model=32, n_heads=4)).eval()
    tokens = torch.randint(0, 32, (2, 48))
    fresh = copy.deepcopy(model)
    with torch.no_grad():
        low, _, _ = run(model, tokens, autocast=True)  # bf16 tables made and kept
        fp32, _, _ = run(model, tokens, autocast=False)
        ref, _, _ = run(fresh, tokens, autocast=False)
        low_again, _, _ = run(model, tokens, autocast=True)
    assert torch.equal(fp32, ref) and torch.equal(low_again, low)
