"""The low-precision copies of the matmul weights a run under autocast keeps across updates: which weights, the same
forward, gradients and updates as autocast casting every step, refreshed by the update, exact resume, one graph."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from conftest import explain_training_step, tiny_config

from compressive_transformer import CompressiveTransformerLM
from compressive_transformer.runs.presets import TINY_TOML
from compressive_transformer.runs.rundir import config_from_text
from compressive_transformer.training.low_precision import LowPrecisionWeights, WithLowPrecisionWeights, matmul_weights
from compressive_transformer.training.update import apply_update
from compressive_transformer.training.workflows import train_run


def test_only_weights_that_matmuls_alone_read_are_kept():
    model = CompressiveTransformerLM(tiny_config(tie_embeddings=True))
    kept = matmul_weights(model)
    assert "blocks.0.ff.0.weight" in kept and "blocks.1.attn.out.weight" in kept and "compressors.0.conv.weight" in kept
    assert "input.embed.weight" not in kept  # the lookup reads it, and so does the tied head
    assert not any(name.endswith("qkv.weight") for name in kept)  # the reconstruction loss reads them in fp32
    assert not any("norm" in name or name.endswith((".u", ".v", ".cv")) for name in kept)  # read outside matmuls
    txl = CompressiveTransformerLM(tiny_config(cmem_len=0))
    assert "blocks.0.attn.qkv.weight" in matmul_weights(txl)  # no compression loss reads it


def test_kept_copies_compute_exactly_what_autocast_computes_update_after_update():
    """The same logits, losses, gradients and updated weights, bit for bit, as autocast casting every weight at every
    step; the update refreshes the copies (stale copies would change the second step on)."""
    torch.manual_seed(0)
    plain = CompressiveTransformerLM(tiny_config()).train()
    kept = copy.deepcopy(plain)
    weights = LowPrecisionWeights(kept, torch.bfloat16)
    runs = [(plain, plain, None), (kept, WithLowPrecisionWeights(kept, weights), weights)]
    optimizers = [torch.optim.Adam(m.parameters(), lr=1e-2, fused=True) for m, _, _ in runs]
    memories = [plain.init_memory(2), kept.init_memory(2)]
    for _ in range(4):  # empty, filling and compressing memories
        tokens = torch.randint(0, 32, (2, 8))
        results = []
        for i, ((model, forward, w), opt) in enumerate(zip(runs, optimizers)):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = forward(tokens, memory=memories[i], targets=tokens)
            (out.loss.float() + out.aux_loss.float()).backward()
            grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
            apply_update(opt, list(model.parameters()), max_norm=0.1, weights=w)
            opt.zero_grad(set_to_none=True)
            memories[i] = out.memory
            results.append(
                (out.logits, out.loss, out.aux_loss, grads, [p.detach().clone() for p in model.parameters()])
            )
        (logits, loss, aux, grads, params), (logits2, loss2, aux2, grads2, params2) = results
        assert torch.equal(logits, logits2) and torch.equal(loss, loss2) and torch.equal(aux, aux2)
        assert all(torch.equal(a, b) for a, b in zip(grads, grads2))
        assert all(torch.equal(a, b) for a, b in zip(params, params2))
    assert all(torch.equal(c, m.to(torch.bfloat16)) for c, m in zip(weights.copies, weights.masters))


def test_a_bf16_run_killed_and_resumed_repeats_the_losses_exactly(tmp_path: Path):
    """The copies follow the loaded weights on resume (made again from them), so the continued run is the same run."""
    cfg = config_from_text(
        TINY_TOML,
        ["train.progress=false", "train.steps=6", "train.checkpoint_every=2", "train.log_every=1", 'train.amp="bf16"',
         "train.accumulate=[[0, 1]]", "train.val_every=0"],
    )  # fmt: skip
    whole = train_run(cfg, tmp_path / "whole", log=lambda s: None)
    train_run(cfg, tmp_path / "killed", max_steps=3, log=lambda s: None)  # last checkpoint at step 2
    resumed = train_run(None, tmp_path / "killed", resume=True, log=lambda s: None)
    assert resumed.step == 6 and whole.losses[2:] == resumed.losses


@pytest.mark.slow
def test_the_training_step_with_kept_copies_is_one_graph():
    torch.manual_seed(0)
    model = CompressiveTransformerLM(tiny_config()).train()
    forward = WithLowPrecisionWeights(model, LowPrecisionWeights(model, torch.bfloat16))
    explained = explain_training_step(model, forward, amp=torch.bfloat16)
    assert explained.graph_break_count == 0, [str(b.reason)[:200] for b in explained.break_reasons]
