"""What a score in bits per character means on a given text: the same text scored by a uniform guess over the 256
byte values, by the byte frequencies of the training text, and by zlib. The demo prints them beside its model's
score, so a newcomer can tell whether 3.5 bits/char is good."""

from __future__ import annotations

import math
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from compressive_transformer.data.readers import Document


def _as_bytes(document: Document) -> bytes:
    return document if isinstance(document, bytes) else document.encode("utf-8")


def _characters(document: Document) -> int:
    return len(document.decode("utf-8", errors="replace")) if isinstance(document, bytes) else len(document)


@dataclass(frozen=True)
class ReferenceScores:
    """Bits per character of one text under three simple references, none of them a trained model."""

    uniform: float  # every byte value equally likely: 8 bits per byte
    frequencies: float  # each byte drawn from the training text's byte frequencies (add-one smoothed)
    zlib: float  # the text compressed whole by zlib at level 9

    def line(self, model: float | None = None) -> str:
        """The three scores in one line, with why a uniform guess can score over 8 bits per character (characters of
        several UTF-8 bytes) and, where ``model`` (its bits per character) does not beat zlib, why zlib can win."""
        per_char = self.uniform / 8.0
        several = f"; this text has {per_char:.3f} bytes per character" if per_char > 1.0005 else ""
        text = (
            f"on the same text a uniform guess over the 256 byte values scores {self.uniform:.2f} bits/char "
            f"(8 bits per byte{several}), the training text's character frequencies {self.frequencies:.2f}, zlib -9 "
            f"{self.zlib:.2f} (lower is better; the paper's largest model reaches 0.97 on enwik8)"
        )
        if model is not None and model >= self.zlib:
            text += (
                "; zlib scores below the model here because it reads the whole text before coding it and codes each "
                "repeated phrase as a pointer back to its first copy, while the model predicts each byte from the "
                "context in its memory after minutes of training on a small corpus"
            )
        return text


def reference_scores(train: Sequence[Document], text: Sequence[Document]) -> ReferenceScores:
    """The reference scores of the documents ``text``, with byte frequencies counted on ``train``."""
    data = b"".join(_as_bytes(d) for d in text)
    chars = max(sum(_characters(d) for d in text), 1)
    counts = Counter(b"".join(_as_bytes(d) for d in train))
    total = sum(counts.values()) + 256
    seen = Counter(data)
    nats = -sum(n * math.log((counts[b] + 1) / total) for b, n in seen.items())
    return ReferenceScores(
        uniform=8.0 * len(data) / chars,
        frequencies=nats / math.log(2) / chars,
        zlib=8.0 * len(zlib.compress(data, 9)) / chars,
    )


__all__ = ["ReferenceScores", "reference_scores"]
