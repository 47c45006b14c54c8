"""The agent memory core: stepping equals unrolling, a reset row equals a fresh memory, gradients stop at memory."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from compressive_transformer.agents.core import LSTMCore, TransformerCore
from compressive_transformer.core.config import ModelConfig

BASE = ModelConfig.from_raw(
    dict(
        vocab_size=0,
        input_dim=6,
        d_model=16,
        n_layers=2,
        n_heads=2,
        d_ff=32,
        seg_len=1,
        mem_len=4,
        cmem_len=3,
        compression_rate=2,
        norm="pre",
        dropout=0.0,
    )
)
KINDS = {
    "txl": dataclasses.replace(BASE, memory=dataclasses.replace(BASE.memory, cmem_len=0)),
    "ct": BASE,
    "ct-gated": dataclasses.replace(BASE, gating=True),
    "ct-maxpool": dataclasses.replace(
        BASE, compression=dataclasses.replace(BASE.compression, function="max_pool", loss="none")
    ),
    "ct-most-used": dataclasses.replace(
        BASE, compression=dataclasses.replace(BASE.compression, function="most_used", loss="none")
    ),
    "ct-bptt": dataclasses.replace(BASE, compression=dataclasses.replace(BASE.compression, loss="bptt")),
}
T, B = 11, 3


def _core(kind: str) -> TransformerCore | LSTMCore:
    torch.manual_seed(0)
    return LSTMCore(6, 16) if kind == "lstm" else TransformerCore(KINDS[kind])


def _firsts(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    first = torch.rand(T, B, generator=g) < 0.2
    first[0] = True
    return first


def _starts(steps: int) -> torch.Tensor:
    """One row whose episode starts at the first step."""
    first = torch.zeros(steps, 1, dtype=torch.bool)
    first[0] = True
    return first


@pytest.mark.parametrize("kind", [*KINDS, "lstm"])
def test_stepping_equals_unrolling(kind: str) -> None:
    core = _core(kind)
    x = torch.randn(T, B, 6)
    first = _firsts(1)
    state = core.initial_state(B)
    stepped = []
    for t in range(T):
        with torch.no_grad():  # acting
            out = core.step(x[t], state, first[t])
        stepped.append(out.features)
        state = out.state
    learned = core.unroll(x, core.initial_state(B), first)  # learning, with gradients
    torch.testing.assert_close(torch.stack(stepped), learned.features.detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", [*KINDS, "lstm"])
def test_reset_row_equals_fresh_memory(kind: str) -> None:
    """Row 1 starts an episode at step ``k``; its features from then on equal a one-row core started fresh. The
    compressed memory's groups follow the shared step count, so k is a multiple of the rate (see agents.core)."""
    core = _core(kind)
    k = 6
    x = torch.randn(T, B, 6)
    first = torch.zeros(T, B, dtype=torch.bool)
    first[0] = True
    first[k, 1] = True
    with torch.no_grad():
        batch = core.unroll(x, core.initial_state(B), first).features
        fresh = core.unroll(x[k:, 1:2], core.initial_state(1), _starts(T - k)).features
    torch.testing.assert_close(batch[k:, 1:2], fresh, rtol=0, atol=1e-5)
    assert not torch.allclose(batch[k:, 0], batch[k:, 1])  # the other rows kept their memory


