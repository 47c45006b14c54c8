"""8-bit μ-law companding as WaveNet quantises audio: a waveform in [-1, 1] becomes one of 256 codes (a byte).

Companding spends the codes where speech spends its amplitude (near zero), so 8 bits carry what linear
quantisation needs about 12 for. Code ``q`` stands for the amplitude :func:`mulaw_decode` gives it, and encoding
that amplitude gives ``q`` back exactly: codes round-trip; waveforms round-trip to within half a code's width.
"""

from __future__ import annotations

import numpy as np

MU = 255  # 256 codes: ids 0..255, the vocabulary of the byte tokenizer


def mulaw_encode(x: np.ndarray, mu: int = MU) -> np.ndarray:
    """Amplitudes (any shape, clipped to [-1, 1]) -> codes 0..mu as uint8 (for mu = 255)."""
    x = np.clip(np.asarray(x, dtype=np.float64), -1.0, 1.0)
    y = np.sign(x) * np.log1p(mu * np.abs(x)) / np.log1p(mu)  # companded, in [-1, 1]
    return np.floor((y + 1.0) / 2.0 * mu + 0.5).astype(np.uint8 if mu < 256 else np.int32)


def mulaw_decode(q: np.ndarray, mu: int = MU) -> np.ndarray:
    """Codes 0..mu -> amplitudes in [-1, 1] (float32); the inverse of :func:`mulaw_encode` on codes."""
    y = 2.0 * np.asarray(q, dtype=np.float64) / mu - 1.0
    x = np.sign(y) * np.expm1(np.abs(y) * np.log1p(mu)) / mu
    return x.astype(np.float32)


__all__ = ["MU", "mulaw_decode", "mulaw_encode"]
