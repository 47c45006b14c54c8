"""The ``flex`` kernel (FlexAttention, the positional scores precomputed and read by distance, a BlockMask) against
the reference: the output and every input's gradient in fp32 and bf16, with empty memory slots, padded (empty)
rows, windows and ``clamp_len``'s repeated table rows; a row without an allowed key gives zeros; compiled on the CPU
where its backend compiles (the forward); the model trains with it as with the reference."""

from __future__ import annotations

import pytest
import torch
from conftest import clamped_table, tiny_config
from test_kernels import assert_same, build, segments, tokens_for

pytest.importorskip("torch.nn.attention.flex_attention")

from compressive_transformer.core.attention import AttentionInputs, KeyMask, aligned_rows, relative_attention  # noqa: E402
from compressive_transformer.core.kernels.flex import block_mask, flex_attention, prepare  # noqa: E402

NAMES = ("qu", "k", "v", "qv", "r", "qc", "rc")


def inputs(B=2, H=2, T=8, C=4, M=8, dh=16, *, dtype=torch.float32, window=0, clamp=0, seed=0):
    """Leaves qu, k, v, qv, r, qc, rc (qc, rc None for C = 0) and the KeyMask: batch row 0 just reset (no memory or
    compressed slot valid) with its first three segment positions padded, row 1 with a third of its slots empty.
    clamp > 0: every table row beyond distance ``clamp`` repeats that distance's row, as ``clamp_len`` makes them."""
    g = torch.Generator().manual_seed(seed)
    K = C + M + T

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * 0.7).to(dtype)

    def table(n_rows, nearest):  # row m encodes distance nearest + n_rows - 1 - m
        return clamped_table(rand(H, n_rows, dh), nearest, clamp)

    valid = torch.rand(B, K, generator=g) >= 0.33
    valid[0, : C + M] = False
    valid[0, C + M : C + M + 3] = False  # padded queries: their own key is the only one they may read
    tensors = [rand(B, H, T, dh), rand(B, H, K, dh), rand(B, H, K, dh), rand(B, H, T, dh)]
    tensors.append(table(aligned_rows(M + T + 1), -1))
    if C > 0:
        tensors += [rand(B, H, T, dh), table(aligned_rows(C + T), 0)]
    else:
        tensors += [None, None]
    leaves = [t.requires_grad_() if t is not None else None for t in tensors]
    return leaves, KeyMask(valid, C, window)


def attend(kernel, tensors, mask):
    qu, k, v, qv, r, qc, rc = tensors
    return kernel(AttentionInputs(qu=qu, qv=qv, qc=qc, k=k, v=v, r=r, rc=rc, mask=mask))[0]


def output_and_grads(kernel, tensors, mask):
    out = attend(kernel, tensors, mask)
    leaves = [t for t in tensors if t is not None]
    grad = torch.linspace(-1, 1, out.numel()).view_as(out).to(out.dtype)
    return [out.detach(), *torch.autograd.grad(out, leaves, grad)]


CASES = {
    "ct": dict(),
    "txl": dict(C=0),
    "window": dict(window=3),
    "clamp": dict(clamp=5),
    "window-clamp-ragged": dict(T=5, C=3, M=7, window=6, clamp=4),
}


@pytest.mark.parametrize("case", CASES)
def test_fp32_output_and_every_gradient_equal_the_reference(case):
    tensors, mask = inputs(**CASES[case])
    ours = output_and_grads(flex_attention, tensors, prepare(mask, tensors[0].shape[2], torch.float32))
    ref = output_and_grads(relative_attention, tensors, mask)
    for name, a, b in zip(("out", *NAMES), ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("case", ["ct", "window-clamp-ragged"])
def test_bf16_output_and_every_gradient_are_within_bf16_rounding(case):
    """bf16 inputs against the fp32 reference of the same (rounded) values: relative error of each tensor's norm
    within bf16's few units in the last place."""
    tensors, mask = inputs(**CASES[case], dtype=torch.bfloat16)
    ours = output_and_grads(flex_attention, tensors, mask)
    exact = [t.detach().float().requires_grad_() if t is not None else None for t in tensors]
    ref = output_and_grads(relative_attention, exact, mask)
    for name, a, b in zip(("out", *NAMES), ours, ref):
        assert a.dtype == torch.bfloat16, name
        assert torch.isfinite(a).all(), name
        assert ((a.float() - b).norm() / b.norm()).item() < 2e-2, name


def test_a_row_with_no_allowed_key_gives_zeros_not_nan():
    """A decoder's ring (valid is the whole rule) with a row that has no valid slot: zeros, and finite gradients."""
    tensors, mask = inputs(T=1, C=2, M=5)
    valid = mask.valid.clone()
    valid[0] = False
    ring = KeyMask(valid, mask.n_cmem, self_in_valid=True)
    out, *grads = output_and_grads(flex_attention, tensors, ring)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.isfinite(out).all()
    assert all(torch.isfinite(g).all() for g in grads)


def test_the_block_mask_marks_full_blocks_and_is_the_key_masks_rule():
    T, C, M = 160, 64, 200  # larger than one 128 x 128 block: some blocks full, some partial, some empty
    valid = torch.ones(1, C + M + T, dtype=torch.bool)
    mask = KeyMask(valid, C, 0)
    bm = block_mask(mask, T)
    dense = bm.to_dense()  # (1, 1, query blocks, key blocks): blocks with any allowed pair
    assert bm.full_kv_num_blocks is not None and int(bm.full_kv_num_blocks.sum()) > 0
    allowed = mask.allowed(T)[0, 0]
    Q, Kb = dense.shape[-2:]
    pad = torch.zeros(Q * 128, Kb * 128, dtype=torch.bool)
    pad[:T, : allowed.shape[1]] = allowed
    assert torch.equal(dense[0, 0].bool(), pad.view(Q, 128, Kb, 128).any(3).any(1))


def test_training_without_torchdynamo_is_refused_in_one_line(monkeypatch):
    """FlexAttention's eager path without TorchDynamo would drop the positional scores' gradients without a word."""
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    tensors, mask = inputs()
    with pytest.raises(RuntimeError, match="unset TORCHDYNAMO_DISABLE"):
        attend(flex_attention, tensors, mask)


@pytest.mark.slow
def test_compiled_on_the_cpu_the_forward_equals_the_reference():
    """The CPU backend compiles FlexAttention's forward (it has no compiled backward there)."""
    tensors, mask = inputs()
    tensors = [t.detach() if t is not None else None for t in tensors]  # no backward to record
    compiled = torch.compile(flex_attention, fullgraph=True)
    with torch.no_grad():
        ours = attend(compiled, tensors, mask)
        ref = attend(relative_attention, tensors, mask)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("variant", ["ct", "ct-same-length-clamp"])
def test_the_model_trains_with_flex_as_with_the_reference(variant):
    ref = segments(build(variant, "reference").train(), tokens_for(), grad=True, sizes=(8, 8))
    assert_same(segments(build(variant, "flex").train(), tokens_for(), grad=True, sizes=(8, 8)), ref)


def test_the_config_accepts_flex_and_auto_never_picks_it():
    from compressive_transformer.core.kernels import auto_choice

    assert tiny_config(attn_impl="flex").attn_impl == "flex"
    for device in ("cpu", "cuda"):
        for dtype in (torch.float32, torch.bfloat16):
            for compiling in (False, True):
                kernel = auto_choice(torch.device(device), compiling=compiling, dtype=dtype)[0]
                assert kernel != "flex"
