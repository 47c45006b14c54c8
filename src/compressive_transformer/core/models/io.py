"""What every model of the family shares around its blocks: the input layer, the LM head and its loss."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.constants import IGNORE_INDEX
from compressive_transformer.core.models.adaptive import AdaptiveInput, AdaptiveLogSoftmax


def dropout(p: float) -> nn.Module:
    """Dropout, or nothing at all when p = 0 (a no-op module still costs a call per use, which adds up in generation)."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


class InputLayer(nn.Module):
    """Token embedding scaled by sqrt(d) (Transformer-XL), an adaptive input embedding, or a linear projection of
    continuous inputs."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.adaptive = AdaptiveInput(cfg) if cfg.adaptive is not None else None
        if self.adaptive is not None:
            self.embed = self.proj = None
        elif cfg.input_dim > 0:
            self.embed, self.proj = None, nn.Linear(cfg.input_dim, cfg.d_model)
        else:
            self.embed, self.proj = nn.Embedding(cfg.vocab_size, cfg.d_model), None
        self.scale = math.sqrt(cfg.d_model)

    def forward(self, inputs: Tensor) -> Tensor:
        """(B, T) ids or (B, T, input_dim) floats -> (B, T, d)."""
        if self.adaptive is not None:
            return self.adaptive(inputs)
        return self.embed(inputs) * self.scale if self.embed is not None else self.proj(inputs)


class OutputLayer(nn.Module):
    """Final norm (pre-LN models), dropout and the LM head (absent for a hidden-states-only model): a linear layer or
    an adaptive softmax, whose "logits" are log-probabilities (fp32), left out when training (only the loss is
    needed there, and it scores each tail cluster at its own targets only)."""

    def __init__(self, cfg: ModelConfig, input_layer: InputLayer) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm == "pre" and cfg.final_norm else None
        self.drop = dropout(cfg.dropout)
        self.adaptive = AdaptiveLogSoftmax(cfg, input_layer.adaptive) if input_layer.adaptive is not None else None
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size) if cfg.vocab_size > 0 and self.adaptive is None else None
        if self.head is not None and cfg.tie_embeddings:
            self.head.weight = input_layer.embed.weight

    def forward(self, h: Tensor, targets: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Returns (hidden (B, T, d), logits (B, T, V) | None, mean cross-entropy over targets != -100 | None)."""
        if self.norm is not None:
            h = self.norm(h)
        if self.adaptive is not None:
            x = self.drop(h)
            train = targets is not None and torch.is_grad_enabled()
            logits = None if train else self.adaptive.log_probs(x)
            return h, logits, self.adaptive.loss(x, targets) if targets is not None else None
        logits = self.head(self.drop(h)) if self.head is not None else None
        if targets is None:
            return h, logits, None
        if logits is None:
            raise ValueError("targets need a model with vocab_size > 0 (an LM head)")
        nll = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        return h, logits, nll / (targets != IGNORE_INDEX).sum().clamp(min=1)


def init_weights(module: nn.Module, std: float) -> None:
    """Normal(0, std) weights and zero biases; the attention biases u, v (and the compressed stream's) too."""
    if isinstance(module, (nn.Linear, nn.Embedding, nn.Conv1d, nn.ConvTranspose1d)):
        nn.init.normal_(module.weight, 0.0, std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    for name in ("u", "v", "cv"):
        p = getattr(module, name, None)
        if isinstance(p, nn.Parameter):
            nn.init.normal_(p, 0.0, std)