def test_txl_reset_at_any_step_equals_fresh_memory() -> None:
    core = _core("txl")
    x = torch.randn(T, B, 6)
    for k in range(1, T - 1):
        first = torch.zeros(T, B, dtype=torch.bool)
        first[0] = True
        first[k, 2] = True
        with torch.no_grad():
            batch = core.unroll(x, core.initial_state(B), first).features
            fresh = core.unroll(x[k:, 2:3], core.initial_state(1), _starts(T - k)).features
        torch.testing.assert_close(batch[k:, 2:3], fresh[:, :, :], rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", list(KINDS))
def test_gradients_stop_at_memory(kind: str) -> None:
    """The last step's features depend on earlier observations through memory, but no gradient flows back to them
    (memory is detached, as between segments of text); every weight of the model but the compressor's gets one."""
    core = _core(kind)
    x = torch.randn(T, B, 6, requires_grad=True)
    first = torch.zeros(T, B, dtype=torch.bool)
    first[0] = True
    out = core.unroll(x, core.initial_state(B), first)
    (out.features[-1] * torch.randn(out.features.shape[-1])).sum().backward()  # a plain sum is constant after a norm
    assert x.grad[:-1].abs().max() == 0
    assert x.grad[-1].abs().max() > 0
    compressor = {id(p) for p in core.model.parameters_of("compressor")}
    for name, p in core.model.named_parameters():  # the task loss trains the compressor only under BPTT
        if id(p) in compressor:
            trained = p.grad is not None and p.grad.abs().max() > 0
            assert trained == (core.cfg.compression.loss == "bptt"), name
    with torch.no_grad():  # the memory does carry the past: another earlier observation changes the last features
        x2 = x.detach().clone()
        x2[-3] += 1.0
        assert not torch.allclose(core.unroll(x2, core.initial_state(B), first).features[-1], out.features[-1])
    assert all(not t.requires_grad for layer in out.state.layers for t in (layer.mem, layer.cmem))


def test_compression_loss_reaches_only_the_compressor() -> None:
    core = _core("ct")
    first = torch.zeros(T, B, dtype=torch.bool)
    first[0] = True
    out = core.unroll(torch.randn(T, B, 6), core.initial_state(B), first)
    assert out.aux_loss > 0
    out.aux_loss.backward()
    compressor = {id(p) for p in core.model.parameters_of("compressor")}
    for p in core.model.parameters():
        touched = p.grad is not None and p.grad.abs().max() > 0
        assert touched == (id(p) in compressor)


def test_lstm_backpropagates_through_the_unroll() -> None:
    core = _core("lstm")
    x = torch.randn(T, B, 6, requires_grad=True)
    first = torch.zeros(T, B, dtype=torch.bool)
    (core.unroll(x, core.initial_state(B), first).features[-1] * torch.randn(16)).sum().backward()
    assert x.grad[0].abs().max() > 0


def test_bad_core_configs_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match="input_dim"):
        TransformerCore(dataclasses.replace(BASE, input_dim=0, vocab_size=8))
    ql = ModelConfig.from_raw(
        dict(
            vocab_size=0,
            input_dim=6,
            d_model=16,
            n_layers=2,
            n_heads=2,
            d_ff=32,
            seg_len=4,
            mem_len=4,
            cmem_len=0,
            compression="mean_pool",
            compression_loss="none",
            compression_rate=2,
            scales=(1, 1),
        )
    )
    with pytest.raises(ValueError, match="Transformer-QL"):
        TransformerCore(ql)


@pytest.mark.parametrize("kind", list(KINDS))
def test_replay_of_recorded_memories_equals_stepping(kind: str) -> None:
    """The learner's batch of T steps (one model call per memory fill) gives the features and the task-loss
    gradients of stepping, from the memories the steps read while acting."""
    core = _core(kind)
    x = torch.randn(T, B, 6)
    first = _firsts(2)
    head = torch.randn(16)
    state, reads, stepped = core.initial_state(B), [], []
    for t in range(T):
        out = core.step(x[t], state, first[t])
        reads.append(out.read)
        stepped.append(out.features)
        state = out.state.detach()
    stepped = torch.stack(stepped)
    replayed = core.replay(x, reads)
    torch.testing.assert_close(replayed.features, stepped, rtol=0, atol=1e-5)
    params = core.model.parameters_of("model")
    g_step = torch.autograd.grad((stepped * head).sum(), params, allow_unused=True)
    g_replay = torch.autograd.grad((replayed.features * head).sum(), params, allow_unused=True)
    for a, b in zip(g_step, g_replay):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    if core.model.compressors is not None and core.cfg.compression.loss in ("attention", "autoencoder"):
        assert replayed.aux_loss > 0


def test_stack_rows_refuses_memories_of_different_fill() -> None:
    from compressive_transformer.agents.core import stack_rows

    core = _core("ct")
    a = core.initial_state(2)
    b = core.step(torch.randn(2, 6), a, torch.ones(2, dtype=torch.bool)).state
    assert stack_rows([a, a]).batch_size == 4
    with pytest.raises(ValueError, match="fill"):
        stack_rows([a, b])
