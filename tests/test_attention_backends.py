"""Every attention backend computes what the explicit path computes (fp32 rounding), for Transformer-XL, the
Compressive Transformer and Transformer-QL with memory across segments, training (outputs and every gradient) and
inference (the decoder included); ``auto`` and the fallbacks pick what they say."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import tiny_config
from test_decode import decode_both

from compressive_transformer import build_model
from compressive_transformer.core.attention_backends import AUTO, BACKENDS, auto_choice, choose_backend

VARIANTS = {
    "txl": dict(cmem_len=0),
    "ct": dict(),
    "ct-shared-positions": dict(compression="mean_pool", compression_loss="none", cmem_positions="shared"),
    "ct-same-length-clamp": dict(same_length=True, mem_len=6, clamp_len=5, compression_loss="autoencoder"),
    "ql": dict(scales=(1, 1), output_layers=1, n_layers=3, cmem_len=0, compression="max_pool", compression_loss="none"),
}
CPU_INFERENCE = ["sdpa-bias", "flex"]
CPU_TRAINING = ["sdpa-bias"]  # flex has no CPU backward


@pytest.fixture(autouse=True)
def eager_flex(monkeypatch):
    """flex_attention unfused (eager): the same score_mod and block mask without a compile per shape on CPU; the
    compiled kernel is pinned against it in test_compiled_flex_matches_eager_flex."""
    import torch.nn.attention.flex_attention as fa

    import compressive_transformer.core.attention_backends as ab

    if not torch.cuda.is_available():
        monkeypatch.setattr(ab, "flex_kernel", lambda: fa.flex_attention)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        yield


def build(variant: str, impl: str, device="cpu"):
    torch.manual_seed(0)
    model = build_model(tiny_config(attn_impl=impl, **VARIANTS[variant])).to(device)
    for p in model.parameters():  # u, v start at zero: give every term of the scores a visible size
        torch.nn.init.normal_(p, 0.0, 0.2)
    return model


def segments(model, tokens, *, grad: bool, sizes=(8, 8, 8)):
    """Per segment: logits and loss (and, trained, every parameter's gradient), memory carried from empty."""
    memory, pos, out_ = model.init_memory(tokens.shape[0], device=tokens.device), 0, []
    mask = torch.ones(tokens.shape, dtype=torch.bool, device=tokens.device)
    mask[1, :3] = False  # padding: invalid memory slots in the second row
    for T in sizes:
        x, m = tokens[:, pos : pos + T], mask[:, pos : pos + T]
        pos += T
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(grad):
            out = model(x, memory=memory, targets=x, input_mask=m)
            if grad:
                (out.loss + out.aux_loss).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None} if grad else {}
        out_.append((out.logits.detach(), out.loss.detach(), grads))
        memory = out.memory
    return out_


def assert_same(a, b):
    for (la, sa, ga), (lb, sb, gb) in zip(a, b):
        torch.testing.assert_close(la, lb, rtol=1e-4, atol=2e-5)
        torch.testing.assert_close(sa, sb, rtol=1e-5, atol=1e-6)
        assert ga.keys() == gb.keys()
        for name in ga:
            torch.testing.assert_close(ga[name], gb[name], rtol=1e-4, atol=2e-5, msg=name)


def tokens_for(device="cpu"):
    torch.manual_seed(1)
    return torch.randint(0, 32, (2, 24), device=device)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", CPU_INFERENCE)
def test_inference_equals_the_explicit_path(variant, backend):
    ref = segments(build(variant, "explicit").eval(), tokens_for(), grad=False, sizes=(8, 8, 3, 5))
    assert_same(segments(build(variant, backend).eval(), tokens_for(), grad=False, sizes=(8, 8, 3, 5)), ref)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", CPU_TRAINING)
def test_training_outputs_and_gradients_equal_the_explicit_path(variant, backend):
    ref = segments(build(variant, "explicit").train(), tokens_for(), grad=True)
    assert_same(segments(build(variant, backend).train(), tokens_for(), grad=True), ref)


