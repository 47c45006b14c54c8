"""Adaptive input and softmax: equal to dense references built from the same weights, normalised, the training loss
equal to the log-probabilities, bf16 autocast, every parameter reached, and each model kind, config and export."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from conftest import with_keys
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer.core.config import AdaptiveConfig, ConfigError, ModelConfig, RunConfig
from compressive_transformer.core.constants import IGNORE_INDEX
from compressive_transformer.core.models import build_model
from compressive_transformer.core.models.adaptive import AdaptiveInput, AdaptiveLogSoftmax
from compressive_transformer.runs.toml_writer import config_text

V = 50


def cfg_of(**adaptive) -> ModelConfig:
    return ModelConfig.from_raw(dict(
        vocab_size=V, d_model=16, n_layers=2, n_heads=2, d_ff=32, seg_len=6, mem_len=6, cmem_len=0, dropout=0.0,
        adaptive=AdaptiveConfig(**adaptive),
    ))  # fmt: skip


def heads(cfg: ModelConfig, seed: int = 0) -> tuple[AdaptiveInput, AdaptiveLogSoftmax]:
    torch.manual_seed(seed)
    emb = AdaptiveInput(cfg)
    out = AdaptiveLogSoftmax(cfg, emb)
    with torch.no_grad():
        for p in out.parameters():
            p.normal_(0, 0.5)
    return emb, out


def naive_log_probs(out: AdaptiveLogSoftmax, h: torch.Tensor) -> torch.Tensor:
    """One word at a time: log p(cluster of w) + log p(w | cluster), each from the cluster's dense matrix."""
    bounds = out.bounds
    rows = []
    for x in h:
        full, head = [], None
        for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            w = out.layers[0].weight[lo:hi] if out.div_val == 1 else out.layers[i].weight
            b = out.layers[0].bias[lo:hi] if out.div_val == 1 else out.layers[i].bias
            if i == 0:
                w = torch.cat([w, out.cluster_weight]) if out.n_clusters else w
                b = torch.cat([b, out.cluster_bias]) if out.n_clusters else b
            dense = w @ out.projs[i].T if out.projs is not None else w  # (size, d): the cluster as one dense layer
            logits = dense @ x + b
            lp = logits - torch.logsumexp(logits, 0)
            full.append(lp[: hi - lo] + (head[bounds[1] + i - 1] if i > 0 else 0.0))
            if i == 0:
                head = lp
        rows.append(torch.cat(full))
    return torch.stack(rows)


@pytest.mark.parametrize(
    "adaptive",
    [
        dict(cutoffs=()),
        dict(cutoffs=(), d_embed=8),
        dict(cutoffs=(10, 30)),
        dict(cutoffs=(10, 30), d_embed=12),
        dict(cutoffs=(10, 30), div_val=2),
        dict(cutoffs=(5, 20, 40), div_val=2, tie_projs=(False, True, True, True)),
    ],
)
def test_log_probs_equal_a_dense_reference(adaptive):
    cfg = cfg_of(**adaptive)
    _, out = heads(cfg)
    h = torch.randn(7, 16, dtype=torch.float64)
    out = out.double()
    lp = out.log_probs(h)
    assert lp.shape == (7, V)
    torch.testing.assert_close(lp, naive_log_probs(out, h), rtol=0, atol=1e-10)
    torch.testing.assert_close(lp.logsumexp(-1), torch.zeros(7, dtype=torch.float64), rtol=0, atol=1e-10)


