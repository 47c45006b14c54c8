"""Sampling with memory: the prompt is read in segments of ``seg_len``, then each new token is one step of length 1
against the memory, so every generated token costs the same (no window is ever recomputed). The steps run on the
ring-buffer :class:`~compressive_transformer.core.models.decode.Decoder` where the model has one, else on ``model.forward``."""

from __future__ import annotations

import math
import numbers
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.dtypes import autocast
from compressive_transformer.core.memory import MemoryState
from compressive_transformer.core.models.checks import check_token_ids
from compressive_transformer.core.models.decode import unsupported
from compressive_transformer.core.registry import model_kind


def check_sampling(*, max_tokens: int = 0, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> None:
    """Refuse sampling settings that cannot work or contradict each other, in one line naming the option: a
    temperature that is not a finite number >= 0, top_k < 0, top_p outside (0, 1], max_tokens < 0, and top_k /
    top_p together with temperature 0 (greedy decoding ignores them, which would hide the mistake)."""
    for name, value in (("temperature", temperature), ("top_p", top_p)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ConfigError(f"{name}: must be a finite number, got {value!r}")
    for name, value in (("top_k", top_k), ("max_tokens", max_tokens)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ConfigError(f"{name}: must be an integer, got {value!r}")
    if temperature < 0:
        raise ConfigError(f"temperature: must be >= 0 (0 is greedy), got {temperature}")
    if top_k < 0:
        raise ConfigError(f"top_k: must be >= 0 (0 keeps all tokens), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p: must be in (0, 1] (1 keeps all tokens), got {top_p}")
    if max_tokens < 0:
        raise ConfigError(f"max_tokens: must be >= 0, got {max_tokens}")
    if temperature == 0 and (top_k > 0 or top_p < 1.0):
        raise ConfigError(
            "temperature: 0 is greedy decoding, which ignores top_k and top_p; drop them or set temperature > 0"
        )


def check_logits(logits: Any) -> None:
    """What :meth:`SamplingConfig.sample` draws from, checked (one host sync: this is the public door, not the
    decoder's loop): a floating (B, V) tensor with V >= 1, no NaN, and in each row a token that is not ``-inf``."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError(
            f"logits: expected a floating tensor of shape (B, V), got {type(logits).__name__}"
            + (f" of {logits.dtype}" if isinstance(logits, torch.Tensor) else "")
        )
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(
            f"logits: expected shape (B, V), the last position's logits of each row, got {tuple(logits.shape)}; "
            "take logits[:, -1] of the model's (B, T, V)"
        )
    if bool(torch.isnan(logits).any()):
        raise ValueError(
            f"logits: {int(torch.isnan(logits).sum()):,} of {logits.numel():,} are NaN; nothing can be drawn"
        )
    if bool((logits == float("-inf")).all(dim=-1).any()):
        raise ValueError("logits: a row is -inf everywhere (every token masked); nothing can be drawn from it")


def clean_prompt(prompt: str | bytes) -> str:
    """A prompt as valid text: bytes that are not UTF-8 (a command line passes them as surrogate escapes) become
    U+FFFD, so tokenizers and printing never fail on them."""
    if isinstance(prompt, bytes):
        return prompt.decode("utf-8", errors="replace")
    return prompt.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")


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
    if not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"temperature: must be a finite number >= 0, got {temperature}")
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(-1)
    probs = filter_logits(logits / temperature, top_k=top_k, top_p=top_p).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@dataclass(frozen=True)
class SamplingConfig:
    """How each next token is drawn, checked when made: ``temperature`` (0 is greedy), ``top_k`` (0 keeps every
    token), ``top_p`` (nucleus mass; 1 keeps every token). The one way sampling settings enter: ``generate``,
    ``generate_text``, ``generate_run`` and the audio generation each take one (``sampling=``), and the ``generate``
    command builds it from its flags."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        check_sampling(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def sample(self, logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Next token ids (B,) from last-position logits (B, V): floating, with no NaN and at least one token
        possible in each row (``-inf`` masks a token), else a one-line ``ValueError``."""
        check_logits(logits)
        return sample_next(
            logits, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, generator=generator
        )


@dataclass
class Generation:
    prompt: list[int]
    tokens: list[int]  # the continuation only
    logits: list[torch.Tensor] = field(default_factory=list)  # (V,) the logits each generated token was drawn from
    memory: MemoryState | None = None  # with return_memory: the state after every token, the last one included
    next_logits: torch.Tensor | None = None  # with return_memory: (V,) the logits the next token would be drawn from


def _decoder(model: torch.nn.Module, memory: MemoryState, compile: bool | None) -> Any:
    """The model kind's token-by-token decoder over ``memory``, or None (then each step runs ``model.forward``). On a
    GPU its steps are compiled (unless ``compile`` is False) and replayed as CUDA graphs: a token is one launch of
    fused kernels rather than a few hundred small ones."""
    make = model_kind(model.cfg).decoder if unsupported(model) is None else None
    if make is None:
        return None
    cuda = memory.layers[0].mem.device.type == "cuda"
    return make(model, memory, compile=cuda if compile is None else compile, cuda_graphs=cuda)


def prompt_ids(prompt: Any) -> list[int]:
    """A prompt as a list of token ids: a sequence of whole numbers, or a tensor of integers holding one prompt
    ((P,) or (1, P)); anything else (text, floats, a batch of prompts) is a one-line ``ValueError``."""
    if isinstance(prompt, torch.Tensor):
        if prompt.is_floating_point() or prompt.is_complex() or prompt.dtype == torch.bool:
            raise ValueError(f"prompt: token ids must be integers (torch.long), got {prompt.dtype}")
        if prompt.dim() > 2 or (prompt.dim() == 2 and prompt.shape[0] != 1):
            raise ValueError(f"prompt: expected one prompt of shape (P,) or (1, P), got shape {tuple(prompt.shape)}")
        return [int(x) for x in prompt.reshape(-1).tolist()]
    if isinstance(prompt, (str, bytes)):
        raise ValueError("prompt: expected token ids, got text; encode it first (run.encode(text))")
    items = list(prompt)
    bad = next((x for x in items if isinstance(x, bool) or not isinstance(x, numbers.Integral)), None)
    if bad is not None:
        raise ValueError(f"prompt: token ids must be whole numbers, got {bad!r}; encode text with run.encode(text)")
    return [int(x) for x in items]


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompt: list[int],
    *,
    max_new_tokens: int,
    sampling: SamplingConfig | None = None,
    seed: int | None = None,
    seg_len: int | None = None,
    mem_len: int | None = None,
    cmem_len: int | None = None,
    memory: MemoryState | None = None,
    next_logits: torch.Tensor | None = None,
    on_token: Callable[[int], bool] | None = None,
    keep_logits: bool = False,
    return_memory: bool = False,
    compile: bool | None = None,
    amp: str | torch.dtype | None = None,
) -> Generation:
    """Continue ``prompt`` (token ids) by ``max_new_tokens`` tokens drawn as ``sampling`` says (default: the model's
    distribution as it is, temperature 1), carrying memory throughout; ``seed`` makes the draws reproducible.

    The prompt is read in segments of ``seg_len`` (default the model's) with memories of ``mem_len`` and
    ``cmem_len`` slots (default the model's). To continue an earlier generation, pass its ``memory`` and
    ``next_logits`` (from ``return_memory=True``): the prompt, which may then be empty, is read after that state.
    ``on_token`` sees each token as it is drawn and stops the generation by returning False; ``keep_logits`` keeps
    the logits each token was drawn from. ``compile``: the decoder's step under ``torch.compile`` (the first tokens
    wait for the compilation of its two graphs; ignored for models without a decoder); None: on a GPU, where the
    compiled step is also replayed as a CUDA graph, and not on a CPU. ``amp``: the autocast precision (a resolved
    name such as "bf16", a dtype, or None for fp32)."""
    prompt = prompt_ids(prompt)
    if not prompt and (memory is None or next_logits is None):
        raise ConfigError("prompt: is empty; give at least one character to start from")
    check_sampling(max_tokens=max_new_tokens)
    sampling = sampling if sampling is not None else SamplingConfig()
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else secrets.randbits(63))  # leaves the global RNG alone
    was_training = model.training
    model.eval()
    try:
        with autocast(device, amp):  # the prompt, the decoder's steps and their buffers in the run's precision
            if memory is None:
                memory, last = model.init_memory(1, mem_len=mem_len, cmem_len=cmem_len, device=device), None
            else:
                memory = memory.to(device)
                last = next_logits.to(device).reshape(1, -1) if next_logits is not None else None
            memory, last = _read_prompt(model, prompt, memory, last, seg_len or model.cfg.seg_len)
            steps = _Steps(model, memory, _decoder(model, memory, compile))
            result = Generation(prompt=list(prompt), tokens=[])
            for i in range(max_new_tokens):
                token = sampling.sample(last, generator)
                if keep_logits:
                    result.logits.append(last[0].float().cpu())
                result.tokens.append(int(token))
                stopped = on_token is not None and on_token(int(token)) is False
                done = stopped or i + 1 == max_new_tokens
                if done and not return_memory:
                    break
                last = steps(token)
                if done:
                    break
            if return_memory:
                result.memory, result.next_logits = steps.memory(), last[0].float()
            return result
    finally:
        model.train(was_training)


def _read_prompt(
    model: torch.nn.Module, prompt: list[int], memory: MemoryState, last: torch.Tensor | None, seg_len: int
) -> tuple[MemoryState, torch.Tensor | None]:
    """Run the prompt through the model in segments of ``seg_len``: the memory after it and the last logits (1, V)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], dtype=torch.long)  # (1, P)
    if model.cfg.input_dim == 0:
        check_token_ids(model.cfg, ids, None)  # on the host, before the device sees them
    ids = ids.to(device)
    for start in range(0, ids.size(1), seg_len):
        out = model(ids[:, start : start + seg_len], memory=memory)
        memory, last = out.memory, out.logits[:, -1]
    return memory, last


class _Steps:
    """One new token at a time (T = 1, constant cost per token): through the model kind's decoder where it has one,
    else through ``model.forward`` with the memory carried."""

    def __init__(self, model: torch.nn.Module, memory: MemoryState, decoder: Any) -> None:
        self.model, self.state, self.decoder = model, memory, decoder

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        """The logits (1, V) after ``token`` (a 0-d or (1,) id tensor)."""
        if self.decoder is not None:
            return self.decoder.step(token.view(1))
        out = self.model(token.view(1, 1), memory=self.state)
        self.state = out.memory
        return out.logits[:, -1]

    def memory(self) -> MemoryState:
        return self.decoder.memory() if self.decoder is not None else self.state
