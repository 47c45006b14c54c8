"""Sampling with memory: the prompt is read in segments of ``seg_len``, then each new token is one step of length 1
against the memory, so every generated token costs the same (no window is ever recomputed). The steps run on the
ring-buffer :class:`~compressive_transformer.decode.Decoder` where the model has one, else on ``model.forward``."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import torch

from compressive_transformer.config import ConfigError
from compressive_transformer.decode import Decoder, unsupported
from compressive_transformer.precision import autocast


def filter_logits(logits: torch.Tensor, *, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set to -inf every logit outside the ``top_k`` largest and outside the smallest set whose probability
    reaches ``top_p`` (nucleus). ``logits``: (..., V). ``top_k=0`` and ``top_p=1`` keep everything."""
    if top_k < 0:
        raise ConfigError(f"top_k: must be >= 0, got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p: must be in (0, 1], got {top_p}")
    out = logits.clone()
    if 0 < top_k < out.size(-1):
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]  # (..., 1)
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # probability of the tokens ranked strictly above each one
        drop_sorted = mass_before >= top_p  # the token that crosses top_p is kept, so at least one survives
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def sample_next(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token ids (B,) from last-position logits (B, V); ``temperature=0`` is greedy (argmax)."""
    if temperature < 0:
        raise ConfigError(f"temperature: must be >= 0, got {temperature}")
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1)
    probs = filter_logits(logits / temperature, top_k=top_k, top_p=top_p).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@dataclass
class Generation:
    prompt: list[int]
    tokens: list[int]  # the continuation only
    logits: list[torch.Tensor] = field(default_factory=list)  # (V,) the logits each generated token was drawn from


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompt: list[int],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    seg_len: int | None = None,
    mem_len: int | None = None,
    cmem_len: int | None = None,
    keep_logits: bool = False,
    compile: bool = False,
    amp: str | torch.dtype | None = None,
) -> Generation:
    """Continue ``prompt`` (token ids) by ``max_new_tokens`` tokens, carrying memory throughout. ``compile``: run the
    ring-buffer decoder's step under ``torch.compile`` (worth it for long generations: the first token waits for the
    compilation, ~15 s on a small CPU, then each token costs about half as much; ignored for models without one).
    ``amp``: the autocast precision (a resolved name such as "bf16", a dtype, or None for fp32)."""
    if not prompt:
        raise ConfigError("prompt: is empty; give at least one character to start from")
    if max_new_tokens < 0:
        raise ConfigError(f"max_tokens: must be >= 0, got {max_new_tokens}")
    cfg = model.cfg
    seg_len = seg_len or cfg.seg_len
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else secrets.randbits(63))  # leaves the global RNG alone
    was_training = model.training
    model.eval()
    try:
        with autocast(device, amp):  # the prompt, the decoder's steps and their buffers in the run's precision
            memory = model.init_memory(1, mem_len=mem_len, cmem_len=cmem_len, device=device)
            ids = torch.tensor([prompt], dtype=torch.long, device=device)  # (1, P)
            for start in range(0, ids.size(1), seg_len):
                out = model(ids[:, start : start + seg_len], memory=memory)
                memory = out.memory
            last = out.logits[:, -1]  # (1, V)
            decoder = Decoder(model, memory, compile=compile) if unsupported(model) is None else None
            result = Generation(prompt=list(prompt), tokens=[])
            for i in range(max_new_tokens):
                token = sample_next(last, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
                if keep_logits:
                    result.logits.append(last[0].float().cpu())
                result.tokens.append(int(token))
                if i + 1 == max_new_tokens:
                    break
                if decoder is not None:  # T = 1: constant cost per token
                    last = decoder.step(token.view(1))
                else:
                    out = model(token.view(1, 1), memory=memory)
                    memory, last = out.memory, out.logits[:, -1]
            return result
    finally:
        model.train(was_training)
