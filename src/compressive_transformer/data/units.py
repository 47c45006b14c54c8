"""The one place a total negative log-likelihood becomes the units people report.

A model's loss is in nats per *token*, and a token is a byte, a subword or a word depending on the tokenizer, so
numbers from different tokenizers compare only once divided by something the tokenizer does not choose: the
text's characters or UTF-8 bytes (bits per character / per byte), or its whitespace words (word-level perplexity).
Word perplexity is reported only for word and subword tokenizers: a byte-level model's score is read per byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable

Document = str | bytes
LN2 = math.log(2)
BYTE_LEVEL = ("bytes",)  # tokenizer kinds whose tokens are bytes: no word-level perplexity


@dataclass(frozen=True)
class TextSize:
    """Characters, UTF-8 bytes and whitespace-separated words of a text: the denominators of the reported units."""

    chars: int = 0
    bytes: int = 0
    words: int = 0

    def __add__(self, other: "TextSize") -> "TextSize":
        return TextSize(self.chars + other.chars, self.bytes + other.bytes, self.words + other.words)

    def to_dict(self) -> dict[str, int]:
        return {"chars": self.chars, "bytes": self.bytes, "words": self.words}


def text_size(doc: Document) -> TextSize:
    """The size of one document; bytes that are not UTF-8 count one character each (as enwik8 is scored)."""
    if isinstance(doc, bytes):
        try:
            chars = len(doc.decode("utf-8"))
        except UnicodeDecodeError:
            chars = len(doc)
        return TextSize(chars, len(doc), len(doc.split()))
    return TextSize(len(doc), len(doc.encode("utf-8")), len(doc.split()))


def texts_size(docs: Iterable[Document]) -> TextSize:
    total = TextSize()
    for d in docs:
        total = total + text_size(d)
    return total


def exp_or_inf(x: float) -> float:
    return math.exp(x) if x < 700 else float("inf")


def has_words(tokenizer_kind: str) -> bool:
    """Whether word-level perplexity means something for this tokenizer (words or subwords, not bytes)."""
    return tokenizer_kind not in BYTE_LEVEL


@dataclass(frozen=True)
class Units:
    """Every reported unit of one measurement. Per-text units are None when only part of the text was scored
    (their denominators are the whole text's)."""

    loss: float  # nats per predicted token
    bits_per_token: float
    ppl: float  # token perplexity
    bits_per_char: float | None
    bits_per_byte: float | None
    word_ppl: float | None  # exp(total NLL / whitespace words); word and subword tokenizers only

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def units(total_nll: float, tokens: int, size: TextSize | None, *, tokenizer_kind: str, complete: bool = True) -> Units:
    """Convert a total NLL (nats) over ``tokens`` predicted tokens of a text of ``size`` into every unit."""
    loss = total_nll / max(tokens, 1)
    whole = complete and size is not None
    return Units(
        loss=loss,
        bits_per_token=loss / LN2,
        ppl=exp_or_inf(loss),
        bits_per_char=total_nll / size.chars / LN2 if whole and size.chars else None,
        bits_per_byte=total_nll / size.bytes / LN2 if whole and size.bytes else None,
        word_ppl=exp_or_inf(total_nll / size.words) if whole and size.words and has_words(tokenizer_kind) else None,
    )


def summary_line(u: Units) -> str:
    """``loss 1.2345 nats/token, 1.78 bits/token, 1.21 bits/char, word ppl 43.1`` (only the units that exist)."""
    parts = [f"loss {u.loss:.4f} nats/token", f"{u.bits_per_token:.4f} bits/token"]
    if u.bits_per_char is not None:
        parts.append(f"{u.bits_per_char:.4f} bits/char")
    if u.bits_per_byte is not None and u.bits_per_byte != u.bits_per_char:
        parts.append(f"{u.bits_per_byte:.4f} bits/byte")
    if u.word_ppl is not None:
        parts.append(f"word ppl {u.word_ppl:.2f}")
    return ", ".join(parts)


__all__ = ["TextSize", "Units", "text_size", "texts_size", "units", "has_words", "summary_line", "exp_or_inf", "LN2"]
