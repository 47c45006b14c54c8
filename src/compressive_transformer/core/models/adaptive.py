"""Adaptive input embedding and adaptive softmax with Transformer-XL's layout (``model.adaptive``).

The vocabulary (ids sorted by frequency) is cut into a head cluster ``[0, cutoffs[0])`` and tail clusters. Cluster i
has word vectors of width ``d_embed // div_val ** i`` and a projection to/from ``d_model``. The softmax's head scores
the head's words plus one logit per tail cluster; a tail word's log-probability is its cluster's head log-probability
plus its log-probability within the cluster. With ``div_val = 1`` all clusters share one (V, d_embed) word matrix,
sliced at the cutoffs, and the embedding has at most one projection. Parameter names follow the reference code's
(``layers.i`` for word vectors, ``projs.i`` for projections), which keeps a checkpoint import a renaming.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from compressive_transformer.core.config import AdaptiveConfig, ConfigError, ModelConfig
from compressive_transformer.core.constants import IGNORE_INDEX


def _bounds(cfg: ModelConfig) -> tuple[int, ...]:
    """(0, cutoffs..., vocab_size): cluster i holds ids [bounds[i], bounds[i + 1])."""
    a: AdaptiveConfig = cfg.adaptive
    if a.cutoffs and a.cutoffs[-1] >= cfg.vocab_size:
        raise ConfigError(
            f"model.adaptive.cutoffs: the last cutoff {a.cutoffs[-1]} must be below vocab_size = {cfg.vocab_size}; "
            "lower the cutoffs"
        )
    return (0, *a.cutoffs, cfg.vocab_size)


def _word_matrices(cfg: ModelConfig, bounds: tuple[int, ...]) -> tuple[int, list[int]]:
    """How many word matrices there are and their rows: one for the whole vocabulary with div_val = 1, else one per
    cluster."""
    if cfg.adaptive.div_val == 1:
        return 1, [cfg.vocab_size]
    return len(bounds) - 1, [hi - lo for lo, hi in zip(bounds, bounds[1:])]


def _param(rows: int, cols: int, std: float) -> nn.Parameter:
    return nn.Parameter(torch.randn(rows, cols) * std)


class AdaptiveInput(nn.Module):
    """Token ids -> (B, T, d_model): each cluster's vectors projected to d_model, scaled by sqrt(d_model) as in the
    reference code (its ``emb_scale = d_proj ** 0.5``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        a, d = cfg.adaptive, cfg.d_model
        self.bounds = _bounds(cfg)
        dims = a.cluster_dims(d)
        n, sizes = _word_matrices(cfg, self.bounds)
        self.layers = nn.ModuleList(nn.Embedding(sizes[i], dims[i]) for i in range(n))
        self.projs = nn.ParameterList(_param(d, dims[i], cfg.init_std) for i in range(n)) if a.has_proj(d) else None
        self.d_model = d
        self.scale = math.sqrt(d)

    def forward(self, ids: Tensor) -> Tensor:
        if len(self.layers) == 1:
            e = self.layers[0](ids)
            return (F.linear(e, self.projs[0]) if self.projs is not None else e) * self.scale
        # Every cluster embeds every position (ids clamped into its range) and a mask picks the right one: fixed
        # shapes, and every parameter takes part in each step (no unused parameters under DDP).
        out = None
        for i, (lo, hi) in enumerate(zip(self.bounds, self.bounds[1:])):
            inside = ((ids >= lo) & (ids < hi)).unsqueeze(-1)  # (B, T, 1)
            e = F.linear(self.layers[i]((ids - lo).clamp(0, hi - lo - 1)), self.projs[i])  # (B, T, d)
            out = torch.where(inside, e, 0.0 if out is None else out)
        return out * self.scale


class AdaptiveLogSoftmax(nn.Module):
    """Hidden states -> log-probabilities over the whole vocabulary (decoding, evaluation) or the negative
    log-likelihood of targets (training, where a tail cluster is scored only at the rows whose target is in it).
    The normalisations run in fp32 whatever the autocast dtype of the matmuls."""

    def __init__(self, cfg: ModelConfig, embedding: AdaptiveInput) -> None:
        super().__init__()
        a, d = cfg.adaptive, cfg.d_model
        self.bounds = _bounds(cfg)
        dims = a.cluster_dims(d)
        self.n_clusters = len(a.cutoffs)
        self.div_val = a.div_val
        n, sizes = _word_matrices(cfg, self.bounds)
        self.layers = nn.ModuleList(nn.Linear(dims[i], sizes[i]) for i in range(n))
        if cfg.tie_embeddings:
            for out, emb in zip(self.layers, embedding.layers):
                out.weight = emb.weight
        # One projection per cluster (with div_val = 1 each maps to the shared d_embed), or none at all.
        ties = a.tie_projs or (False,) * len(dims)
        if a.has_proj(d):
            projs = []
            for i in range(len(dims)):
                source = embedding.projs[0 if a.div_val == 1 else i]
                projs.append(source if ties[i] else _param(d, dims[0 if a.div_val == 1 else i], cfg.init_std))
            self.projs = nn.ParameterList(projs)
        else:
            self.projs = None
        if self.n_clusters > 0:
            self.cluster_weight = _param(self.n_clusters, dims[0], cfg.init_std)
            self.cluster_bias = nn.Parameter(torch.zeros(self.n_clusters))

    def _logits(self, h: Tensor, i: int) -> Tensor:
        """Cluster i's logits (the head's include one per tail cluster), as fp32: (N, size_i)."""
        if self.div_val == 1:
            lo, hi = self.bounds[i], self.bounds[i + 1]
            w, b = self.layers[0].weight[lo:hi], self.layers[0].bias[lo:hi]
        else:
            w, b = self.layers[i].weight, self.layers[i].bias
        if i == 0 and self.n_clusters > 0:
            w, b = torch.cat([w, self.cluster_weight]), torch.cat([b, self.cluster_bias])
        if self.projs is not None:
            h = h @ self.projs[i]  # (N, d) x (d, d_i): the transposed projection of the embedding
        logits = F.linear(h, w, b)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16/fp16 -> fp32

    def log_probs(self, h: Tensor) -> Tensor:
        """(..., d) -> (..., V) fp32 log-probabilities."""
        shape = h.shape[:-1]
        h = h.reshape(-1, h.shape[-1])
        head = F.log_softmax(self._logits(h, 0), dim=-1)  # (N, cutoffs[0] + n_clusters)
        shortlist = self.bounds[1]
        parts = [head[:, :shortlist]]
        for i in range(1, self.n_clusters + 1):
            parts.append(head[:, shortlist + i - 1, None] + F.log_softmax(self._logits(h, i), dim=-1))
        return torch.cat(parts, dim=-1).view(*shape, -1)

    def nll(self, h: Tensor, targets: Tensor) -> Tensor:
        """(N, d), (N,) -> (N,) fp32 negative log-likelihoods; 0 where the target is IGNORE_INDEX. Each tail cluster
        is scored at its own targets' rows only; traced or captured, where shapes must not depend on the data, every
        row is scored (:meth:`_nll_static`, the same values)."""
        if torch.compiler.is_compiling() or (h.is_cuda and torch.cuda.is_current_stream_capturing()):
            return self._nll_static(h, targets)
        head, nll = self._head_nll(h, targets)
        shortlist = self.bounds[1]
        for i in range(1, self.n_clusters + 1):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            rows = ((targets >= lo) & (targets < hi)).nonzero().squeeze(1)  # data-dependent: only these rows
            if rows.numel() == 0:
                if torch.is_grad_enabled():  # keep the cluster's parameters in the graph (DDP needs every gradient)
                    nll = nll + 0.0 * self._logits(h[:1], i).sum()
                continue
            tail = F.log_softmax(self._logits(h[rows], i), dim=-1)
            lp = head[rows, shortlist + i - 1] + tail.gather(1, (targets[rows] - lo)[:, None]).squeeze(1)
            nll = nll.index_put((rows,), -lp)
        return nll

    def _head_nll(self, h: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """The head's log-probabilities (N, shortlist + clusters) and the NLL of the targets it holds (0 elsewhere)."""
        head = F.log_softmax(self._logits(h, 0), dim=-1)
        shortlist = self.bounds[1]
        in_head = (targets >= 0) & (targets < shortlist)
        return head, torch.where(in_head, -head.gather(1, targets.clamp(0, shortlist - 1)[:, None]).squeeze(1), 0.0)

    def _nll_static(self, h: Tensor, targets: Tensor) -> Tensor:
        """:meth:`nll` with static shapes: every cluster's log-probabilities for every row, each row's target picked."""
        head, nll = self._head_nll(h, targets)
        shortlist = self.bounds[1]
        for i in range(1, self.n_clusters + 1):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            tail = F.log_softmax(self._logits(h, i), dim=-1)  # (N, hi - lo)
            lp = head[:, shortlist + i - 1] + tail.gather(1, (targets - lo).clamp(0, hi - lo - 1)[:, None]).squeeze(1)
            nll = torch.where((targets >= lo) & (targets < hi), -lp, nll)
        return nll

    def loss(self, h: Tensor, targets: Tensor) -> Tensor:
        """Mean negative log-likelihood over targets != IGNORE_INDEX; h: (..., d), targets: (...)."""
        t = targets.reshape(-1)
        nll = self.nll(h.reshape(-1, h.shape[-1]), t)
        return nll.sum() / (t != IGNORE_INDEX).sum().clamp(min=1)


__all__ = ["AdaptiveInput", "AdaptiveLogSoftmax"]
