"""The decoder computes exactly what model.forward computes at T = 1, memory included, for every configuration."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer.core.models.decode import Decoder, unsupported
from compressive_transformer.inference.generate import SamplingConfig, generate

SUPPORTED = [
    dict(),
    dict(compression="dilated_conv", compression_extra_width=1),
    dict(compression="max_pool", compression_loss="none", compression_rate=3),
    dict(compression="mean_pool", compression_loss="none", norm="pre"),
    dict(compression="conv", compression_loss="autoencoder", compression_rate=3, norm="pre", gating=True),
    dict(cmem_len=0),
    dict(mem_len=0, cmem_len=0),
    dict(clamp_len=5, tie_embeddings=True),
    dict(compression="max_pool", compression_loss="none", cmem_positions="shared"),
    dict(compression="most_used", compression_loss="none"),
    dict(compression="conv", compression_loss="bptt"),
    dict(same_length=True, mem_len=6, attn_impl="math"),
    dict(same_length=True, mem_len=7, compression="max_pool", compression_loss="none", attn_impl="reference"),
    dict(attn_impl="sdpa-bias", cmem_positions="shared"),
]
UNSUPPORTED = [dict(input_dim=3, vocab_size=0)]


def assert_same_memory(a, b):
    for x, y in zip(a.layers, b.layers):
        assert x.fill == y.fill and x.mem_len == y.mem_len
        assert torch.equal(x.mem_mask, y.mem_mask) and torch.equal(x.cmem_mask, y.cmem_mask)
        torch.testing.assert_close(x.mem, y.mem, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(x.cmem, y.cmem, rtol=1e-10, atol=1e-10)
        assert (x.history is None) == (y.history is None)
        if x.history is not None:  # the dilated convolution's evicted stream
            assert torch.equal(x.history_mask, y.history_mask)
            torch.testing.assert_close(x.history, y.history, rtol=1e-10, atol=1e-10)


def decode_both(model, memory, tokens):
    """Logits of each token fed one at a time through the model and through a Decoder, and both final memories."""
    decoder = Decoder(model, memory)
    ours, theirs = [], []
    with torch.no_grad():
        for t in range(tokens.shape[1]):
            ours.append(decoder.step(tokens[:, t]))
            out = model(tokens[:, t : t + 1], memory=memory)
            theirs.append(out.logits[:, 0])
            memory = out.memory
    return torch.stack(ours, 1), torch.stack(theirs, 1), decoder.memory(), memory


@pytest.mark.parametrize("variant", SUPPORTED, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "default")
def test_decoder_equals_the_model_token_by_token_across_ring_wraps(variant):
    model = tiny_model(**variant)
    tokens = torch.randint(0, 32, (2, 60))
    with torch.no_grad():
        memory = model(tokens[:, :8], memory=model.init_memory(2)).memory
        memory = model(tokens[:, 8:11], memory=memory).memory  # a partial segment: a group of c is still pending
    ours, theirs, mem_ours, mem_theirs = decode_both(model, memory, tokens[:, 11:])  # 49 tokens: rings wrap often
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    assert_same_memory(mem_ours, mem_theirs)


@pytest.mark.parametrize(
    "variant", [dict(), dict(compression="dilated_conv", compression_extra_width=1)], ids=["conv", "dilated"]
)
def test_decoder_respects_invalid_slots_and_other_memory_lengths(variant):
    """A padded prompt row, a row reset at a document boundary, and longer memories than in training."""
    model = tiny_model(**variant)
    tokens = torch.randint(0, 32, (3, 50))
    pad = torch.ones(3, 8, dtype=torch.bool)
    pad[0, :5] = False
    with torch.no_grad():
        memory = model.init_memory(3, mem_len=12, cmem_len=6)
        memory = model(tokens[:, :8], memory=memory, input_mask=pad).memory
        memory = model(tokens[:, 8:16], memory=memory).memory.reset([1])
    ours, theirs, mem_ours, mem_theirs = decode_both(model, memory, tokens[:, 16:])
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    assert_same_memory(mem_ours, mem_theirs)


def test_the_memory_a_decoder_hands_back_continues_the_stream_exactly():
    model = tiny_model()
    tokens = torch.randint(0, 32, (1, 40))
    with torch.no_grad():
        memory = model(tokens[:, :8]).memory
        decoder = Decoder(model, memory)
        for t in range(8, 32):
            decoder.step(tokens[:, t])
            memory = model(tokens[:, t : t + 1], memory=memory).memory
        handed = decoder.memory()
        got = model(tokens[:, 32:40], memory=handed)
        want = model(tokens[:, 32:40], memory=memory)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-10, atol=1e-10)
    assert_same_memory(got.memory, want.memory)


@settings(max_examples=12, deadline=None)
@given(
    mem_len=st.integers(0, 9),
    cmem_len=st.integers(0, 5),
    rate=st.integers(1, 4),
    prompt=st.integers(1, 13),
    steps=st.integers(1, 30),
)
def test_decoder_equals_the_model_for_any_memory_geometry(mem_len, cmem_len, rate, prompt, steps):
    cmem_len = cmem_len if mem_len > 0 else 0
    model = tiny_model(mem_len=mem_len, cmem_len=cmem_len, compression_rate=rate, seg_len=prompt)
    tokens = torch.randint(0, 32, (1, prompt + steps))
    with torch.no_grad():
        memory = model(tokens[:, :prompt], memory=model.init_memory(1)).memory
    ours, theirs, mem_ours, mem_theirs = decode_both(model, memory, tokens[:, prompt:])
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    assert_same_memory(mem_ours, mem_theirs)


def test_models_without_a_decoder_are_named_and_generation_falls_back():
    model = tiny_model(input_dim=3, vocab_size=0)
    assert unsupported(model) is not None
    with pytest.raises(ValueError, match="no decoder"):
        Decoder(model, model.init_memory(1))


def test_decoder_refuses_training_mode():
    model = tiny_model().train()
    with pytest.raises(ValueError, match="eval"):
        Decoder(model, model.init_memory(1))


def test_generate_gives_the_same_tokens_with_and_without_the_decoder(monkeypatch):
    model = tiny_model()
    sampling = SamplingConfig(temperature=0.8, top_k=10)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    fast = generate(model, prompt, max_new_tokens=40, sampling=sampling, seed=7, keep_logits=True)
    monkeypatch.setattr(sys.modules["compressive_transformer.inference.generate"], "unsupported", lambda m: "forced")
    slow = generate(model, prompt, max_new_tokens=40, sampling=sampling, seed=7, keep_logits=True)
    assert fast.tokens == slow.tokens
    torch.testing.assert_close(torch.stack(fast.logits), torch.stack(slow.logits), rtol=1e-10, atol=1e-10)


def test_decoder_refuses_to_go_on_after_the_weights_change():
    """Its positional tables, biases and cached keys/values come from the weights it was made with."""
    model = tiny_model()
    decoder = Decoder(model, model(torch.randint(0, 32, (1, 8))).memory)
    decoder.step(torch.tensor([1]))
    with torch.no_grad():
        model.blocks[1].ff[0].bias.add_(0.1)
    with pytest.raises(RuntimeError, match="weights changed while decoding"):
        decoder.step(torch.tensor([2]))


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant", [dict(compression_extra_width=1), dict(cmem_len=0)], ids=["conv,extra_width=1", "txl"]
)
def test_compiled_decoder_matches_the_eager_decoder(variant):
    """Two graphs, for the tokens that evict and those that do not (no recompilation as memory fills or decoding goes
    on), the same
    logits and memory as eager decoding through compression steps and padded rows."""
    import torch._dynamo

    model = tiny_model(**variant).float()
    tokens = torch.randint(0, 32, (2, 70))
    pad = torch.ones(2, 8, dtype=torch.bool)
    pad[1, :3] = False
    with torch.no_grad():
        memory = model(tokens[:, :8], memory=model.init_memory(2), input_mask=pad).memory
    decoders = [Decoder(model, memory), Decoder(model, memory, compile=True)]
    torch._dynamo.utils.counters.clear()
    with torch.no_grad():
        for t in range(8, 70):
            eager, compiled = (d.step(tokens[:, t]) for d in decoders)
            torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert 1 <= graphs <= 2, graphs  # whatever the memory's fill
    mem_eager, mem_compiled = (d.memory() for d in decoders)
    for x, y in zip(mem_eager.layers, mem_compiled.layers):
        assert torch.equal(x.mem_mask, y.mem_mask) and torch.equal(x.cmem_mask, y.cmem_mask) and x.fill == y.fill
        torch.testing.assert_close(y.mem, x.mem, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y.cmem, x.cmem, rtol=1e-5, atol=1e-5)


RINGS = {
    "conv": dict(mem_len=4, cmem_len=3, compression_rate=2),
    "dilated,extra_width": dict(
        mem_len=5, cmem_len=2, compression_rate=3, compression="dilated_conv", compression_extra_width=1
    ),  # fmt: skip
    "txl": dict(mem_len=4, cmem_len=0),
}


@pytest.mark.parametrize("variant", RINGS.values(), ids=RINGS.keys())
def test_the_rings_wrap_and_compress_every_c_tokens_as_the_model_does(variant):
    """Token by token through several wraps of the memory ring (capacity + 1 slots) and of the compressed ring, with
    a padded row: the decoder's memory equals the model's after every token, and a group of c is compressed exactly
    every c tokens once memory is full."""
    model = tiny_model(**variant)
    tokens = torch.randint(0, 32, (2, 48))
    pad = torch.ones(2, 3, dtype=torch.bool)
    pad[1, :2] = False
    with torch.no_grad():
        memory = model(tokens[:, :3], memory=model.init_memory(2), input_mask=pad).memory
        decoder = Decoder(model, memory)
        compressed_at = []
        for t in range(3, 48):
            got = decoder.step(tokens[:, t])
            out = model(tokens[:, t : t + 1], memory=memory)
            if out.memory.layers[0].fill < memory.layers[0].fill + 1 and model.cfg.memory.cmem_len > 0:
                compressed_at.append(t)
            memory = out.memory
            torch.testing.assert_close(got, out.logits[:, 0], rtol=1e-10, atol=1e-10)
            assert_same_memory(decoder.memory(), memory)
    ring = memory.layers[0].capacity + 1
    assert 45 >= 3 * ring  # the memory ring went round at least three times
    c, C = model.cfg.compression.rate, model.cfg.memory.cmem_len
    if C > 0:
        assert len(compressed_at) > 2 * C  # the compressed ring went round twice
        assert set(b - a for a, b in zip(compressed_at, compressed_at[1:])) == {c}  # every c tokens


def test_a_token_copies_nothing_the_size_of_the_memory():
    """The rings are written one slot per token: a token concatenates at most the two positional streams' scores
    (B H K per layer), never keys, values or states (a decoder that concatenated [cmem; mem; x] copied B H K d_h
    keys and as many values in every layer)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Concatenated(TorchDispatchMode):
        elements = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.cat.default:
                self.elements += out.numel()
            return out

    model = tiny_model(mem_len=16, cmem_len=8, compression_rate=2)
    tokens = torch.randint(0, 32, (1, 40))
    with torch.no_grad():
        memory = model(tokens[:, :32], memory=model.init_memory(1)).memory
        decoder = Decoder(model, memory)
        keys = memory.layers[0].cmem_len + memory.layers[0].capacity + 1  # [cmem; mem; the token]
        for t in range(32, 36):  # tokens with and without a compression
            with Concatenated() as seen:
                decoder.step(tokens[:, t])
            assert seen.elements <= model.cfg.n_layers * model.cfg.n_heads * keys, seen.elements


@pytest.mark.slow
def test_later_decoders_of_a_model_reuse_its_compiled_steps():
    """generate makes a decoder per call (a GPU compiles its step by default): the compiled step is one function of
    the model and tensors, so three generations in a row compile its two graphs (a token evicts or it does not) once
    between them."""
    import torch._dynamo

    model = tiny_model().float()
    tokens = torch.randint(0, 32, (1, 40))
    torch._dynamo.utils.counters.clear()
    with torch.no_grad():
        for _ in range(3):
            decoder = Decoder(model, model(tokens[:, :8], memory=model.init_memory(1)).memory, compile=True)
            for t in range(8, 30):
                decoder.step(tokens[:, t])
    assert 1 <= torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2
