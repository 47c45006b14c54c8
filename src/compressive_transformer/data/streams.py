"""The Transformer-XL batch of streams: B parallel rows, each a contiguous run of documents, cut into segments.

Row ``b`` of consecutive batches continues the same text, so the model's memory of row ``b`` carries context from
one segment to the next. Every document starts at a segment boundary with ``reset[b] = True`` (its memory must be
cleared first); its last segment is padded. A corpus of one document (enwik8, WikiText) is cut into B contiguous
pieces instead, the classic ``batchify``, and targets cross the piece ends, so no prediction is lost.

The layout of an epoch is a pure function of (token counts, B, T, shuffle, seed, epoch), so the iterator state is
just (epoch, step) and a resumed iterator yields exactly the batches the original would have.
"""

from __future__ import annotations

import heapq
import mmap
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.constants import IGNORE_INDEX


@dataclass
class Batch:
    """One segment of every stream."""

    tokens: torch.Tensor  # (B, T) int64 inputs, pad id where input_mask is False
    targets: torch.Tensor  # (B, T) int64 next tokens, IGNORE_INDEX where there is none
    input_mask: torch.Tensor  # (B, T) bool, True for real tokens (padding must never enter memory)
    reset: torch.Tensor  # (B,) bool, True where a new document (or piece) starts in this segment
    epoch: int
    step: int  # segment index within the epoch

    @property
    def num_tokens(self) -> int:
        return int(self.input_mask.sum())

    @property
    def num_targets(self) -> int:
        return int((self.targets != IGNORE_INDEX).sum())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Batch(
            move(self.tokens), move(self.targets), move(self.input_mask), move(self.reset), self.epoch, self.step
        )


@dataclass(frozen=True)
class _Layout:
    """Where every stream's pieces lie in the token array, for one epoch."""

    starts: list[np.ndarray]  # per stream: first input token of each piece
    ends: list[np.ndarray]  # per stream: one past the last input token of each piece
    limits: list[np.ndarray]  # per stream: end of the document the piece belongs to (targets stop there)
    seg0: list[np.ndarray]  # per stream: first segment of each piece, plus the stream's total segment count

    @property
    def num_segments(self) -> int:
        return max((int(s[-1]) for s in self.seg0), default=0)


RELEASE_BYTES = 64 << 20  # token bytes read between releases of the mapped pages read so far


def release_pages(tokens: np.ndarray) -> None:
    """Drop the pages of a memory-mapped token array that this process has read from its resident set (they stay
    in the kernel's page cache and are read back from there when needed), so that training's memory does not grow
    with the part of a corpus of many GB it has read; a no-op for arrays in memory."""
    mapping = getattr(tokens, "_mmap", None)  # a numpy memmap's own mapping (shared by its views)
    if mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
        mapping.madvise(mmap.MADV_DONTNEED)


