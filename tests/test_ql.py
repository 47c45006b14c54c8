"""Transformer-QL: causality across segments and scales, streaming, memory geometry, droppath, context length."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config

from compressive_transformer import ConfigError, TransformerQL, build_model, context_length_from_config
from compressive_transformer.core.models.ql import Scale, ql_scales


def ql_config(**overrides):
    base = dict(
        scales=(1, 1, 1),
        output_layers=1,
        n_layers=4,
        cmem_len=0,
        compression="max_pool",
        compression_loss="none",
        seg_len=4,
        mem_len=4,
        compression_rate=2,
    )
    base.update(overrides)
    return tiny_config(**base)


def ql_model(seed=0, **overrides) -> TransformerQL:
    torch.manual_seed(seed)
    model = build_model(ql_config(**overrides)).double().eval()
    for p in model.parameters():  # larger weights so every dependency shows in the logits
        torch.nn.init.normal_(p, 0.0, 0.3)
    return model


def run(model, tokens, sizes):
    memory, logits, pos = model.init_memory(tokens.shape[0]), [], 0
    for T in sizes:
        out = model(tokens[:, pos : pos + T], memory=memory)
        memory, pos = out.memory, pos + T
        logits.append(out.logits)
    return torch.cat(logits, dim=1)


SHAPES = [
    dict(),
    dict(compression="mean_pool", mem_len=0),
    dict(scales=(2, 1), output_layers=0, n_layers=3, compression_rate=3, seg_len=6, mem_len=3, norm="pre"),
    dict(scales=(1, 2), output_layers=2, n_layers=5, seg_len=8, mem_len=8, compression_rate=4),
]


@pytest.mark.parametrize("shape", SHAPES, ids=range(len(SHAPES)))
def test_no_output_depends_on_a_future_token(shape):
    model = ql_model(**shape)
    S = model.cfg.seg_len
    tokens = torch.randint(0, 32, (1, 5 * S))
    base = run(model, tokens, [S] * 5)
    for q in range(0, 5 * S, max(1, S // 2)):
        other = tokens.clone()
        other[0, q] = (other[0, q] + 1) % 32
        changed = run(model, other, [S] * 5)
        assert torch.equal(changed[:, :q], base[:, :q]), f"position < {q} saw token {q}"
        assert not torch.equal(changed[:, q], base[:, q])


@pytest.mark.parametrize("shape", SHAPES[:2], ids=range(2))
def test_token_by_token_equals_whole_segments(shape):
    model = ql_model(**shape)
    tokens = torch.randint(0, 32, (2, 20))
    whole = run(model, tokens, [4] * 5)
    torch.testing.assert_close(run(model, tokens, [1] * 20), whole, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(run(model, tokens, [3, 6, 1, 7, 3]), whole, rtol=1e-10, atol=1e-10)


def test_memory_geometry_per_scale():
    assert ql_scales(seg_len=4, mem_len=4, compression_rate=2, n_scales=3) == [
        Scale(seg=4, mem=4, shift=4, span=1),
        Scale(seg=4, mem=4, shift=2, span=2),
        Scale(seg=4, mem=4, shift=1, span=4),
    ]
    # the window n_s + n_m is the same at every scale
    for s in ql_scales(seg_len=16, mem_len=48, compression_rate=2, n_scales=4):
        assert s.seg + s.mem == 64
    model = ql_model(scales=(2, 1), output_layers=1, n_layers=4, seg_len=8, mem_len=0)
    memory = model.init_memory(3)
    caps = [layer.capacity for layer in memory.layers]
    assert caps == [0, 0, 4, 0] + [0, 4] + [8]  # blocks (scale 0, 0, 1, output), scale outputs, pending segment
    out = model(torch.randint(0, 32, (3, 8)), memory=memory)
    assert [layer.fill for layer in out.memory.layers] == [0, 0, 4, 0, 0, 4, 0]


def test_droppath_only_in_training_and_keeps_coarse_scales():
    model = ql_model(droppath=0.5, compression="mean_pool")
    seq = [torch.full((8, 1, 2), float(i), dtype=torch.float64).expand(8, 6, 2).clone() for i in range(3)]
    windows = [(s, torch.ones(8, 6, dtype=torch.bool)) for s in seq]
    scales = model.geometry()
    mask = torch.ones(8, 4, dtype=torch.bool)
    assert torch.allclose(model._accumulate(windows, scales, mask), torch.full((8, 4, 2), 1.0, dtype=torch.float64))
    model.train()
    torch.manual_seed(0)
    seen = set()
    for _ in range(50):
        out = model._accumulate(windows, scales, mask)[:, 0, 0].tolist()
        seen.update(round(v, 6) for v in out)
    # no drop -> mean(0,1,2) = 1; drop scale 0 -> mean(1,2) = 1.5; drop scales 0,1 -> 2; the coarsest always stays
    assert seen == {1.0, 1.5, 2.0}


def test_accumulation_reads_only_states_that_end_before_the_position():
    model = ql_model()
    scales = model.geometry()
    # each scale's [memory; segment] holds its state index, so the picked index is visible
    windows = [(torch.arange(8, dtype=torch.float64).view(1, 8, 1).expand(1, 8, 1), torch.ones(1, 8, dtype=torch.bool))]
    idx = model._accumulate(windows * 3, scales, torch.ones(1, 4, dtype=torch.bool))
    # scale 0: p -> 4 + p; scale 1 (2 tokens/state): the state ending at or before p; scale 2 (4 tokens/state)
    expected = [(4 + p + (7 - (3 - p + 1) // 2) + (7 - (3 - p + 3) // 4)) / 3 for p in range(4)]
    assert idx[0, :, 0].tolist() == pytest.approx(expected)


def farthest_dependency(model, position_in_segment: int, n_segments: int = 16) -> int:
    """How far back a perturbed input still changes the output at one position of the last segment (every
    perturbation is one batch row of a single streamed run)."""
    S = model.cfg.seg_len
    target = (n_segments - 1) * S + position_in_segment
    tokens = torch.randint(0, 32, (1, n_segments * S)).repeat(target + 1, 1)  # row d perturbs position target - d
    d = torch.arange(1, target + 1)
    tokens[d, target - d] = (tokens[d, target - d] + 1) % 32
    out = run(model, tokens, [S] * n_segments)[:, target]
    changed = [int(k) for k in d if not torch.equal(out[k], out[0])]
    return max(changed, default=0)


def test_measured_dependency_range_agrees_with_appendix_b():
    model = ql_model(compression="mean_pool")  # the paper's Figure 5 shape: n_s = n_m = 4, c = 2, scales 1/1/1 + 1
    ctx = context_length_from_config(model.cfg)
    assert (ctx.min, ctx.max) == (44, 48)
    assert farthest_dependency(model, 0) == ctx.min
    assert farthest_dependency(model, 3) == ctx.max - 1  # the newest output also counts its own token


def test_bad_transformer_ql_configs():
    for kwargs, key in [
        (dict(n_layers=5), "model.n_layers"),
        (dict(cmem_len=4), "model.memory.cmem_len"),
        (dict(compression="conv", compression_loss="attention"), "model.compression"),
        (dict(seg_len=6, mem_len=2), "model.seg_len"),
        (dict(mem_len=3), "model.memory.mem_len"),
        (dict(droppath=1.0), "model.ql.droppath"),
    ]:
        with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.")):
            ql_config(**kwargs)
    with pytest.raises(ConfigError, match=r"^model\.ql\.scales"):  # a Transformer-QL option without its scales
        tiny_config(droppath=0.2)
    model = ql_model()
    with pytest.raises(ValueError, match="compressed memory"):
        model.init_memory(1, cmem_len=4)


def test_trains_across_segments_with_every_weight_reached():
    model = ql_model(droppath=0.3).train()
    memory = model.init_memory(2)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    for T in (4, 4, 3, 5, 4):  # whole and partial segments
        tokens = torch.randint(0, 32, (2, T))
        out = model(tokens, memory=memory, targets=tokens)
        opt.zero_grad()
        out.loss.backward()
        memory = out.memory
        assert not any(t.requires_grad for layer in memory.layers for t in (layer.mem, layer.cmem))
    opt.step()
    assert all(p.grad is not None for p in model.parameters())


def test_context_length_takes_a_config_of_any_of_the_three_models():
    from compressive_transformer import context_length

    assert context_length(ql_config()) == context_length_from_config(ql_config())
    txl = tiny_config(cmem_len=0, n_layers=4, seg_len=4, mem_len=4)
    assert (context_length(txl).min, context_length(txl).max) == (16, 20)
    ct = tiny_config(n_layers=2, seg_len=4, mem_len=4, cmem_len=4, compression_rate=2)
    assert context_length(ct).min == 2 * (4 + 2 * 4)
