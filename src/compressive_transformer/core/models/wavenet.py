"""WaveNet (van den Oord et al. 2016) as a model kind: the baseline of the paper's speech experiment.

A stack of dilated causal convolutions (kernel 2) with gated activations ``tanh(W_f * x) * sigmoid(W_g * x)``, a
residual connection around each layer and a skip connection from each layer to the output head
(``relu -> 1x1 -> relu -> 1x1``). The input is a token embedding (a one-hot input through a 1x1 convolution).

Its memory is its receptive field: layer i of dilation d_i keeps the last d_i inputs it saw, so a segment is
computed exactly as if the whole stream had been convolved at once, however the stream is cut. The prediction at
position t reads positions t - R + 1 .. t, R = 1 + sum(d_i) (:func:`receptive_field`). The buffers live in the
same :class:`~compressive_transformer.memory.MemoryState` as the transformers' memories (one layer memory per
conv layer, ``mem`` of shape (B, d_i, channels)), so resets, checkpoints and the streaming loop treat it alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.config_base import require
from compressive_transformer.core.constants import IGNORE_INDEX
from compressive_transformer.core.context import receptive_field
from compressive_transformer.core.memory import LayerMemory, MemoryState
from compressive_transformer.core.models.lm import LMOutput
from compressive_transformer.core.models.weight_watch import DeclaresWrites


def label(cfg: ModelConfig) -> str:
    return "WaveNet"


def check_config(cfg: ModelConfig) -> None:
    """WaveNet's rules for a config (run by ``ModelConfig`` through the kinds table)."""
    p, n = "model.", len(cfg.wavenet.dilations)
    require(
        n > 0 and all(isinstance(d, int) and d >= 1 for d in cfg.wavenet.dilations),
        p + "wavenet.dilations",
        "give one dilation per layer, each >= 1 (e.g. [1, 2, 4, 8])",
    )
    require(cfg.n_layers == n, p + "n_layers", f"WaveNet has one layer per dilation; set n_layers = {n}")
    require(
        cfg.memory.mem_len == 0 and cfg.memory.cmem_len == 0,
        p + "memory.mem_len",
        "WaveNet's memory is its receptive field (1 + sum of dilations); set mem_len = 0 and cmem_len = 0",
    )
    require(cfg.input_dim == 0 and cfg.vocab_size > 0, p + "input_dim", "WaveNet reads tokens; set input_dim = 0")


class GatedLayer(nn.Module):
    """One residual layer: dilated causal conv -> tanh * sigmoid gate -> 1x1 to the residual and the skip path."""

    def __init__(self, channels: int, skip: int, dilation: int, dropout: float, *, residual: bool = True) -> None:
        super().__init__()
        self.dilation = dilation
        self.conv = nn.Conv1d(channels, 2 * channels, kernel_size=2, dilation=dilation)
        self.res = nn.Conv1d(channels, channels, 1) if residual else None  # the last layer feeds only the skips
        self.skip = nn.Conv1d(channels, skip, 1)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, past: Tensor) -> tuple[Tensor, Tensor]:
        """x: (B, C, T) this segment's inputs; past: (B, C, d) the d inputs before it (zeros where none).
        Returns the layer's output (B, C, T) and its skip contribution (B, S, T)."""
        filt, gate = self.conv(torch.cat([past, x], dim=2)).chunk(2, dim=1)  # (B, C, T) each
        h = self.drop(torch.tanh(filt) * torch.sigmoid(gate))
        return (x + self.res(h) if self.res is not None else x), self.skip(h)


class WaveNet(DeclaresWrites, nn.Module):
    """Channels: ``d_model`` residual, ``d_ff`` skip; one layer per entry of ``wavenet_dilations``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.dilations = tuple(cfg.wavenet.dilations)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        last = len(self.dilations) - 1
        self.layers = nn.ModuleList(
            GatedLayer(cfg.d_model, cfg.d_ff, d, cfg.dropout, residual=i < last) for i, d in enumerate(self.dilations)
        )
        self.head = nn.Sequential(
            nn.ReLU(), nn.Conv1d(cfg.d_ff, cfg.d_ff, 1), nn.ReLU(), nn.Conv1d(cfg.d_ff, cfg.vocab_size, 1)
        )

    @property
    def receptive_field(self) -> int:
        return receptive_field(self.dilations)

    def init_memory(
        self,
        batch_size: int,
        *,
        mem_len: int | None = None,
        cmem_len: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> MemoryState:
        """Empty receptive-field buffers; ``mem_len``/``cmem_len`` do not apply (the receptive field is fixed)."""
        device = device if device is not None else self.embed.weight.device
        C = self.cfg.d_model
        layers = tuple(
            LayerMemory(
                mem=torch.zeros(batch_size, d, C, device=device, dtype=dtype),
                mem_mask=torch.zeros(batch_size, d, dtype=torch.bool, device=device),
                cmem=torch.zeros(batch_size, 0, C, device=device, dtype=dtype),
                cmem_mask=torch.zeros(batch_size, 0, dtype=torch.bool, device=device),
                mem_len=d,
                fill=0,
            )
            for d in self.dilations
        )
        return MemoryState(layers)

    def forward(
        self,
        inputs: Tensor,
        memory: MemoryState | None = None,
        targets: Tensor | None = None,
        *,
        input_mask: Tensor | None = None,
        need_weights: bool = False,
        compression_loss: bool | None = None,
    ) -> LMOutput:
        """inputs: (B, T) codes. Positions where ``input_mask`` is False (padding) enter every layer as zeros and are
        kept out of the buffers' valid slots, as positions before a stream's start are."""
        B, T = inputs.shape
        if memory is None:
            memory = self.init_memory(B, device=inputs.device)
        mask = torch.ones(B, T, dtype=torch.bool, device=inputs.device) if input_mask is None else input_mask
        x = self.embed(inputs).masked_fill(~mask.unsqueeze(-1), 0.0).transpose(1, 2)  # (B, C, T)
        skips = 0.0
        new_layers = []
        for layer, state in zip(self.layers, memory.layers):
            past = state.mem.masked_fill(~state.mem_mask.unsqueeze(-1), 0.0).transpose(1, 2).to(x.dtype)  # (B, C, d)
            seen = torch.cat([past, x], dim=2)  # (B, C, d + T)
            seen_mask = torch.cat([state.mem_mask, mask], dim=1)  # (B, d + T)
            x, skip = layer(x, past)
            x = x.masked_fill(~mask.unsqueeze(1), 0.0)
            skips = skips + skip
            d = layer.dilation
            new_layers.append(
                LayerMemory(
                    mem=seen[:, :, -d:].transpose(1, 2).detach(),  # (B, d, C) the last d inputs of this layer
                    mem_mask=seen_mask[:, -d:],
                    cmem=state.cmem,
                    cmem_mask=state.cmem_mask,
                    mem_len=d,
                    fill=min(d, state.fill + T),
                )
            )
        logits = self.head(skips).transpose(1, 2)  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(
                logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=IGNORE_INDEX
            )
        zero = logits.new_zeros((), dtype=torch.float32)
        return LMOutput(
            logits=logits,
            loss=loss,
            aux_loss=zero,
            aux_losses=logits.new_zeros(len(self.layers), dtype=torch.float32),
            memory=MemoryState(tuple(new_layers)),
            hidden=skips.transpose(1, 2),
            attentions=None,
        )

    def parameters_of(self, group: str) -> list[nn.Parameter]:
        """Everything is trained by the task loss: no compressor."""
        return [] if group == "compressor" else list(self.parameters())


__all__ = ["GatedLayer", "WaveNet", "receptive_field"]