class StreamBatcher:
    """Iterate ``Batch``es of ``batch_size`` streams and ``seg_len`` tokens over a tokenized corpus.

    ``source`` is a :class:`~compressive_transformer.data.cache.Corpus` (anything with ``tokens`` and
    ``doc_offsets``) or a 1-D token array with ``doc_offsets`` given (omitted: one document). ``repeat=True`` loops
    over epochs for training (reshuffled each epoch when ``shuffle``); ``repeat=False`` is one pass for evaluation.

    ``piece_len > 0`` cuts every document of a multi-document corpus into consecutive pieces of at most that many
    tokens, dealt (and shuffled) like documents, each starting with a memory reset; the last token of a piece still
    predicts the first of the next. A corpus of a few long books then fills every stream instead of leaving the
    rows that drew short books as padding until the longest book ends.
    """

    def __init__(
        self,
        source: Any,
        doc_offsets: np.ndarray | None = None,
        *,
        batch_size: int,
        seg_len: int,
        shuffle: bool = False,
        seed: int = 0,
        repeat: bool = False,
        pad_id: int = 0,
        piece_len: int = 0,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size: must be >= 1, got {batch_size}")
        if seg_len < 1:
            raise ConfigError(f"seg_len: must be >= 1, got {seg_len}")
        if piece_len < 0:
            raise ConfigError(f"piece_len: must be >= 0 (0 keeps whole documents), got {piece_len}")
        tokens = source.tokens if hasattr(source, "tokens") else source
        if doc_offsets is None:
            doc_offsets = source.doc_offsets if hasattr(source, "doc_offsets") else np.array([0, len(tokens)])
        self.tokens = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)
        self.doc_offsets = np.asarray(doc_offsets, dtype=np.int64)
        if self.doc_offsets.ndim != 1 or len(self.doc_offsets) < 2 or self.doc_offsets[0] != 0:
            raise ValueError("doc_offsets must be a 1-D array starting at 0 with one entry per document plus one")
        if np.any(np.diff(self.doc_offsets) < 0) or self.doc_offsets[-1] > len(self.tokens):
            raise ValueError("doc_offsets must be non-decreasing and end within the token array")
        if self.doc_offsets[-1] == 0:
            raise ConfigError("data: the corpus has no tokens; nothing to iterate over")
        self.batch_size, self.seg_len = batch_size, seg_len
        self.shuffle, self.seed, self.repeat, self.pad_id = shuffle, seed, repeat, pad_id
        self.piece_len = piece_len
        self.epoch, self.step, self.tokens_seen = 0, 0, 0
        self.release_bytes, self._unreleased = RELEASE_BYTES, 0
        self._layout_cache: tuple[int, _Layout] | None = None

    # -- layout -------------------------------------------------------------------------------------------------

    @property
    def num_docs(self) -> int:
        return len(self.doc_offsets) - 1

    def _layout(self, epoch: int) -> _Layout:
        if self._layout_cache is not None and self._layout_cache[0] == epoch:
            return self._layout_cache[1]
        B, T = self.batch_size, self.seg_len
        pieces: list[list[tuple[int, int, int]]] = [[] for _ in range(B)]
        if self.num_docs == 1:
            n = int(self.doc_offsets[1])
            sizes = [n // B + (b < n % B) for b in range(B)]  # near-equal contiguous pieces, nothing dropped
            start = 0
            for b, size in enumerate(sizes):
                if size:
                    pieces[b].append((start, start + size, n))
                start += size
        else:
            heap = [(0, b) for b in range(B)]  # (segments so far, stream): deal to the least loaded stream
            for lo, hi, limit in self._pieces(epoch):
                load, b = heapq.heappop(heap)
                pieces[b].append((lo, hi, limit))
                heapq.heappush(heap, (load + -(-(hi - lo) // T), b))
        starts, ends, limits, seg0 = [], [], [], []
        for row in pieces:
            arr = np.array(row, dtype=np.int64).reshape(-1, 3)
            starts.append(arr[:, 0])
            ends.append(arr[:, 1])
            limits.append(arr[:, 2])
            n_seg = -(-(arr[:, 1] - arr[:, 0]) // T)  # ceil(len / T) segments per piece
            seg0.append(np.concatenate([[0], np.cumsum(n_seg)]).astype(np.int64))
        layout = _Layout(starts, ends, limits, seg0)
        self._layout_cache = (epoch, layout)
        return layout

    def _pieces(self, epoch: int) -> list[tuple[int, int, int]]:
        """(first token, end, end of its document) of every non-empty piece, in the order they are dealt."""
        bounds = [(int(self.doc_offsets[d]), int(self.doc_offsets[d + 1])) for d in range(self.num_docs)]
        rng = np.random.default_rng([self.seed, epoch])
        if not self.piece_len:
            order = rng.permutation(self.num_docs) if self.shuffle else range(self.num_docs)
            return [(bounds[d][0], bounds[d][1], bounds[d][1]) for d in order if bounds[d][1] > bounds[d][0]]
        L = self.piece_len
        cut = [(s, min(s + L, hi), hi) for lo, hi in bounds for s in range(lo, hi, L)]
        return [cut[i] for i in rng.permutation(len(cut))] if self.shuffle else cut

    @property
    def segments_per_epoch(self) -> int:
        """Batches in the current epoch (it can change between epochs when documents are shuffled)."""
        return self._layout(self.epoch).num_segments

    def __len__(self) -> int:
        if self.repeat:
            raise TypeError("a repeating StreamBatcher is endless; use segments_per_epoch")
        return self.segments_per_epoch

    def _locate(self, layout: _Layout, b: int, step: int) -> tuple[int, int] | None:
        """(piece, segment within piece) of stream ``b`` at ``step``, or None once the stream is exhausted."""
        seg0 = layout.seg0[b]
        if step >= seg0[-1]:
            return None
        p = int(np.searchsorted(seg0, step, side="right")) - 1
        return p, step - int(seg0[p])

    # -- iteration ----------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        while True:
            layout = self._layout(self.epoch)
            if self.step < layout.num_segments:
                break
            if not self.repeat:
                raise StopIteration
            self.epoch, self.step = self.epoch + 1, 0
        batch = self._make(layout, self.epoch, self.step)
        self.step += 1
        self.tokens_seen += batch.num_tokens
        self._unreleased += self.batch_size * self.seg_len * self.tokens.itemsize
        if self._unreleased >= self.release_bytes:
            release_pages(self.tokens)
            self._unreleased = 0
        return batch

    def _make(self, layout: _Layout, epoch: int, step: int) -> Batch:
        B, T = self.batch_size, self.seg_len
        tokens = np.full((B, T), self.pad_id, dtype=np.int64)
        targets = np.full((B, T), IGNORE_INDEX, dtype=np.int64)
        mask = np.zeros((B, T), dtype=bool)
        reset = np.zeros(B, dtype=bool)
        for b in range(B):
            where = self._locate(layout, b, step)
            if where is None:
                continue  # exhausted row: all padding until every stream ends
            p, k = where
            s = int(layout.starts[b][p]) + k * T
            e = min(s + T, int(layout.ends[b][p]))
            t_end = min(e + 1, int(layout.limits[b][p]))  # the document's last token has no target
            tokens[b, : e - s] = self.tokens[s:e]
            targets[b, : t_end - s - 1] = self.tokens[s + 1 : t_end]
            mask[b, : e - s] = True
            reset[b] = k == 0
        return Batch(
            torch.from_numpy(tokens),
            torch.from_numpy(targets),
            torch.from_numpy(mask),
            torch.from_numpy(reset),
            epoch,
            step,
        )

    # -- resumable state ----------------------------------------------------------------------------------------

    def _positions(self, epoch: int, step: int) -> list[int]:
        """Per stream, the token index of its next input (-1 when exhausted for this epoch)."""
        layout = self._layout(epoch)
        out = []
        for b in range(self.batch_size):
            where = self._locate(layout, b, step)
            out.append(-1 if where is None else int(layout.starts[b][where[0]]) + where[1] * self.seg_len)
        return out

    def _identity(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "seg_len": self.seg_len,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "num_docs": self.num_docs,
            "num_tokens": int(self.doc_offsets[-1]),
            "piece_len": self.piece_len,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "positions": self._positions(self.epoch, self.step),
            **self._identity(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` was saved; a state from another corpus or shape is a one-line error."""
        for key, value in self._identity().items():
            if state.get(key, 0 if key == "piece_len" else None) != value:  # states saved before pieces existed
                raise ConfigError(
                    f"data position: saved with {key}={state.get(key)!r} but this run has {key}={value!r}; "
                    "resume with the same data and batch settings, or start a fresh run"
                )
        epoch, step = int(state["epoch"]), int(state["step"])
        if "positions" in state and list(state["positions"]) != self._positions(epoch, step):
            raise ConfigError(
                "data position: the saved stream positions do not match this corpus; the data changed since the checkpoint"
            )
        self.epoch, self.step, self.tokens_seen = epoch, step, int(state.get("tokens_seen", 0))
