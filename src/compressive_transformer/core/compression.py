"""Compression functions f_c behind one interface, looked up by name, and the auxiliary compression losses.

Every compressor maps windows of evicted states to one slot each: ``(B, G, h + c + e, d) -> (B, G, d)``, where a
window is one group of c evicted states plus e newer neighbours (``compression_extra_width``, overlapping windows),
preceded by the h = :attr:`Compressor.context` states evicted before the group (0 for all but the dilated
convolution, whose causal stack runs over the stream of evicted states and so reads back that far). Each compressed
slot is a function of its window only, so the result never depends on how a stream was cut into segments; the memory
carries the last h evicted states across segments (``LayerMemory.history``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.dtypes import compute_dtype
from compressive_transformer.core.registry import compressor_spec


class Compressor(nn.Module):
    """f_c: windows (B, G, h + c + e, d) [+ usage (B, G*c) for most_used] -> compressed slots (B, G, d)."""

    context = 0  # h: evicted states before each group that a window carries (the stream's receptive field - 1)

    def __init__(self, rate: int, extra_width: int) -> None:
        super().__init__()
        self.rate = rate
        self.extra_width = extra_width

    @property
    def window(self) -> int:
        return self.context + self.rate + self.extra_width


class PoolCompressor(Compressor):
    """Max or mean pooling with kernel c (+ extra width) and stride c; no parameters."""

    def __init__(self, rate: int, extra_width: int, kind: str) -> None:
        super().__init__(rate, extra_width)
        self.kind = kind

    def forward(self, windows: Tensor, usage: Tensor | None = None) -> Tensor:
        return max_over_group(windows) if self.kind == "max" else mean_over_group(windows)


class ConvCompressor(Compressor):
    """1D convolution with kernel c (+ extra width) and stride c, no bias (as the authors' code)."""

    def __init__(self, d_model: int, rate: int, extra_width: int) -> None:
        super().__init__(rate, extra_width)
        self.conv = nn.Conv1d(d_model, d_model, kernel_size=rate + extra_width, stride=rate, bias=False)

    def forward(self, windows: Tensor, usage: Tensor | None = None) -> Tensor:
        # A strided convolution over windows is one matmul per window: out[o] = sum_{i,k} w[o,i,k] x[k,i]. Transposing
        # the (small) windows to (i, k) order lets the weight be read in place as (o, i*k); contracting in the
        # weight's order instead copies all of it on every call (~0.1 ms per layer for one decoded token).
        B, G, k, d = windows.shape
        weight = self.conv.weight
        return F.linear(windows.transpose(2, 3).reshape(B, G, d * k), weight.view(weight.shape[0], d * k))


class DilatedConvCompressor(Compressor):
    """The paper's dilated convolution: a causal stack of kernel-2 dilated convolutions with ReLU over the stream of
    evicted states, then the strided convolution (kernel c + e, stride c) that compresses it.

    Output t of a rate-r layer reads its input at t and t - r, so a compressed slot depends on its c + e states and
    the h = sum(dilations) evicted before them: each window carries those h states (zeros before a document's first
    eviction, as a causal convolution's left padding), and the stack runs without padding, leaving c + e outputs.
    """

    def __init__(self, d_model: int, rate: int, extra_width: int, dilations: tuple[int, ...]) -> None:
        super().__init__(rate, extra_width)
        self.dilations = dilations
        self.context = sum(dilations)
        self.layers = nn.ModuleList(nn.Conv1d(d_model, d_model, kernel_size=2, dilation=r) for r in dilations)
        self.out = ConvCompressor(d_model, rate, extra_width)

    def forward(self, windows: Tensor, usage: Tensor | None = None) -> Tensor:
        B, G, L, d = windows.shape
        x = windows.reshape(B * G, L, d).transpose(1, 2)  # (B*G, d, h + c + e)
        for conv in self.layers:
            x = F.relu(conv(x))  # each rate-r layer shortens the window by r: the stream before it was carried along
        k = L - self.context
        return self.out(x.transpose(1, 2).reshape(B, G, k, d))


class MostUsedCompressor(Compressor):
    """Keep the floor(n/c) evicted slots that received the most attention while in memory, in time order."""

    def forward(self, windows: Tensor, usage: Tensor | None = None) -> Tensor:
        if usage is None:
            raise ValueError("most_used compression needs the attention usage of the evicted slots")
        B, G, c, d = windows.shape
        slots = windows.reshape(B, G * c, d)
        keep = usage.topk(G, dim=1).indices.sort(dim=1).values  # (B, G) most-used slots, oldest first
        return slots.gather(1, keep.unsqueeze(-1).expand(B, G, d))


class ConvDecoder(nn.Module):
    """g for the auto-encoding loss: a transposed convolution, kernel c and stride c, back to c states per slot."""

    def __init__(self, d_model: int, rate: int) -> None:
        super().__init__()
        self.rate = rate
        self.deconv = nn.ConvTranspose1d(d_model, d_model, kernel_size=rate, stride=rate, bias=False)

    def forward(self, compressed: Tensor) -> Tensor:
        B, G, d = compressed.shape
        weight = self.deconv.weight  # (d_in, d_out, c), read in place as (d_in, d_out * c)
        out = (compressed @ weight.view(d, -1)).view(B, G, -1, self.rate)  # (B, G, d_out, c)
        return out.transpose(2, 3).reshape(B, G * self.rate, -1)


def max_over_group(groups: Tensor) -> Tensor:
    """(B, G, c, d) -> (B, G, d): max pooling's reduction (Transformer-QL pools between scales with it)."""
    return groups.amax(dim=2)


def mean_over_group(groups: Tensor) -> Tensor:
    """(B, G, c, d) -> (B, G, d): mean pooling's reduction."""
    return groups.mean(dim=2)


# The builders the rows of core.registry.COMPRESSORS name: each makes its compressor from a ModelConfig.


def build_max_pool(cfg: ModelConfig) -> Compressor:
    return PoolCompressor(cfg.compression.rate, cfg.compression.extra_width, "max")


def build_mean_pool(cfg: ModelConfig) -> Compressor:
    return PoolCompressor(cfg.compression.rate, cfg.compression.extra_width, "mean")


def build_conv(cfg: ModelConfig) -> Compressor:
    return ConvCompressor(cfg.d_model, cfg.compression.rate, cfg.compression.extra_width)


def build_dilated_conv(cfg: ModelConfig) -> Compressor:
    comp = cfg.compression
    return DilatedConvCompressor(cfg.d_model, comp.rate, comp.extra_width, comp.dilations)


def build_most_used(cfg: ModelConfig) -> Compressor:
    return MostUsedCompressor(cfg.compression.rate, 0)


def build_compressor(cfg: ModelConfig) -> Compressor:
    """The compressor ``cfg.compression.function`` names in :data:`~compressive_transformer.core.registry.COMPRESSORS`."""
    return compressor_spec(cfg.compression.function).build(cfg)


# --------------------------------------------------------------------------------------------------------------
# Auxiliary losses. Both see only detached network states: their gradient reaches the compressor (and decoder) alone.


def content_attention(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d_h)) v per head, with no positional terms (Algorithm 2, line 6).

    q: (B, H, T, d_h) projected queries; k, v: (B, H, S, d_h) projected keys and values; key_mask: (B, S).
    Returns (B, T, H*d_h). A row with no valid key reads all its keys instead (a finite result the caller's row mask
    excludes), so the fused kernel never sees an empty softmax. The mask goes in as an additive bias (0 or -inf, the
    same scores a bool mask gives): SDPA's kernels that take a float bias are open to it, and a bool mask would be
    converted to one anyway.
    """
    B, H, T, dh = q.shape
    key_mask = key_mask | ~key_mask.any(dim=1, keepdim=True)
    bias = torch.zeros(key_mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~key_mask, float("-inf"))
    bias = bias[:, None, None, :]  # (B, 1, 1, S)
    if q.device.type == "cpu" and torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
        # The reconstruction's read of the few compressed slots: on CPU the fused kernel's backward took 2.6x the
        # time of these three ops (forward + backward, 32 keys); without gradients the fused kernel is the faster.
        scores = torch.matmul(q * dh**-0.5, k.transpose(-1, -2)) + bias  # (B, H, T, S)
        y = torch.matmul(torch.softmax(scores, dim=-1), v)
    else:
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return y.transpose(1, 2).reshape(B, T, H * dh)


def attention_reconstruction_loss(
    q: Tensor,
    query_mask: Tensor,
    old_k: Tensor,
    old_v: Tensor,
    old_mask: Tensor,
    compressed: Tensor,
    compressed_mask: Tensor,
    w_k: Tensor,
    w_v: Tensor,
) -> Tensor:
    """||attn(h, old_mem) - attn(h, f_c(old_mem))||^2 (Algorithm 2), mean over valid queries and features.

    Per layer, for L layers at once (the leading dimension; a single layer's tensors without it give a scalar):
    q: (L, B, H, T, d_h) the layers' queries of this segment; old_k, old_v: (L, B, H, S, d_h) keys/values of the
    evicted states under each layer's own projections (the attention already computed them this step); compressed:
    (L, B, G, d); w_k, w_v: (L, H d_h, d) the layers' key/value weights; the masks, query_mask (B, T), old_mask (B, S)
    and compressed_mask (B, G), are the same for every layer (every layer evicts the same positions). Returns (L,).
    The stop-gradients of Algorithm 2 are applied here: on the queries, the evicted memories and the attention weights
    (the weights are used detached, never modified, so the layer keeps training from the task loss). Only
    ``compressed`` carries gradient. All layers' reads run as one batch (L x B rows).

    The two reads run in the compute dtype (bf16 under autocast: the fast attention kernels) and their difference is
    squared and summed in at least fp32, so the loss and the compressor's gradient stay within about 1% of an fp32
    computation (tests/test_compression.py measures it).
    """
    if q.dim() == 4:  # one layer
        one = lambda t: t.unsqueeze(0)  # noqa: E731
        return attention_reconstruction_loss(
            one(q), query_mask, one(old_k), one(old_v), old_mask, one(compressed), compressed_mask, one(w_k), one(w_v)
        )[0]
    L, B, H, T, dh = q.shape
    dtype = compute_dtype(q.device, w_k.dtype)  # autocast's where it is on, else the weights'
    rows_of = lambda t: t.detach().to(dtype).flatten(0, 1)  # noqa: E731  (L, B, ...) -> (L B, ...)
    q = rows_of(q)
    target = content_attention(q, rows_of(old_k), rows_of(old_v), old_mask.repeat(L, 1))
    # the compression's keys and values under each layer's own weights, in one product: (L, B, G, 2 H d_h)
    w_kv = torch.cat([w_k, w_v], dim=1).detach().to(dtype).transpose(1, 2).unsqueeze(1)  # (L, 1, d, 2 H d_h)
    kv = (
        torch.matmul(compressed.to(dtype), w_kv).view(L * B, -1, 2, H, dh).permute(2, 0, 3, 1, 4)
    )  # (2, L B, H, G, d_h)
    recon = content_attention(q, kv[0], kv[1], compressed_mask.repeat(L, 1))
    rows = query_mask & compressed_mask.any(dim=1, keepdim=True) & old_mask.any(dim=1, keepdim=True)  # (B, T)
    wide = torch.promote_types(dtype, torch.float32)  # the small difference of two reads, squared in >= fp32
    err = ((target.to(wide) - recon.to(wide)) ** 2).mean(dim=-1).view(L, B, T)
    return torch.where(rows, err, 0.0).sum(dim=(1, 2)) / rows.sum().clamp(min=1)


def autoencoder_loss(old: Tensor, old_mask: Tensor, decoded: Tensor) -> Tensor:
    """||old_mem - g(f_c(old_mem))||^2, mean over valid evicted states and features; old, decoded: (..., B, G c, d)
    with any leading dimensions (layers), old_mask: (B, G c). Returns a value per leading index."""
    dtype = torch.promote_types(old.dtype, torch.float32)  # at least fp32, under autocast too
    err = ((old.detach().to(dtype) - decoded.to(dtype)) ** 2).mean(dim=-1)  # (..., B, G*c)
    return (err * old_mask).sum(dim=(-2, -1)) / old_mask.sum().clamp(min=1)


@dataclass(frozen=True)
class EvictionLoss:
    """What a local compression loss (a ``local`` row of ``COMPRESSION_LOSSES``) sees of one segment's eviction, for
    all L layers at once (every layer evicts the same positions, so the masks are shared).

    queries: (L, B, H, T, d_h) each layer's queries of this segment, query_mask: (B, T); old: (L, B, G*c, d) the
    evicted states, old_keys/old_values: (L, B, H, G*c, d_h) them under each layer's own projections, old_mask:
    (B, G*c); compressed: (L, B, G, d) their compression, compressed_mask: (B, G); w_k, w_v: (L, H d_h, d) the layers'
    key/value weights; decoders: each layer's decoder (rows with ``decoder``), else None. The loss returns one value
    per layer, (L,). Only ``compressed`` (and the decoders) may carry gradient: the loss trains the compression
    network alone (Algorithm 2's stop-gradients).
    """

    queries: Tensor
    query_mask: Tensor
    old: Tensor
    old_keys: Tensor
    old_values: Tensor
    old_mask: Tensor
    compressed: Tensor
    compressed_mask: Tensor
    w_k: Tensor
    w_v: Tensor
    decoders: Sequence[nn.Module] | None = None


# The losses the rows of core.registry.COMPRESSION_LOSSES name: each maps the layers' eviction to a loss per layer.


def reconstruct_attention(e: EvictionLoss) -> Tensor:
    """The attention-reconstruction loss (``attention``)."""
    return attention_reconstruction_loss(
        e.queries, e.query_mask, e.old_keys, e.old_values, e.old_mask, e.compressed, e.compressed_mask, e.w_k, e.w_v
    )


def reconstruct_states(e: EvictionLoss) -> Tensor:
    """The auto-encoding loss (``autoencoder``): the evicted states against their decoded compression."""
    decoded = torch.stack([decoder(c) for decoder, c in zip(e.decoders, e.compressed.unbind(0))])
    return autoencoder_loss(e.old, e.old_mask, decoded)