@pytest.mark.parametrize("backend", ["explicit", *CPU_INFERENCE])
def test_decoder_equals_the_model_with_each_backend(backend):
    model = build("ct", backend).eval()
    tokens = tokens_for()
    with torch.no_grad():
        memory = model(tokens[:, :8], memory=model.init_memory(2)).memory
    ours, theirs, _, _ = decode_both(model, memory, tokens[:, 8:20])
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=2e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex attention trains on CUDA only")
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", ["sdpa-bias", "flex"])
def test_cuda_training_equals_the_explicit_path(variant, backend):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ref = segments(build(variant, "explicit", "cuda").train(), tokens_for("cuda"), grad=True)
    assert_same(segments(build(variant, backend, "cuda").train(), tokens_for("cuda"), grad=True), ref)


def test_flex_trains_on_cpu_through_sdpa_bias_and_says_so():
    a = segments(build("ct", "flex").train(), tokens_for(), grad=True, sizes=(8,))
    b = segments(build("ct", "sdpa-bias").train(), tokens_for(), grad=True, sizes=(8,))
    assert_same(a, b)
    choose_backend.__globals__["_say_once"].cache_clear()
    with pytest.warns(UserWarning, match="'flex' cannot train on CPU"):
        assert (
            choose_backend(
                "flex", device=torch.device("cpu"), grad=True, dtype=torch.float32, need_weights=False, dropout=0.0
            )
            == "sdpa-bias"
        )


def test_fallbacks_and_the_auto_table():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    pick = lambda impl, **kw: choose_backend(  # noqa: E731
        impl, **{**dict(device=cuda, grad=True, dtype=torch.float32, need_weights=False, dropout=0.0), **kw}
    )
    assert {pick(impl, need_weights=True) for impl in ("auto", *BACKENDS)} == {"explicit"}  # the weights' path
    assert pick("math") == "explicit" and pick("sdpa") == "sdpa-bias"  # earlier names
    assert pick("flex") == "flex" and pick("flex", grad=False, device=cpu) == "flex"
    with pytest.warns(UserWarning, match="no attention dropout"):
        assert pick("flex", dropout=0.1) == "sdpa-bias"
    for (device, phase, dtype), (backend, reason) in AUTO.items():
        assert backend in BACKENDS and reason
        assert not (backend == "flex" and device == "cpu" and phase == "train")
        assert (
            pick(
                "auto",
                device=torch.device(device),
                grad=phase == "train",
                dtype=getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[dtype]),
            )
            == backend
        )
    assert auto_choice(torch.device("mps"), True, torch.float32)[0] in BACKENDS


def test_most_used_compression_keeps_the_weights_path():
    from compressive_transformer import ConfigError

    cfg = dict(compression="most_used", compression_loss="none")
    with pytest.raises(ConfigError, match="model.attn_impl"):
        tiny_config(attn_impl="sdpa-bias", **cfg)
    torch.manual_seed(0)
    m = build_model(tiny_config(attn_impl="auto", **cfg)).eval()
    with torch.no_grad():
        out = m(tokens_for()[:, :8], memory=m.init_memory(2))
    assert all(layer.usage is not None for layer in out.memory.layers)


@pytest.mark.slow
def test_compiled_flex_matches_eager_flex(monkeypatch):
    """The compiled CPU kernel (what a run uses) against the eager reference the other tests use."""
    import compressive_transformer.core.attention_backends as ab

    monkeypatch.undo()
    if torch.cuda.is_available():
        pytest.skip("the CUDA tests above use the compiled kernel")
    model = build("ct", "flex").eval()
    ref = segments(build("ct", "explicit").eval(), tokens_for(), grad=False, sizes=(8, 8))
    assert ab.flex_kernel() is not None
    assert_same(segments(model, tokens_for(), grad=False, sizes=(8, 8)), ref)
