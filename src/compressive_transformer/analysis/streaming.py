"""How the analyses read a token stream: batches of streams with memory carried, and positions traced back.

Every analysis accepts a 1-D token array (one document), a :class:`~compressive_transformer.data.cache.Corpus` or an
already built :class:`~compressive_transformer.data.StreamBatcher`. Streaming the *indices* ``0..N-1`` through a
batcher instead of the ids tells, for every batch cell, which token of the flat array it holds and which it must
predict; that is how per-token losses are mapped back to words without touching the batcher's internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from compressive_transformer.data import IGNORE_INDEX, StreamBatcher


@dataclass
class IndexedBatch:
    tokens: torch.Tensor  # (B, T) ids
    targets: torch.Tensor  # (B, T) ids, IGNORE_INDEX where there is none
    input_mask: torch.Tensor  # (B, T) bool
    reset: torch.Tensor  # (B,) bool
    positions: torch.Tensor | None  # (B, T) index into the flat token array of each input, -1 for padding
    target_positions: torch.Tensor | None  # (B, T) index of each target, -1 where there is none


def _flat(source: Any) -> tuple[np.ndarray, np.ndarray]:
    tokens = source.tokens if hasattr(source, "tokens") else source
    tokens = np.asarray(tokens.numpy() if isinstance(tokens, torch.Tensor) else tokens)  # a memmap stays on disk
    offsets = np.asarray(source.doc_offsets) if hasattr(source, "doc_offsets") else np.array([0, len(tokens)])
    return tokens, offsets


def _gather(tokens: np.ndarray, positions: torch.Tensor) -> torch.Tensor:
    """tokens[positions] as int64 (negative positions read index 0; the caller masks them)."""
    return torch.from_numpy(np.asarray(tokens[positions.clamp(min=0).numpy()], dtype=np.int64))


def stream_batches(
    source: Any, *, batch_size: int, seg_len: int, max_segments: int = 0, track_positions: bool = False
) -> Iterator[IndexedBatch]:
    """Batches of ``batch_size`` streams over ``source`` in order (no shuffle, one pass), at most ``max_segments``.

    A given :class:`StreamBatcher` is used as is (its own batch size and segment length; positions unavailable).
    """
    if isinstance(source, StreamBatcher):
        if track_positions:
            raise ValueError("track_positions needs the token array or corpus, not a StreamBatcher")
        for i, b in enumerate(source):
            if max_segments and i >= max_segments:
                return
            yield IndexedBatch(b.tokens, b.targets, b.input_mask, b.reset, None, None)
        return
    tokens, offsets = _flat(source)
    index = StreamBatcher(
        np.arange(len(tokens), dtype=np.int64), offsets, batch_size=batch_size, seg_len=seg_len, pad_id=-1
    )
    for i, b in enumerate(index):
        if max_segments and i >= max_segments:
            return
        pos = torch.where(b.input_mask, b.tokens, torch.full_like(b.tokens, -1))
        tgt_pos = torch.where(b.targets != IGNORE_INDEX, b.targets, torch.full_like(b.targets, -1))
        toks = torch.where(pos >= 0, _gather(tokens, pos), torch.zeros_like(pos))
        tgts = torch.where(tgt_pos >= 0, _gather(tokens, tgt_pos), torch.full_like(tgt_pos, IGNORE_INDEX))
        yield IndexedBatch(
            toks, tgts, b.input_mask, b.reset, pos if track_positions else None, tgt_pos if track_positions else None
        )
