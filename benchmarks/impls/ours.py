"""Our CompressiveTransformerLM (``compressive_transformer``) on a benchmark workload."""

from __future__ import annotations

import contextlib
from unittest import mock

import torch

from compressive_transformer import CompressionConfig, CompressiveTransformerLM, MemoryConfig, ModelConfig
from compressive_transformer.core import graphs
from compressive_transformer.core.config import TrainConfig
from compressive_transformer.core.graphs import StaticGraphs
from compressive_transformer.core.models.decode import Decoder
from compressive_transformer.training import step as training

from . import stamp

NAME = "ours"
LABEL = "ours (compressive)"


def model_config(
    w,
    *,
    compressive: bool = True,
    mem_len: int | None = None,
    cmem_len: int | None = None,
    attn_impl: str = "auto",
) -> ModelConfig:
    mem = w.mem_len if mem_len is None else mem_len
    cmem = w.cmem_len if cmem_len is None else cmem_len
    if not compressive:  # Transformer-XL with the same attention size: the compressed slots become plain memory
        mem, cmem = mem + cmem, 0
    return ModelConfig(
        vocab_size=w.vocab,
        d_model=w.d_model,
        n_layers=w.n_layers,
        n_heads=w.n_heads,
        d_ff=w.d_ff,
        seg_len=w.seg_len,
        memory=MemoryConfig(mem_len=mem, cmem_len=cmem),
        compression=CompressionConfig(rate=w.rate, function="conv", loss="attention"),
        dropout=0.0,
        attn_dropout=0.0,
        attn_impl=attn_impl,
    )


class Impl:
    def __init__(self, w, cfg: ModelConfig, *, compile: bool = False, graphs: bool = False) -> None:
        self.w = w
        self.model = CompressiveTransformerLM(cfg)
        # compile: the training step through train.compile's torch.compile, as `train.compile = true` runs it
        # (the trainer's validation is eager, and so is eval_step here); with graphs, compiled and captured
        self.compile = compile
        self.step: training.TrainingStep | None = None  # the trainer's own step, made on first use
        self.opt = w.optimizer(self.model.parameters())
        self.param_count = sum(p.numel() for p in self.model.parameters())
        self.config = {k: getattr(cfg, k) for k in ("norm", "attn_impl")}
        self.config |= {"mem_len": cfg.memory.mem_len, "cmem_len": cfg.memory.cmem_len}
        self.config |= {"compression": cfg.compression.function, "compression_loss": cfg.compression.loss}
        self.config["compiled_steps"] = compile
        self.config["cuda_graphs"] = graphs
        self.memory = None
        self.compile_decoder = False  # ours_compiled: the decoder's step under torch.compile
        # graphs: training as train.cuda_graphs runs it (the update replayed as one CUDA graph, clipping off as the
        # peers run), evaluation and the decoder's steps replayed likewise
        self.graphs = graphs
        self.eval_graphs = None

    def _training_step(self) -> training.TrainingStep:
        """The step as the trainer builds it (``training.step.training_step``), made on first use, once the model is
        on its device and the step runs under the child's autocast: under bf16 the kept bf16 weight copies, compiled
        and / or captured as asked, clipping off as the peers run, the optimizer the workload gives every
        implementation."""
        if self.step is None:
            device = next(self.model.parameters()).device
            bf16 = torch.is_autocast_enabled(device.type) and torch.get_autocast_dtype(device.type) == torch.bfloat16
            t = TrainConfig(compile=self.compile, cuda_graphs=self.graphs, grad_clip=0.0)
            cpu = device.type == "cpu"
            if cpu and self.graphs:  # a dry run: the recorded stand-in for the capture, allowed on the CPU
                graphs.DEFAULT_GRAPH = graphs.RecordedGraph
            allow = mock.patch.object(training, "capture_reason", lambda *a: None) if cpu else contextlib.nullcontext()
            with allow:
                self.step = training.training_step(
                    self.model, t, device, "bf16" if bf16 else "none", optimizer=self.opt
                )
            if self.graphs:
                self.eval_graphs = StaticGraphs(self._eval)
        return self.step

    def _eval(self, inputs, memory):
        x, y = inputs
        out = self.model(x, memory=memory, targets=y)
        return out.loss, out.memory

    def reset(self) -> None:
        self.memory = None

    def prepare(self, x, y):
        return x, y

    def train_step(self, batch) -> float:
        x, y = batch
        self.model.train()
        if self.memory is None:
            self.memory = self.model.init_memory(x.shape[0])
        step = self._training_step()
        if step.captured is not None:
            (stats, _), self.memory = step.captured(x, y, torch.ones_like(x, dtype=torch.bool), self.memory)
            return float(stats[0])
        out = step.forward(x, memory=self.memory, targets=y)
        loss = out.loss + out.aux_loss
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if step.low_precision is not None:
            step.low_precision.refresh()
        self.memory = out.memory
        return float(out.loss.detach())

    @torch.no_grad()
    def eval_step(self, batch) -> float:
        x, y = batch
        self.model.eval()
        if self.memory is None:
            self.memory = self.model.init_memory(x.shape[0])
        if self.graphs:
            self._training_step()
            loss, self.memory = self.eval_graphs((x, y), self.memory)
            return float(loss)
        out = self.model(x, memory=self.memory, targets=y)
        self.memory = out.memory
        return float(out.loss)

    @torch.no_grad()
    def generate(self, prompt, n_new: int) -> list[float]:
        self.model.eval()
        memory = self.model.init_memory(prompt.shape[0])
        logits = None
        for seg in prompt.split(self.w.seg_len, dim=1):  # the prompt in segments of seg_len, memory carried
            out = self.model(seg, memory=memory)
            memory, logits = out.memory, out.logits
        tok = logits[:, -1].argmax(-1)
        decoder = Decoder(self.model, memory, compile=self.compile_decoder, cuda_graphs=self.graphs)  # generate()'s
        stamps = [stamp()]
        for _ in range(n_new - 1):  # then one token per step
            tok = decoder.step(tok).argmax(-1)
            stamps.append(stamp())
        return stamps


def build(w, **kw) -> Impl:
    geometry = {k: kw.pop(k) for k in ("mem_len", "cmem_len", "attn_impl") if k in kw}
    return Impl(w, model_config(w, compressive=True, **geometry), **kw)
