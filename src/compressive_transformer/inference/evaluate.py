"""Streaming evaluation: the whole split, in order, one pass, memory carried from segment to segment.

The split is divided into ``batch_size`` parallel streams; each row keeps its own memory, which is emptied only at
document boundaries (``batch.reset``). Memory and segment lengths may differ from training: no parameter depends on
them, and longer evaluation memories are how the papers report their best numbers.
"""

from __future__ import annotations

import itertools
import json
import math
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from compressive_transformer.core.config import ConfigError, eval_lengths
from compressive_transformer.core.constants import IGNORE_INDEX
from compressive_transformer.core.fileio import create_text
from compressive_transformer.core.registry import FORMATS
from compressive_transformer.core.streaming import stream
from compressive_transformer.data import StreamBatcher
from compressive_transformer.data.units import LN2, TextSize, Units, summary_line, units


@dataclass(frozen=True)
class EvalResult:
    """One streaming evaluation. Units come from :mod:`compressive_transformer.data.units`: per-text units (bits per
    character / byte, word perplexity) are None when only part of the text was evaluated."""

    split: str
    loss: float  # mean negative log-likelihood per predicted token, in nats
    bits_per_token: float
    ppl: float  # token perplexity
    bits_per_char: float | None  # total NLL / characters of the text, in bits
    bits_per_byte: float | None  # total NLL / UTF-8 bytes of the text, in bits
    word_ppl: float | None  # exp(total NLL / whitespace words); word and subword tokenizers only
    tokens: int
    chars: int
    bytes: int
    words: int
    segments: int
    complete: bool
    seconds: float
    seg_len: int
    mem_len: int
    cmem_len: int
    tokenizer: str = ""
    token_unit: str = ""  # what a token is when it is not text ("sample" for audio), from the corpus format
    unknown_tokens: int = (
        0  # targets that are the tokenizer's <unk> (a word vocabulary lacks the word): scored as <unk>
    )

    def per_unit(self, prefix: str = "") -> dict[str, float]:
        """``nats_per_sample`` and ``bits_per_sample`` (for audio; nothing for text), keys after ``prefix``."""
        if not self.token_unit:
            return {}
        return {
            f"{prefix}nats_per_{self.token_unit}": self.loss,
            f"{prefix}bits_per_{self.token_unit}": self.bits_per_token,
        }

    @property
    def bpc(self) -> float:
        """Deprecated: this name held bits per *token*; read ``bits_per_token`` or ``bits_per_char``."""
        warnings.warn(
            "EvalResult.bpc is bits per token; use bits_per_token or bits_per_char", DeprecationWarning, stacklevel=2
        )
        return self.bits_per_token

    @property
    def units(self) -> Units:
        return Units(self.loss, self.bits_per_token, self.ppl, self.bits_per_char, self.bits_per_byte, self.word_ppl)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | self.per_unit()

    def summary(self) -> str:
        part = "" if self.complete else " (partial)"
        if self.token_unit:  # one token is one sample: per-character units and word perplexity mean nothing
            u = self.token_unit
            return f"{self.split}{part}: {self.loss:.4f} nats/{u}, {self.bits_per_token:.4f} bits/{u} over {self.tokens:,} {u}s"
        return f"{self.split}{part}: {summary_line(self.units)} over {self.tokens:,} tokens{self._unknown_note()}"

    def _unknown_note(self) -> str:
        """How many scored tokens were ``<unk>``: the score counts predicting ``<unk>`` there, not the words."""
        if not self.unknown_tokens:
            return ""
        share = self.unknown_tokens / max(self.tokens, 1)
        return (
            f" ({self.unknown_tokens:,} of them, {share:.1%}, <unk>: words the vocabulary lacks, scored as <unk>, "
            "not as the words)"
        )


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
    size: TextSize | None = None,
    tokenizer_kind: str | None = None,
    token_unit: str | None = None,
    unknown_id: int | None = None,
) -> EvalResult:
    """Total NLL over every target of ``corpus`` (or the first ``max_batches`` batches), with memory carried.
    ``size`` and ``tokenizer_kind`` (default: the corpus's own) turn it into bits per character / byte and word
    perplexity; ``token_unit`` (default: the corpus format's, "sample" for audio) names what a token is where it is
    not text, and then those per-text units are left out. ``unknown_id``: the tokenizer's ``<unk>`` id, whose
    targets are counted (``unknown_tokens``)."""
    cfg = model.cfg
    _, mem_len, cmem_len = eval_lengths(cfg, mem_len=mem_len, cmem_len=cmem_len)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    batcher = StreamBatcher(corpus, batch_size=batch_size, seg_len=seg_len, shuffle=False, repeat=False)
    total = len(batcher) if not max_batches else min(max_batches, len(batcher))
    complete = total == len(batcher)
    start = time.perf_counter()
    bar = tqdm(total=total, desc=f"eval {split}", unit="seg", disable=not progress, leave=False)
    steps = stream(
        model,
        itertools.islice(batcher, total),
        batch_size=batch_size,
        mem_len=mem_len,
        cmem_len=cmem_len,
        device=device,
        amp_dtype=amp_dtype,
    )
    unit = _token_unit(corpus) if token_unit is None else token_unit
    try:
        total_nll, tokens, unknown, segments = _sums(steps, device, unknown_id, bar, unit or "token")
    finally:
        steps.close()
        bar.close()
    if not tokens:  # a score over no prediction is no score: 0.0 recorded as complete would read as perfect
        raise ConfigError(
            f"{split}: holds no token to predict (a document's first token is only context, so each needs at "
            "least 2); give longer text"
        )
    size = size if size is not None else getattr(corpus, "size", None)
    if size is None or unit:  # one token is one sample: characters, bytes and words of it mean nothing
        size = TextSize(words=int(getattr(corpus, "num_words", 0) or 0) if not unit else 0)
    kind = tokenizer_kind if tokenizer_kind is not None else str(getattr(corpus, "tokenizer_kind", ""))
    u = units(total_nll, tokens, size, tokenizer_kind=kind, complete=complete)
    return EvalResult(
        split=split,
        loss=u.loss,
        bits_per_token=u.bits_per_token,
        ppl=u.ppl,
        bits_per_char=u.bits_per_char,
        bits_per_byte=u.bits_per_byte,
        word_ppl=u.word_ppl,
        tokens=tokens,
        chars=size.chars,
        bytes=size.bytes,
        words=size.words,
        segments=segments,
        complete=complete,
        seconds=time.perf_counter() - start,
        seg_len=seg_len,
        mem_len=mem_len,
        cmem_len=cmem_len,
        tokenizer=kind,
        token_unit=unit,
        unknown_tokens=unknown,
    )


