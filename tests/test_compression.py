"""Each compression function against its textbook operator, and the auxiliary losses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config
from torch import nn

from compressive_transformer.core import compression
from compressive_transformer.core.compression import (
    ConvCompressor,
    ConvDecoder,
    DilatedConvCompressor,
    PoolCompressor,
    attention_reconstruction_loss,
    autoencoder_loss,
    build_compressor,
    content_attention,
)


def windows_of(seq: torch.Tensor, c: int, e: int) -> torch.Tensor:
    """(B, n + e, d) -> (B, n // c, c + e, d): the windows update_layer hands to a compressor."""
    return seq.unfold(1, c + e, c).transpose(2, 3)


@pytest.mark.parametrize("e", [0, 2])
def test_conv_is_a_strided_convolution(e):
    torch.manual_seed(0)
    comp = ConvCompressor(6, 3, e).double()
    seq = torch.randn(2, 12 + e, 6, dtype=torch.float64)
    ours = comp(windows_of(seq, 3, e))
    ref = F.conv1d(seq.transpose(1, 2), comp.conv.weight, stride=3).transpose(1, 2)
    torch.testing.assert_close(ours, ref)


@pytest.mark.parametrize("kind,op", [("max", F.max_pool1d), ("mean", F.avg_pool1d)])
def test_pooling_is_kernel_c_stride_c(kind, op):
    seq = torch.randn(2, 12, 5)
    ours = PoolCompressor(4, 0, kind)(windows_of(seq, 4, 0))
    torch.testing.assert_close(ours, op(seq.transpose(1, 2), 4, 4).transpose(1, 2))


def stream_windows(seq: torch.Tensor, c: int, e: int, h: int) -> torch.Tensor:
    """(B, n + e, d) -> (B, n // c, h + c + e, d): windows of an uncut stream whose first eviction had nothing before it."""
    padded = torch.cat([seq.new_zeros(seq.shape[0], h, seq.shape[2]), seq], dim=1)
    return padded.unfold(1, h + c + e, c).transpose(2, 3)


def dilated_reference(comp: DilatedConvCompressor, seq: torch.Tensor) -> torch.Tensor:
    """The operator on one uncut stream (B, n + e, d): the stream left-padded with h zero states, a kernel-2 dilated
    stack with ReLU over all of it, then the strided convolution from the first real state."""
    x = F.pad(seq.transpose(1, 2), (comp.context, 0))
    for conv, r in zip(comp.layers, comp.dilations):
        x = F.relu(F.conv1d(x, conv.weight, conv.bias, dilation=r))
    return F.conv1d(x, comp.out.conv.weight, stride=comp.rate).transpose(1, 2)


@pytest.mark.parametrize("c,e,dilations", [(4, 0, (1, 2, 4)), (2, 1, (1, 2, 4, 8)), (3, 2, (2, 3))])
def test_dilated_conv_is_a_causal_dilated_stack_over_the_evicted_stream(c, e, dilations):
    torch.manual_seed(0)
    comp = DilatedConvCompressor(4, c, e, dilations).double()
    assert comp.context == sum(dilations) and comp.window == sum(dilations) + c + e
    assert [m.dilation[0] for m in comp.layers] == list(dilations)
    seq = torch.randn(2, 5 * c + e, 4, dtype=torch.float64)
    torch.testing.assert_close(comp(stream_windows(seq, c, e, comp.context)), dilated_reference(comp, seq))


def test_dilated_conv_reads_across_groups():
    torch.manual_seed(0)
    comp = DilatedConvCompressor(16, 2, 0, (1, 2, 4)).double()
    seq = torch.randn(1, 12, 16, dtype=torch.float64)
    changed = seq.clone()
    changed[:, 0] += 1.0  # a state of the first group only
    a, b = (comp(stream_windows(s, 2, 0, comp.context)) for s in (seq, changed))
    assert (a[:, 1:4] - b[:, 1:4]).abs().amax(dim=-1).gt(0).all()  # later slots read it (receptive field 8)
    torch.testing.assert_close(a[:, 4:], b[:, 4:])  # ... and no further back than the receptive field


def test_decoder_is_a_transposed_convolution():
    torch.manual_seed(0)
    dec = ConvDecoder(5, 3).double()
    z = torch.randn(2, 4, 5, dtype=torch.float64)
    ref = F.conv_transpose1d(z.transpose(1, 2), dec.deconv.weight, stride=3).transpose(1, 2)
    torch.testing.assert_close(dec(z), ref)


def test_build_compressor_by_name():
    for name, cls in [
        ("conv", "ConvCompressor"),
        ("dilated_conv", "DilatedConvCompressor"),
        ("most_used", "MostUsedCompressor"),
    ]:
        loss = "none" if name == "most_used" else "attention"
        assert type(build_compressor(tiny_config(compression=name, compression_loss=loss))).__name__ == cls
    for name in ("max_pool", "mean_pool"):
        comp = build_compressor(tiny_config(compression=name, compression_loss="none"))
        assert isinstance(comp, PoolCompressor) and not list(comp.parameters())


def _weights(d=8, seed=0):
    """Query weights (d, d) and key/value weights (2d, d) of one layer."""
    torch.manual_seed(seed)
    return torch.randn(d, d, dtype=torch.float64) * 0.3, torch.randn(2 * d, d, dtype=torch.float64) * 0.3


def _loss(h, qmask, old, old_mask, new, new_mask, wq, wkv, H):
    """The loss as the model calls it: queries and the evicted keys/values projected by the layer."""
    B, T, d = h.shape
    heads = lambda t: t.view(B, -1, H, d // H).transpose(1, 2)  # noqa: E731
    wk, wv = wkv[:d], wkv[d:]
    return attention_reconstruction_loss(
        heads(h @ wq.t()), qmask, heads(old @ wk.t()), heads(old @ wv.t()), old_mask, new, new_mask, wk, wv
    )


def test_attention_reconstruction_is_zero_for_a_lossless_compression_and_positive_otherwise():
    wq, wkv = _weights()
    h, old = torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(2, 6, 8, dtype=torch.float64)
    t, m6, m3 = (
        torch.ones(2, 5, dtype=torch.bool),
        torch.ones(2, 6, dtype=torch.bool),
        torch.ones(2, 3, dtype=torch.bool),
    )
    assert _loss(h, t, old, m6, old, m6, wq, wkv, 2).item() == pytest.approx(0.0, abs=1e-15)
    pooled = PoolCompressor(2, 0, "mean")(windows_of(old, 2, 0))
    assert _loss(h, t, old, m6, pooled, m3, wq, wkv, 2).item() > 1e-4


def test_attention_reconstruction_matches_algorithm_2_by_hand():
    wq, wkv = _weights(d=4, seed=1)
    wk, wv = wkv[:4], wkv[4:]
    h, old, new = (torch.randn(1, n, 4, dtype=torch.float64) for n in (3, 4, 2))
    full = lambda n: torch.ones(1, n, dtype=torch.bool)  # noqa: E731

    def attn(hh, m):  # one head, content only
        w = torch.softmax((hh @ wq.t()) @ (m @ wk.t()).t() / 2.0, -1)
        return w @ (m @ wv.t())

    expected = ((attn(h[0], old[0]) - attn(h[0], new[0])) ** 2).mean()
    torch.testing.assert_close(_loss(h, full(3), old, full(4), new, full(2), wq, wkv, 1), expected)


def test_reconstruction_gradient_reaches_only_the_compressed_states():
    wq, wkv = _weights()
    wq.requires_grad_(True), wkv.requires_grad_(True)
    h = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    old = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    new = torch.randn(1, 2, 8, dtype=torch.float64, requires_grad=True)
    m = lambda n: torch.ones(1, n, dtype=torch.bool)  # noqa: E731
    _loss(h, m(5), old, m(4), new, m(2), wq, wkv, 2).backward()
    assert new.grad is not None and new.grad.abs().sum() > 0
    assert all(t.grad is None for t in (wq, wkv, h, old))


def test_content_attention_with_and_without_gradients_agree():
    """The read with gradients (the compressed slots') and without (the evicted slots') take different kernels on
    CPU; both are softmax(q k^T / sqrt(d_h)) v over the valid keys, and a row with none reads all of them."""
    torch.manual_seed(0)
    q = torch.randn(3, 2, 5, 4, dtype=torch.float64)
    k, v = torch.randn(3, 2, 6, 4, dtype=torch.float64), torch.randn(3, 2, 6, 4, dtype=torch.float64)
    key_mask = torch.rand(3, 6) > 0.4
    key_mask[0, 0] = True
    key_mask[2] = False  # no valid key: every key is read
    with torch.no_grad():
        fused = content_attention(q, k, v, key_mask)
    kg = k.clone().requires_grad_(True)
    explicit = content_attention(q, kg, v, key_mask)
    torch.testing.assert_close(explicit, fused)
    visible = key_mask | ~key_mask.any(dim=1, keepdim=True)
    scores = (q @ k.transpose(-1, -2) / 2.0).masked_fill(~visible[:, None, None, :], float("-inf"))
    want = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(3, 5, 8)
    torch.testing.assert_close(explicit, want)
    explicit.sum().backward()
    assert kg.grad is not None and torch.isfinite(kg.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_content_attention_gives_sdpa_an_additive_bias_equal_to_the_bool_mask(monkeypatch, dtype):
    """SDPA gets the key mask as a float bias (0 or -inf: its kernels that take a bias may run, a bool mask keeps
    them off), and the result is exactly what the bool mask gives, a row with no valid key included."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, n, 8, dtype=dtype) for n in (5, 7, 7))
    key_mask = torch.rand(3, 7) > 0.4
    key_mask[0, 0], key_mask[2] = True, False
    masks, sdpa = [], F.scaled_dot_product_attention

    def spy(*args, attn_mask):
        masks.append(attn_mask)
        return sdpa(*args, attn_mask=attn_mask)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        got = content_attention(q, k, v, key_mask)
    assert len(masks) == 1 and masks[0].dtype == dtype and masks[0].shape == (3, 1, 1, 7)
    visible = key_mask | ~key_mask.any(dim=1, keepdim=True)
    want = sdpa(q, k, v, attn_mask=visible[:, None, None, :]).transpose(1, 2).reshape(3, 5, 16)
    assert torch.equal(got, want)


def test_losses_ignore_invalid_slots_and_rows():
    wq, wkv = _weights()
    h, old = torch.randn(2, 5, 8, dtype=torch.float64), torch.randn(2, 6, 8, dtype=torch.float64)
    new = torch.randn(2, 3, 8, dtype=torch.float64)
    q = torch.ones(2, 5, dtype=torch.bool)
    om, nm = torch.ones(2, 6, dtype=torch.bool), torch.ones(2, 3, dtype=torch.bool)
    om[1], nm[1] = False, False  # row 1 evicted nothing valid
    both = _loss(h, q, old, om, new, nm, wq, wkv, 2)
    row0 = _loss(h[:1], q[:1], old[:1], om[:1], new[:1], nm[:1], wq, wkv, 2)
    torch.testing.assert_close(both, row0)
    assert torch.isfinite(both)
    dec = torch.randn(2, 6, 8, dtype=torch.float64)
    torch.testing.assert_close(autoencoder_loss(old, om, dec), ((old[0] - dec[0]) ** 2).mean())


def _reconstruction_in(amp: bool, comp: ConvCompressor, h, old, heads_of, w, c: int):
    """The loss and the compressor's weight gradient, the layer's projections and the compression under bf16 autocast
    (as a bf16 training step runs them) or in fp32."""
    wq, wk, wv = w
    B, T, _ = h.shape
    full = lambda n: torch.ones(B, n, dtype=torch.bool)  # noqa: E731
    comp.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        q, k, v = heads_of(h @ wq.t()), heads_of(old @ wk.t()), heads_of(old @ wv.t())
        new = comp(windows_of(old, c, 0))
        loss = attention_reconstruction_loss(q, full(T), k, v, full(old.shape[1]), new, full(new.shape[1]), wk, wv)
    loss.backward()
    return loss.detach().double(), comp.conv.weight.grad.double().clone()


@pytest.mark.parametrize("compressor", ["untrained", "near-lossless"])
def test_reconstruction_loss_in_bf16_agrees_with_fp32(compressor, monkeypatch):
    """Under bf16 autocast both attention reads run in bf16 (the fast kernels) and the squared error is summed in
    fp32: the loss within 1% of the fp32 computation's and the compressor's gradient within 3% (relative norm),
    also for a compressor whose reconstruction is already close (measured: 0.04% / 0.5% untrained, 0.15% / 1%
    near-lossless)."""
    torch.manual_seed(0)
    B, T, S, d, H, c = 4, 64, 64, 128, 4, 4
    h = torch.randn(B, T, d)
    base = torch.randn(B, S // c, d)
    old = (
        base.repeat_interleave(c, 1) + 0.1 * torch.randn(B, S, d)
        if compressor == "near-lossless"
        else torch.randn(B, S, d)
    )
    w = nn.Linear(d, 3 * d, bias=False).weight.detach().split(d)
    comp = ConvCompressor(d, c, 0)
    if compressor == "near-lossless":  # close to the mean of each group
        with torch.no_grad():
            comp.conv.weight.copy_((torch.eye(d) / c)[:, :, None] + 0.01 * torch.randn(d, d, c))
    heads_of = lambda t: t.view(B, -1, H, d // H).transpose(1, 2)  # noqa: E731
    read_dtypes = []
    read = compression.content_attention
    monkeypatch.setattr(compression, "content_attention", lambda q, *a: read_dtypes.append(q.dtype) or read(q, *a))
    loss32, grad32 = _reconstruction_in(False, comp, h, old, heads_of, w, c)
    loss16, grad16 = _reconstruction_in(True, comp, h, old, heads_of, w, c)
    assert read_dtypes == [torch.float32] * 2 + [torch.bfloat16] * 2  # the reads do run in bf16 under autocast
    assert abs(loss16 - loss32) / loss32 < 0.01
    assert (grad16 - grad32).norm() / grad32.norm() < 0.03