def test_matches_torch_adaptive_log_softmax():
    """torch.nn.AdaptiveLogSoftmaxWithLoss (head bias, tails without bias) as an independent implementation."""
    cfg = cfg_of(cutoffs=(10, 30), div_val=2)
    _, out = heads(cfg)
    with torch.no_grad():
        for layer in out.layers[1:]:
            layer.bias.zero_()
    ref = torch.nn.AdaptiveLogSoftmaxWithLoss(16, V, [10, 30], div_value=2.0, head_bias=True)
    with torch.no_grad():
        # torch's head maps d -> shortlist + clusters directly; ours projects first: the product is the same map.
        ref.head.weight.copy_(torch.cat([out.layers[0].weight, out.cluster_weight]) @ out.projs[0].T)
        ref.head.bias.copy_(torch.cat([out.layers[0].bias, out.cluster_bias]))
        for i, tail in enumerate(ref.tail, start=1):
            tail[0].weight.copy_(out.projs[i].T)
            tail[1].weight.copy_(out.layers[i].weight)
    h = torch.randn(9, 16)
    torch.testing.assert_close(out.log_probs(h), ref.log_prob(h), rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(
    targets=st.lists(st.integers(min_value=-1, max_value=V - 1), min_size=1, max_size=12),
    div_val=st.sampled_from([1, 2]),
)
def test_loss_is_the_log_probability_of_each_target(targets, div_val):
    cfg = cfg_of(cutoffs=(10, 30), div_val=div_val)
    _, out = heads(cfg)
    t = torch.tensor([x if x >= 0 else -100 for x in targets])
    h = torch.randn(len(targets), 16)
    nll = out.nll(h, t)
    lp = out.log_probs(h)
    valid = t != -100
    expected = torch.where(valid, -lp.gather(1, t.clamp(min=0)[:, None]).squeeze(1), 0.0)
    torch.testing.assert_close(nll, expected, rtol=1e-5, atol=1e-5)


def test_embedding_equals_dense_lookup_scaled():
    cfg = cfg_of(cutoffs=(10, 30), div_val=2)
    emb, _ = heads(cfg)
    ids = torch.arange(V).view(5, 10)
    got = emb(ids)
    for i, (lo, hi) in enumerate(zip(emb.bounds, emb.bounds[1:])):
        dense = emb.layers[i].weight @ emb.projs[i].T  # (hi - lo, d)
        torch.testing.assert_close(got.view(V, -1)[lo:hi], dense * 4.0)  # sqrt(d_model = 16)


def test_ties_share_parameters():
    cfg = dataclasses.replace(cfg_of(cutoffs=(10, 30), div_val=2, tie_projs=(False, True, True)), tie_embeddings=True)
    emb, out = heads(cfg)
    assert all(a.weight is b.weight for a, b in zip(out.layers, emb.layers))
    assert out.projs[0] is not emb.projs[0] and out.projs[1] is emb.projs[1] and out.projs[2] is emb.projs[2]


def test_training_reaches_every_parameter_even_with_an_empty_cluster():
    """DDP needs a gradient for every parameter on every step: a batch with no target in a tail cluster too."""
    model = build_model(cfg_of(cutoffs=(10, 30), div_val=2))
    tokens = torch.randint(0, 10, (2, 6))  # every input and target in the head cluster
    out = model(tokens, targets=tokens)
    assert out.logits is None  # training computes only the loss
    out.loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []


@pytest.mark.parametrize("kind", ["xl", "ct", "ql"])
def test_every_model_kind_evaluates_with_log_probs(kind):
    base = cfg_of(cutoffs=(10, 30), div_val=2)
    extra = {"xl": {}, "ct": dict(cmem_len=4, compression_rate=2), "ql": {}}[kind]
    if kind == "ql":
        extra = dict(scales=(1, 1), n_layers=2, compression="mean_pool", compression_loss="none", compression_rate=2)
    model = build_model(with_keys(base, **extra)).eval()
    tokens = torch.randint(0, V, (2, 6))
    with torch.no_grad():
        out = model(tokens, targets=tokens)
    assert out.logits.shape == (2, 6, V) and out.logits.dtype == torch.float32
    torch.testing.assert_close(out.logits.logsumexp(-1), torch.zeros(2, 6), atol=1e-5, rtol=0)
    ref = F.cross_entropy(out.logits.flatten(0, 1), tokens.flatten())
    torch.testing.assert_close(out.loss, ref, atol=1e-5, rtol=1e-5)


def test_bf16_autocast_normalises_in_fp32():
    cfg = cfg_of(cutoffs=(10, 30), div_val=2)
    _, out = heads(cfg)
    h = torch.randn(8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp = out.log_probs(h)
        nll = out.nll(h, torch.arange(8) * 6)
    assert lp.dtype == torch.float32 and nll.dtype == torch.float32
    torch.testing.assert_close(lp.logsumexp(-1), torch.zeros(8), atol=1e-5, rtol=0)  # exact normalisation
    torch.testing.assert_close(lp, out.log_probs(h), atol=0.15, rtol=0.02)  # bf16 matmuls: close to fp32


def test_config_round_trips_through_toml_and_rejects_mistakes():
    cfg = RunConfig(model=dataclasses.replace(cfg_of(cutoffs=(10, 30), div_val=2, tie_projs=(False, True, True))))
    from compressive_transformer.runs.rundir import config_from_text

    assert config_from_text(config_text(cfg)).model == cfg.model
    with pytest.raises(ConfigError, match="model.adaptive.cutoffs"):
        AdaptiveConfig(cutoffs=(30, 10))
    with pytest.raises(ConfigError, match="tie_projs"):
        AdaptiveConfig(cutoffs=(10,), tie_projs=(True,))
    with pytest.raises(ConfigError, match="no projection to tie"):
        cfg_of(cutoffs=(10,), tie_projs=(False, True))
    with pytest.raises(ConfigError, match="below vocab_size"):
        build_model(cfg_of(cutoffs=(10, 60)))
    with pytest.raises(ConfigError, match="model.adaptive.unknown"):
        RunConfig.from_raw({"model": {"adaptive": {"unknown": 1}}})


def test_export_and_from_pretrained_keep_the_adaptive_model(tmp_path):
    import safetensors.torch

    model = build_model(dataclasses.replace(cfg_of(cutoffs=(10, 30), div_val=2), tie_embeddings=True)).eval()
    safetensors.torch.save_model(model, str(tmp_path / "m.safetensors"))
    again = build_model(model.cfg).eval()
    safetensors.torch.load_model(again, str(tmp_path / "m.safetensors"))
    tokens = torch.randint(0, V, (1, 6))
    with torch.no_grad():
        torch.testing.assert_close(again(tokens).logits, model(tokens).logits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_whole_model_under_autocast_with_div_val_above_one(dtype):
    """Mixed clusters in one batch under 16-bit autocast (Transformer-XL's own embedding fails here with
    div_val != 1: an fp16 result copied into an fp32 buffer)."""
    model = build_model(cfg_of(cutoffs=(10, 30), div_val=2))
    tokens = torch.arange(12).view(2, 6) * 4  # ids from every cluster
    with torch.autocast("cpu", dtype=dtype):
        out = model(tokens, targets=tokens)
        out.loss.backward()
        model.eval()
        with torch.no_grad():
            logp = model(tokens).logits
    assert out.loss.dtype == torch.float32 and logp.dtype == torch.float32
    torch.testing.assert_close(logp.logsumexp(-1), torch.zeros(2, 6), atol=1e-5, rtol=0)


@pytest.mark.parametrize("adaptive", [dict(cutoffs=(10, 30)), dict(cutoffs=(5, 20, 40), div_val=2)])
def test_the_static_shape_loss_equals_the_data_dependent_one(adaptive):
    """What a traced or captured step computes (every row scored by every cluster) is the eager loss, gradients too."""
    _, out = heads(cfg_of(**adaptive))
    h = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    out = out.double()
    targets = torch.randint(0, V, (40,))
    targets[::7] = IGNORE_INDEX
    eager, static = out.nll(h, targets), out._nll_static(h, targets)
    torch.testing.assert_close(static, eager, rtol=1e-12, atol=1e-12)
    g_eager = torch.autograd.grad(eager.sum(), [h, *out.parameters()], allow_unused=True)
    g_static = torch.autograd.grad(static.sum(), [h, *out.parameters()], allow_unused=True)
    for a, b in zip(g_eager, g_static):
        if a is not None or b is not None:
            torch.testing.assert_close(b if b is not None else torch.zeros_like(a), a if a is not None else 0 * b)
