"""Every attention kernel against the reference at the model level: outputs, losses, gradients and memories over
segments that fill, compress and pad, for every model kind; the decoder with each; the choice and its fallbacks."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config
from test_decode import decode_both

from compressive_transformer import build_model
from compressive_transformer.core import kernels
from compressive_transformer.core.kernels import KERNELS, auto_choice, choose_kernel, triton_available

VARIANTS = {
    "txl": dict(cmem_len=0),
    "ct": dict(),
    "ct-shared-positions": dict(compression="mean_pool", compression_loss="none", cmem_positions="shared"),
    "ct-same-length-clamp": dict(same_length=True, mem_len=6, clamp_len=5, compression_loss="autoencoder"),
    "ql": dict(scales=(1, 1), output_layers=1, n_layers=3, cmem_len=0, compression="max_pool", compression_loss="none"),
}
CPU_KERNELS = ["explicit", "sdpa-bias"]


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
@pytest.mark.parametrize("backend", CPU_KERNELS)
def test_inference_equals_the_reference(variant, backend):
    ref = segments(build(variant, "reference").eval(), tokens_for(), grad=False, sizes=(8, 8, 3, 5))
    assert_same(segments(build(variant, backend).eval(), tokens_for(), grad=False, sizes=(8, 8, 3, 5)), ref)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", CPU_KERNELS)
def test_training_outputs_and_gradients_equal_the_reference(variant, backend):
    ref = segments(build(variant, "reference").train(), tokens_for(), grad=True)
    assert_same(segments(build(variant, backend).train(), tokens_for(), grad=True), ref)


@pytest.mark.parametrize("backend", ["reference", *CPU_KERNELS])
def test_decoder_equals_the_model_with_each_backend(backend):
    model = build("ct", backend).eval()
    tokens = tokens_for()
    with torch.no_grad():
        memory = model(tokens[:, :8], memory=model.init_memory(2)).memory
    ours, theirs, _, _ = decode_both(model, memory, tokens[:, 8:20])
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=2e-5)


@pytest.fixture
def interpreter():
    """The fused kernel on CPU tensors (it runs them through Triton's interpreter itself)."""
    if not triton_available():
        pytest.skip("needs triton (the [triton] extra)")


@pytest.mark.filterwarnings("ignore:attn_impl 'fused' on the CPU")
@pytest.mark.parametrize("variant", ["txl", "ct", "ct-same-length-clamp"])
def test_the_fused_kernel_trains_as_the_reference_through_the_interpreter(variant, interpreter):
    ref = segments(build(variant, "reference").train(), tokens_for(), grad=True, sizes=(8, 8))
    assert_same(segments(build(variant, "fused").train(), tokens_for(), grad=True, sizes=(8, 8)), ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("backend", ["explicit", "sdpa-bias", "fused"])
def test_cuda_training_equals_the_reference(variant, backend):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ref = segments(build(variant, "reference", "cuda").train(), tokens_for("cuda"), grad=True)
    assert_same(segments(build(variant, backend, "cuda").train(), tokens_for("cuda"), grad=True), ref)


def test_fallbacks_and_the_auto_choice(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    pick = lambda impl, **kw: choose_kernel(  # noqa: E731
        impl, **{**dict(device=cuda, need_weights=False, dropout=0.0), **kw}
    )
    assert {pick(impl, need_weights=True) for impl in ("auto", *KERNELS)} <= {"explicit", "reference"}  # weights
    assert pick("math") == "explicit" and pick("sdpa") == "sdpa-bias"  # earlier names
    with pytest.warns(UserWarning, match="no attention dropout"):
        assert pick("fused", dropout=0.1) == "sdpa-bias"
    assert auto_choice(cpu, compiling=False)[0] == "explicit" and auto_choice(cpu, compiling=True)[0] == "reference"
    monkeypatch.setattr("compressive_transformer.core.kernels.triton_available", lambda: True)
    assert auto_choice(cuda, compiling=False, dtype=torch.bfloat16)[0] == "fused"
    assert auto_choice(cuda, compiling=False, dtype=torch.float32)[0] == "sdpa-bias"  # exact fp32 is off the TCs
    assert auto_choice(cuda, compiling=True, dtype=torch.bfloat16)[0] == "fused"  # a custom op compile traces
    assert auto_choice(cuda, compiling=True, dtype=torch.float32)[0] == "reference"  # compile fuses it
    monkeypatch.setattr("compressive_transformer.core.kernels.triton_available", lambda: False)
    assert auto_choice(cuda, compiling=False, dtype=torch.bfloat16)[0] == "sdpa-bias"
    with pytest.warns(UserWarning, match="needs Triton, a CUDA device or the CPU"):
        assert pick("fused") == "sdpa-bias"
    monkeypatch.setattr("compressive_transformer.core.kernels.triton_available", lambda: True)
    kernels._say_once.cache_clear()  # said once per process: another test may have said it already
    with pytest.warns(UserWarning, match="on the CPU runs through Triton's interpreter"):
        assert pick("fused", device=cpu) == "fused"  # asked for by name: exact, slow
    with pytest.warns(UserWarning, match="needs Triton, a CUDA device or the CPU, and fp32/bf16/fp16"):
        assert pick("fused", device=cpu, dtype=torch.float64) == "sdpa-bias"
    for name, (kernel, reason) in ((n, auto_choice(torch.device(n), compiling=False)) for n in ("cpu", "cuda", "mps")):
        assert kernel in KERNELS and reason, name


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
