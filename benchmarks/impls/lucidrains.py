"""lucidrains/compressive-transformer-pytorch 0.4.0 (package ``compressive_transformer_pytorch``), as shipped.

Configured to the workload: same width, depth, heads, FFN (mult 4 = d_ff / d_model), n_s, n_m, n_cm, c; no GRU gating
(``gru_gated_residual=False``), no enhanced recurrence, no Mogrifier, no dropout; conv compression and its
attention-reconstruction loss (weight 1) as it ships. Training uses its own loss recipe (cross-entropy + aux_loss,
as in its README/AutoregressiveWrapper); generation uses ``AutoregressiveWrapper.generate`` unmodified.

``FIX_KV_DETACH = True`` (impl ``lucidrains_fixed``) re-enables ``requires_grad`` on every ``to_kv.weight`` before each
training forward, undoing the in-place ``self.to_kv.weight.detach_()`` of its SelfAttention.forward, which otherwise
freezes the key/value projections for good after the first compression.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from compressive_transformer_pytorch import AutoregressiveWrapper, CompressiveTransformer
from torch import nn

from . import stamp

NAME = "lucidrains"
LABEL = "compressive-transformer-pytorch 0.4.0 (as shipped)"
FIX_KV_DETACH = False


class _StampedNet(nn.Module):
    """Wraps the network so the wrapper's generate loop can be timed call by call (no behaviour change)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.seq_len = net.seq_len
        self.stamps: list[float] = []

    def forward(self, *args, **kwargs):
        out = self.net(*args, **kwargs)
        self.stamps.append(stamp())
        return out


class Impl:
    def __init__(self, w, *, mem_len: int | None = None, cmem_len: int | None = None, fix: bool = False) -> None:
        self.w = w
        self.fix = fix
        self.model = CompressiveTransformer(
            num_tokens=w.vocab,
            dim=w.d_model,
            seq_len=w.seg_len,
            depth=w.n_layers,
            heads=w.n_heads,
            mem_len=w.mem_len if mem_len is None else mem_len,
            cmem_len=w.cmem_len if cmem_len is None else cmem_len,
            cmem_ratio=w.rate,
            enhanced_recurrence=False,
            gru_gated_residual=False,
            mogrify_gru=False,
            attn_dropout=0.0,
            ff_dropout=0.0,
            attn_layer_dropout=0.0,
            reconstruction_attn_dropout=0.0,
            reconstruction_loss_weight=1.0,
        )
        assert w.d_ff == 4 * w.d_model, "compressive-transformer-pytorch hard-codes the FFN width as 4 * dim"
        self.opt = w.optimizer(self.model.parameters())
        self.param_count = sum(p.numel() for p in self.model.parameters())
        self.config = {"gru_gated_residual": False, "enhanced_recurrence": False, "fix_kv_detach": fix}
        self.memory = None

    def reset(self) -> None:
        self.memory = None

    def prepare(self, x, y):
        return x, y

    def frozen_kv(self) -> int:
        if self.fix:  # re-enabled before every forward
            return 0
        return sum(1 for layer in self.model.attn_layers if not layer.fn.fn.to_kv.weight.requires_grad)

    def train_step(self, batch) -> float:
        x, y = batch
        self.model.train()
        if self.fix:
            for layer in self.model.attn_layers:
                layer.fn.fn.to_kv.weight.requires_grad_(True)
        logits, self.memory, aux_loss = self.model(x, memories=self.memory)
        loss = F.cross_entropy(logits.transpose(1, 2), y)
        self.opt.zero_grad(set_to_none=True)
        (loss + aux_loss).backward()
        self.opt.step()
        return float(loss.detach())

    @torch.no_grad()
    def eval_step(self, batch) -> float:
        x, y = batch
        self.model.eval()
        logits, self.memory, _ = self.model(x, memories=self.memory)
        return float(F.cross_entropy(logits.transpose(1, 2), y))

    @torch.no_grad()
    def generate(self, prompt, n_new: int) -> list[float]:
        net = _StampedNet(self.model)
        wrapper = AutoregressiveWrapper(net)
        n_primes = -(-prompt.shape[1] // self.w.seg_len) - 1  # segments it reads before its generation loop
        wrapper.generate(prompt, n_new)
        stamps = net.stamps[n_primes:]  # one per new token; the first also finishes reading the prompt
        assert len(stamps) == n_new, (len(stamps), n_new)
        return stamps


def build(w, **kw) -> Impl:
    return Impl(w, fix=FIX_KV_DETACH, **kw)