def _sums(steps: Any, device: torch.device, unknown_id: int | None, bar: Any, unit: str) -> tuple[float, int, int, int]:
    """The summed NLL, targets, ``<unk>`` targets and segments of a stream of steps (summed on the device: no host
    synchronisation per segment; the bar shows the running figure, in bits per ``unit``, now and then)."""
    total_nll = torch.zeros((), dtype=torch.float64, device=device)
    tokens = torch.zeros((), dtype=torch.long, device=device)
    unknown = torch.zeros((), dtype=torch.long, device=device)
    segments = 0
    for step in steps:
        targets = step.batch.targets.to(device)
        logits = step.out.logits.float().flatten(0, 1)
        total_nll += F.cross_entropy(logits, targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
        tokens += (targets != IGNORE_INDEX).sum()
        if unknown_id is not None:
            unknown += (targets == unknown_id).sum()
        segments += 1
        bar.update(1)
        if not bar.disable and segments % 16 == 1:
            bar.set_postfix({f"bits_per_{unit}": f"{float(total_nll) / max(int(tokens), 1) / LN2:.3f}"})
    return float(total_nll), int(tokens), int(unknown), segments


def _token_unit(corpus: Any) -> str:
    """The corpus format's token unit, where the corpus records its format (a cached split does)."""
    fmt = ((getattr(corpus, "meta", None) or {}).get("key") or {}).get("format")
    return FORMATS[fmt].token_unit if fmt in FORMATS else ""


def write_eval_record(path: Path, record: dict[str, Any]) -> Path:
    """Write an evaluation record as JSON (infinities as strings: JSON has none) into a new file: ``path``, or the
    next free name where another result took it meanwhile (two evaluations of one run never replace each other's).
    Returns the file written."""
    safe = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in record.items()}
    return create_text(path, json.dumps(safe, indent=2) + "\n")
