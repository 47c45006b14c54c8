"""Model-level equivalences and invariants of the Compressive Transformer / Transformer-XL family."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config, tiny_model
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import reference_logits

from compressive_transformer import CompressiveTransformerLM
from compressive_transformer.core.memory import compressed_for_attention


def stream(model, tokens, seg_sizes, memory=None):
    memory = memory if memory is not None else model.init_memory(tokens.shape[0])
    logits, pos = [], 0
    for T in seg_sizes:
        out = model(tokens[:, pos : pos + T], memory=memory)
        memory, pos = out.memory, pos + T
        logits.append(out.logits)
    return torch.cat(logits, dim=1), memory


VARIANTS = [
    dict(),
    dict(compression="dilated_conv", compression_extra_width=1),
    dict(compression="max_pool", compression_loss="none", cmem_positions="shared"),
    dict(compression="mean_pool", compression_loss="none", norm="pre"),
    dict(compression="conv", compression_loss="autoencoder", compression_rate=3, norm="pre", gating=True),
    dict(cmem_len=0),
    dict(mem_len=0, cmem_len=0),
    dict(compression="conv", compression_loss="bptt", clamp_len=6),
    dict(same_length=True, mem_len=6, attn_impl="math"),
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) or "default")
def test_segment_stream_matches_reference_algorithm(variant):
    model = tiny_model(**variant)
    tokens = torch.randint(0, 32, (1, 40))
    sizes = [8, 3, 1, 1, 5, 8, 2, 7, 5]
    ours, _ = stream(model, tokens, sizes)
    torch.testing.assert_close(ours, reference_logits(model, tokens, sizes), rtol=1e-9, atol=1e-9)


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(1, 7), min_size=1, max_size=8), c=st.integers(1, 3))
def test_any_split_of_a_stream_matches_reference(sizes, c):
    model = tiny_model(compression_rate=c, mem_len=5, cmem_len=3)
    tokens = torch.randint(0, 32, (1, sum(sizes)))
    ours, _ = stream(model, tokens, sizes)
    torch.testing.assert_close(ours, reference_logits(model, tokens, sizes), rtol=1e-9, atol=1e-9)


def test_empty_masked_memory_equals_no_memory():
    model = tiny_model()
    tokens = torch.randint(0, 32, (2, 8))
    with_memory = model(tokens, memory=model.init_memory(2))
    without = model(tokens, memory=model.init_memory(2, mem_len=0, cmem_len=0))
    torch.testing.assert_close(with_memory.logits, without.logits, rtol=1e-12, atol=1e-12)


def test_cmem_len_zero_is_exactly_transformer_xl():
    ct = tiny_model(seed=1)
    txl = CompressiveTransformerLM(tiny_config(cmem_len=0)).double().eval()
    missing, unexpected = txl.load_state_dict(ct.state_dict(), strict=False)
    assert not missing and all(k.startswith("compressors.") or ".cpos" in k or k.endswith(".cv") for k in unexpected)
    tokens = torch.randint(0, 32, (2, 48))
    a, _ = stream(ct, tokens, [8] * 6, memory=ct.init_memory(2, cmem_len=0))
    b, _ = stream(txl, tokens, [8] * 6)
    assert torch.equal(a, b)
    # while nothing has been compressed yet, the Compressive Transformer reads exactly what Transformer-XL reads
    c, _ = stream(ct, tokens[:, :16], [8, 8])
    torch.testing.assert_close(c, b[:, :16], rtol=1e-12, atol=1e-12)


def test_longer_memories_at_evaluation_need_no_new_parameters():
    model = tiny_model()
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    other = CompressiveTransformerLM(tiny_config(mem_len=64, cmem_len=32, seg_len=4)).double()
    assert {k: v.shape for k, v in other.state_dict().items()} == shapes
    tokens = torch.randint(0, 32, (1, 64))
    logits, memory = stream(model, tokens, [16] * 4, memory=model.init_memory(1, mem_len=24, cmem_len=12))
    assert memory.layers[0].mem_len == 24 and memory.layers[0].cmem_mask.all()
    assert torch.isfinite(logits).all()


def test_reset_rows_leave_other_rows_unchanged():
    model = tiny_model()
    tokens = torch.randint(0, 32, (3, 32))
    _, memory = stream(model, tokens[:, :24], [8, 8, 8])
    nxt = tokens[:, 24:]
    plain = model(nxt, memory=memory).logits
    reset = model(nxt, memory=memory.reset(torch.tensor([False, True, False]))).logits
    assert torch.equal(plain[[0, 2]], reset[[0, 2]])
    fresh = model(nxt[1:2], memory=model.init_memory(1)).logits
    torch.testing.assert_close(reset[1:2], fresh, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(plain[1], reset[1])


def test_memory_of_a_layer_is_used_only_by_that_layer():
    model = tiny_model(n_layers=3)
    tokens = torch.randint(0, 32, (1, 32))
    _, memory = stream(model, tokens[:, :24], [8, 8, 8])
    outputs: dict[int, torch.Tensor] = {}
    hooks = [
        b.register_forward_hook(lambda m, i, o, k=k: outputs.__setitem__(k, o.h)) for k, b in enumerate(model.blocks)
    ]
    base = model(tokens[:, 24:], memory=memory)
    before = dict(outputs)
    for j in range(3):
        layers = list(memory.layers)
        layers[j] = type(layers[j])(**{**layers[j].__dict__, "mem": layers[j].mem + 1.0, "cmem": layers[j].cmem - 1.0})
        out = model(tokens[:, 24:], memory=type(memory)(tuple(layers)))
        for i in range(3):
            same = torch.equal(outputs[i], before[i])
            assert same == (i < j), f"perturbing layer {j}'s memory {'changed' if not same else 'left'} layer {i}"
        for i in range(j):
            assert torch.equal(out.memory.layers[i].mem, base.memory.layers[i].mem)
    for h in hooks:
        h.remove()


def _grads(model, loss):
    named = list(model.named_parameters())
    if not loss.requires_grad:  # e.g. no compression loss before anything was evicted
        return {n: None for n, _ in named}
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True, retain_graph=True)
    return {n: g for (n, _), g in zip(named, grads)}


@pytest.mark.parametrize(
    "loss_kind,compression",
    [("attention", "conv"), ("autoencoder", "conv"), ("attention", "dilated_conv"), ("autoencoder", "dilated_conv")],
)
def test_gradients_reach_exactly_the_right_weights(loss_kind, compression):
    model = tiny_model(compression_loss=loss_kind, compression=compression).train()
    comp = {id(p) for p in model.parameters_of("compressor")}
    names = {n for n, p in model.named_parameters() if id(p) in comp}
    assert names and all(n.startswith(("compressors.", "decoders.")) for n in names)
    memory = model.init_memory(2)
    for step in range(6):  # compression starts at the second segment; check every step before and after
        tokens = torch.randint(0, 32, (2, 8))
        out = model(tokens, memory=memory, targets=tokens)
        memory = out.memory
        task = _grads(model, out.loss)
        for n, g in task.items():
            if n in names:
                assert g is None or g.abs().sum() == 0, f"task loss reached compressor weight {n}"
            elif step >= 2 or not n.endswith((".cpos.weight", ".cv")):  # the compressed stream's own position
                # weights only see gradient once compressed memory holds a slot (from the third segment on)
                assert g is not None and g.abs().sum() > 0, f"step {step}: task loss does not train {n}"
        aux = _grads(model, out.aux_loss)
        for n, g in aux.items():
            if n in names:
                assert step == 0 or (g is not None and g.abs().sum() > 0), f"step {step}: aux loss does not train {n}"
            else:
                assert g is None or g.abs().sum() == 0, f"aux loss reached {n}"
        assert all(p.requires_grad for p in model.parameters())  # nothing was detached in place


def test_bptt_trains_the_compressor_through_the_task_loss_within_its_horizon():
    model = tiny_model(compression_loss="bptt", bptt_horizon=2, cmem_len=12).train()
    memory = model.init_memory(1)
    conv_grads = []
    for _ in range(5):
        tokens = torch.randint(0, 32, (1, 8))
        out = model(tokens, memory=memory, targets=tokens)
        memory = out.memory
        g = _grads(model, out.loss)["compressors.0.conv.weight"]
        conv_grads.append(0.0 if g is None else g.abs().sum().item())
        assert out.aux_loss.item() == 0.0
    assert conv_grads[0] == 0.0 and conv_grads[1] == 0.0  # nothing compressed before the second segment ends
    assert all(g > 0 for g in conv_grads[2:])
    # older slots than the horizon are stored detached: only the two youngest segments' slots are recomputed
    layer = memory.layers[0]
    assert layer.young == (4, 4) and layer.n_young == 8 and layer.cmem_mask.all()
    seen = compressed_for_attention(layer, model.compressors[0])
    assert torch.equal(seen[:, :4], layer.cmem[:, :4]) and not layer.cmem.requires_grad
    torch.testing.assert_close(seen[:, 4:], layer.cmem[:, 4:])  # recomputed, same values, now with a graph
    assert seen.requires_grad


def test_padding_never_changes_real_outputs_or_enters_memory():
    model = tiny_model()
    tokens = torch.randint(0, 32, (1, 8))
    mask = torch.tensor([[True] * 5 + [False] * 3])
    a = model(tokens, input_mask=mask)
    other = tokens.clone()
    other[0, 5:] = (other[0, 5:] + 7) % 32
    b = model(other, input_mask=mask)
    torch.testing.assert_close(a.logits[:, :5], b.logits[:, :5], rtol=1e-12, atol=1e-12)
    assert a.memory.layers[0].mem_mask[0, -3:].tolist() == [False] * 3


def test_continuous_inputs_and_hidden_outputs():
    torch.manual_seed(0)
    model = CompressiveTransformerLM(tiny_config(vocab_size=0, input_dim=5, norm="pre", gating=True))
    frames = torch.randn(2, 8, 5)
    out = model(frames)
    assert out.logits is None and out.hidden.shape == (2, 8, 16)
    out2 = model(frames, memory=out.memory)
    assert out2.memory.layers[0].fill == 8 and out2.memory.layers[0].cmem_mask.any()


def test_tied_embeddings_share_one_matrix():
    model = tiny_model(tie_embeddings=True)
    assert model.output.head.weight is model.input.embed.weight


def test_loss_is_mean_cross_entropy_over_real_targets():
    model = tiny_model()
    tokens = torch.randint(0, 32, (2, 8))
    targets = tokens.clone()
    targets[0, :3] = -100
    out = model(tokens, targets=targets)
    keep = targets != -100
    expected = torch.nn.functional.cross_entropy(out.logits[keep], targets[keep])
    torch.testing.assert_close(out.loss, expected)
    none = model(tokens, targets=torch.full_like(tokens, -100))
    assert none.loss.item() == 0.0


def test_most_used_model_runs_with_math_attention_and_needs_weights():
    model = tiny_model(compression="most_used", compression_loss="none")
    _, memory = stream(model, torch.randint(0, 32, (2, 32)), [8] * 4)
    assert memory.layers[0].usage is not None and memory.layers[0].cmem_mask.all()


def test_sdpa_and_math_attention_agree():
    fused = tiny_model(attn_impl="sdpa")
    math_ = tiny_model(attn_impl="math")
    tokens = torch.randint(0, 32, (2, 32))
    a, _ = stream(fused, tokens, [8] * 4)
    b, _ = stream(math_, tokens, [8] * 4)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_wrong_memory_for_the_input_is_a_clear_error():
    model = tiny_model()
    with pytest.raises(ValueError, match="init_memory"):
        model(torch.zeros(2, 8, dtype=torch.long), memory=model.init_memory(3))


def _state_held(module: torch.nn.Module) -> list[str]:
    """Names of whatever a module keeps besides its parameters, buffers and submodules and plain settings: tensors,
    or containers of anything, in its attributes."""
    held = []
    for name, value in vars(module).items():
        if name.startswith("_") and name in ("_parameters", "_buffers", "_modules") or name == "training":
            continue
        if isinstance(value, torch.Tensor) or (isinstance(value, (dict, list, set)) and not name.startswith("_")):
            held.append(f"{type(module).__name__}.{name}")
        if (
            name.startswith("_")
            and isinstance(value, (dict, list, set))
            and name
            not in (
                "_forward_hooks",
                "_forward_pre_hooks",
                "_backward_hooks",
                "_backward_pre_hooks",
                "_state_dict_hooks",
                "_state_dict_pre_hooks",
                "_load_state_dict_pre_hooks",
                "_load_state_dict_post_hooks",
                "_forward_hooks_with_kwargs",
                "_forward_hooks_always_called",
                "_forward_pre_hooks_with_kwargs",
                "_non_persistent_buffers_set",
                "_is_full_backward_hook",
            )
            and value
        ):
            held.append(f"{type(module).__name__}.{name}")
    return held


@pytest.mark.parametrize("variant", [{}, {"compression": "most_used", "compression_loss": "none"}, {"cmem_len": 0}])
def test_modules_hold_parameters_only(variant):
    """After training, evaluation and token-by-token decoding, no module keeps a tensor, a cache or a hook of its
    own: the memory (and a decoder's state) is all outside the model."""
    from compressive_transformer.core.models.decode import Decoder

    model = tiny_model(**variant).train()
    tokens = torch.randint(0, 32, (2, 24))
    out = model(tokens[:, :8], targets=tokens[:, :8])
    (out.loss + out.aux_loss).backward()
    model.eval()
    with torch.no_grad():
        memory = model(tokens[:, 8:16], memory=out.memory.detach()).memory
        decoder = Decoder(model, memory)
        for t in range(16, 24):
            decoder.step(tokens[:, t])
    held = [name for m in model.modules() for name in _state_held(m)]
    assert held == []


def test_aux_loss_is_algorithm_2_on_exactly_the_evicted_memories():
    model = tiny_model(n_layers=2)  # n_s = n_m = 8, c = 2: each segment evicts the whole previous memory
    tokens = torch.randint(0, 32, (2, 24))
    _, memory = stream(model, tokens[:, :16], [8, 8])
    inputs: dict[int, torch.Tensor] = {}
    hooks = [
        b.register_forward_hook(lambda m, i, o, k=k: inputs.__setitem__(k, o.attn_in))
        for k, b in enumerate(model.blocks)
    ]
    out = model(tokens[:, 16:], memory=memory)
    for h in hooks:
        h.remove()
    for i, block in enumerate(model.blocks):
        old = memory.layers[i].mem[:, -8:]  # the 8 states that leave memory, oldest first
        new = model.compressors[i](old.view(2, 4, 2, -1), None)
        wq, wk, wv = block.attn.qkv.weight.chunk(3, dim=0)
        H, dh = model.cfg.n_heads, model.cfg.head_dim

        def attn(m):
            q = (inputs[i] @ wq.t()).view(2, 8, H, dh).transpose(1, 2)
            k = (m @ wk.t()).view(2, -1, H, dh).transpose(1, 2)
            v = (m @ wv.t()).view(2, -1, H, dh).transpose(1, 2)
            return (torch.softmax(q @ k.transpose(-1, -2) / dh**0.5, -1) @ v).transpose(1, 2).reshape(2, 8, -1)

        expected = ((attn(old) - attn(new)) ** 2).mean()
        torch.testing.assert_close(out.aux_losses[i], expected.detach(), rtol=1e-10, atol=1e-12)


def test_compression_losses_are_skipped_without_gradients_unless_asked():
    model = tiny_model()
    tokens = torch.randint(0, 32, (2, 24))
    _, memory = stream(model, tokens[:, :16], [8, 8])
    with torch.no_grad():
        skipped = model(tokens[:, 16:], memory=memory)
        asked = model(tokens[:, 16:], memory=memory, compression_loss=True)
    with_grad = model(tokens[:, 16:], memory=memory)
    assert skipped.aux_losses.abs().sum() == 0
    assert (asked.aux_losses > 0).all()
    torch.testing.assert_close(asked.aux_losses, with_grad.aux_losses)
    torch.testing.assert_close(skipped.logits, with_grad.logits)


# --------------------------------------------------------------------------------------------------------------
# Positional parameters shared across layers (Transformer-XL's default shares u/v).


def _positional(model):
    return {
        n: p
        for n, p in model.named_parameters()
        if n.split(".")[-1] in ("u", "v", "cv") or ".pos." in n or ".cpos." in n
    }


def test_positions_are_per_layer_by_default():
    assert tiny_model().cfg.positions.share == "none"
    names = _positional(tiny_model())
    assert {n for n in names if n.startswith("blocks.1.")}  # layer 1 owns its own u/v and W_r


@pytest.mark.parametrize("mode,shared", [("biases", ("u", "v", "cv")), ("all", ("u", "v", "cv", "pos", "cpos"))])
def test_shared_positions_are_one_parameter_for_all_layers(mode, shared):
    base, model = tiny_model(), tiny_model(share_positions=mode)
    H, dh, d = model.cfg.n_heads, model.cfg.head_dim, model.cfg.d_model
    per_layer = 3 * H * dh + (2 * H * dh * d if mode == "all" else 0)  # u, v, cv (+ pos, cpos) of one layer
    n_params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n_params(base) - n_params(model) == (model.cfg.n_layers - 1) * per_layer
    a0, a1 = model.blocks[0].attn, model.blocks[1].attn
    for name in shared:
        assert getattr(a0, name) is getattr(a1, name)
    if mode == "biases":
        assert a0.pos is not a1.pos
    model.train()
    tokens = torch.randint(0, 32, (2, 8))
    memory = model.init_memory(2)
    for _ in range(3):  # the compressed stream's parameters see gradient once a compressed slot exists
        out = model(tokens, memory=memory, targets=tokens)
        memory = out.memory.detach()
    out.loss.backward()
    for name in shared:
        p = getattr(a0, name)
        p = p.weight if isinstance(p, torch.nn.Linear) else p
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_shared_positions_survive_a_checkpoint(tmp_path):
    import safetensors.torch

    model = tiny_model(share_positions="all")
    safetensors.torch.save_model(model, str(tmp_path / "m.safetensors"))
    back = tiny_model(share_positions="all")
    safetensors.torch.load_model(back, str(tmp_path / "m.safetensors"))
    assert back.blocks[0].attn.u is back.blocks[1].attn.u
    torch.testing.assert_close(back.blocks[1].attn.pos.weight, model.blocks[1].attn.pos.weight)
