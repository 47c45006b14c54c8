"""labml-nn 0.5.1 (``labml_nn.transformers.compressive``), driven by the code of its own experiment module.

The model is built exactly as ``experiment.autoregressive_model`` builds it (pre-LN layers, labml's
RelativeMultiHeadAttention, FeedForward with ReLU, Conv1dCompression) and trained / evaluated / sampled with the
shipped ``Configs.merge_compress_memory`` and ``AttentionReconstructionLoss`` following ``Configs.step`` and
``Configs.sample``. ``experiment.py`` needs two stubs to import: torchvision (imported by labml_nn.helpers.datasets,
never used here) and ``labml_nn.helpers.metrics.SimpleStateModule``, which that release no longer defines.
"""

from __future__ import annotations

import sys
import types

import torch
import torch.nn.functional as F

from . import stamp

NAME = "labml"
LABEL = "labml-nn 0.5.1"


def _stub_module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)

    def missing(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return type(attr, (), {})

    mod.__getattr__ = missing  # type: ignore[attr-defined]
    sys.modules[name] = mod
    return mod


def _import_experiment():
    try:
        import torchvision  # noqa: F401
    except ImportError:
        tv = _stub_module("torchvision")
        tv.datasets = _stub_module("torchvision.datasets")
        tv.transforms = _stub_module("torchvision.transforms")
    import labml_nn.helpers.metrics as metrics

    if not hasattr(metrics, "SimpleStateModule"):
        metrics.SimpleStateModule = type("SimpleStateModule", (), {})
    from labml_nn.transformers.compressive import experiment

    return experiment


experiment = _import_experiment()
from labml_nn.transformers.compressive import (  # noqa: E402
    AttentionReconstructionLoss,
    CompressiveTransformer,
    CompressiveTransformerLayer,
    Conv1dCompression,
)
from labml_nn.transformers.feed_forward import FeedForward  # noqa: E402
from labml_nn.transformers.xl import RelativeMultiHeadAttention  # noqa: E402


class _Conf:
    """The attributes of ``experiment.Configs`` that ``merge_compress_memory`` reads."""

    def __init__(self, model, mem_len: int, c_mem_len: int, compression_rate: int) -> None:
        self.model, self.mem_len, self.c_mem_len, self.compression_rate = model, mem_len, c_mem_len, compression_rate


class Impl:
    def __init__(self, w, *, mem_len: int | None = None, cmem_len: int | None = None) -> None:
        self.w = w
        d, dropout = w.d_model, 0.0
        self.model = experiment.AutoregressiveModel(
            w.vocab,
            d,
            CompressiveTransformer(
                CompressiveTransformerLayer(
                    d_model=d,
                    self_attn=RelativeMultiHeadAttention(w.n_heads, d, dropout),
                    feed_forward=FeedForward(d, w.d_ff, dropout),
                    dropout_prob=dropout,
                    compress=Conv1dCompression(w.rate, d),
                ),
                w.n_layers,
            ),
        )
        self.conf = _Conf(
            self.model, w.mem_len if mem_len is None else mem_len, w.cmem_len if cmem_len is None else cmem_len, w.rate
        )
        self.ar_loss = AttentionReconstructionLoss(self.model.transformer.layers)
        self.opt = w.optimizer(self.model.parameters())
        self.param_count = sum(p.numel() for p in self.model.parameters())
        self.config = {"norm": "pre", "P (max relative distance)": self.model.transformer.layers[0].self_attn.P}
        self.memory = None

    def merge(self, mem, new_mem):
        return experiment.Configs.merge_compress_memory(self.conf, mem, new_mem)

    def reset(self) -> None:
        self.memory = None

    def prepare(self, x, y):
        return x.t().contiguous(), y.t().contiguous()  # labml is sequence-first: [seq_len, batch]

    def train_step(self, batch) -> float:  # Configs.step, training branch (without its gradient clipping)
        data, target = batch
        self.model.train()
        output, new_mem = self.model(data, self.memory)
        self.memory, mem_to_compress = self.merge(self.memory, new_mem)
        loss = F.cross_entropy(output.view(-1, output.shape[-1]), target.view(-1))
        task = float(loss.detach())
        if mem_to_compress:
            loss = loss + self.ar_loss(new_mem, mem_to_compress)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return task

    @torch.no_grad()
    def eval_step(self, batch) -> float:
        data, target = batch
        self.model.eval()
        output, new_mem = self.model(data, self.memory)
        self.memory, _ = self.merge(self.memory, new_mem)
        return float(F.cross_entropy(output.view(-1, output.shape[-1]), target.view(-1)))

    @torch.no_grad()
    def generate(self, prompt, n_new: int) -> list[float]:
        """Configs.sample: greedy, one token per forward with memory merged/compressed after every step. The prompt
        is read in segments of seq_len first (sample() feeds its short prompt whole; a 4096-token prompt as one
        segment would be a 4096 x 4096 attention)."""
        self.model.eval()
        mem = experiment.CompressedMemory([], [])
        data = prompt.t().contiguous()  # [P, B]
        output = None
        for seg in data.split(self.w.seg_len, dim=0):
            output, new_mem = self.model(seg, mem)
            mem, _ = self.merge(mem, new_mem)
        tok = output[-1].argmax(-1)  # [B]
        stamps = [stamp()]
        for _ in range(n_new - 1):
            output, new_mem = self.model(tok[None, :], mem)
            tok = output[-1].argmax(-1)
            mem, _ = self.merge(mem, new_mem)
            stamps.append(stamp())
        return stamps


def build(w, **kw) -> Impl:
    return Impl(w, **kw)
