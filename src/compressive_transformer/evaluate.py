"""Streaming evaluation: the whole split, in order, one pass, memory carried from segment to segment.

The split is divided into ``batch_size`` parallel streams; each row keeps its own memory, which is emptied only at
document boundaries (``batch.reset``). Memory and segment lengths may differ from training: no parameter depends on
them, and longer evaluation memories are how the papers report their best numbers.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from compressive_transformer.data import StreamBatcher


@dataclass(frozen=True)
class EvalResult:
    split: str
    loss: float  # mean negative log-likelihood per predicted token, in nats
    bpc: float  # bits per token (bits per character for byte tokenizers)
    ppl: float  # token perplexity
    word_ppl: float | None  # exp(total NLL / whitespace words of the split); None when only part was evaluated
    tokens: int
    words: int
    segments: int
    complete: bool
    seconds: float
    seg_len: int
    mem_len: int
    cmem_len: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        word = f" word_ppl {self.word_ppl:.2f}" if self.word_ppl is not None else ""
        part = "" if self.complete else " (partial)"
        return f"{self.split}{part}: loss {self.loss:.4f} bpc {self.bpc:.4f} ppl {self.ppl:.2f}{word} over {self.tokens:,} tokens"


def _exp(x: float) -> float:
    return math.exp(x) if x < 700 else float("inf")


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    corpus: Any,
    *,
    split: str = "validation",
    batch_size: int,
    seg_len: int,
    mem_len: int | None = None,
    cmem_len: int | None = None,
    max_batches: int = 0,
    device: torch.device | str | None = None,
    amp_dtype: torch.dtype | None = None,
    progress: bool = False,
) -> EvalResult:
    """Total NLL over every target of ``corpus`` (or the first ``max_batches`` batches), with memory carried."""
    cfg = model.cfg
    mem_len = cfg.mem_len if mem_len is None else mem_len
    cmem_len = cfg.cmem_len if cmem_len is None else cmem_len
    device = torch.device(device) if device is not None else next(model.parameters()).device
    batcher = StreamBatcher(corpus, batch_size=batch_size, seg_len=seg_len, shuffle=False, repeat=False)
    was_training = model.training
    model.eval()
    memory = model.init_memory(batch_size, mem_len=mem_len, cmem_len=cmem_len, device=device)
    total_nll, tokens, segments, complete = 0.0, 0, 0, True
    start = time.perf_counter()
    bar = tqdm(total=max_batches or None, desc=f"eval {split}", unit="seg", disable=not progress, leave=False)
    try:
        for batch in batcher:
            if max_batches and segments >= max_batches:
                complete = False
                break
            if bool(batch.reset.any()):
                memory = memory.reset(batch.reset.to(device))
            targets = batch.targets.to(device)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                out = model(batch.tokens.to(device), memory=memory, input_mask=batch.input_mask.to(device))
            memory = out.memory
            nll = F.cross_entropy(out.logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
            total_nll += float(nll)
            tokens += int((targets != -100).sum())
            segments += 1
            bar.update(1)
            if tokens:
                bar.set_postfix(bpc=f"{total_nll / tokens / math.log(2):.3f}")
    finally:
        bar.close()
        model.train(was_training)
    loss = total_nll / max(tokens, 1)
    words = int(getattr(corpus, "num_words", 0) or 0)
    return EvalResult(
        split=split,
        loss=loss,
        bpc=loss / math.log(2),
        ppl=_exp(loss),
        word_ppl=_exp(total_nll / words) if complete and words else None,
        tokens=tokens,
        words=words,
        segments=segments,
        complete=complete,
        seconds=time.perf_counter() - start,
        seg_len=seg_len,
        mem_len=mem_len,
        cmem_len=cmem_len,
    )
