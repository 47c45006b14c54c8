"""Loss by how far back the same word last occurred: where in the text memory and compressed memory pay off.

Every word of a document is keyed by its lower-cased form without leading and trailing punctuation ("Holmes," and
"holmes" are one word; a word of punctuation only has no key and is left out). A word's tokens go to the bucket of
its *lookback*: how many tokens before the start of the word's segment its previous occurrence in the same document
began (segments start at the document's first token, as in streaming evaluation). A lookback of 0 or less means the
previous occurrence is inside the segment, visible to every model; a lookback of L means it sits in the L-th
most recent memory slot, visible to a model whose memory holds at least L slots (for the Compressive Transformer,
n_m raw slots and then c * n_cm tokens compressed). Words never seen before in the document form the first bucket.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from compressive_transformer.analysis.frequency import TokenWords

_EDGE_PUNCTUATION = re.compile(r"^[\W_]+|[\W_]+$")

FIRST, SEGMENT = "first occurrence", "in segment"
NO_KEY = np.iinfo(np.int64).min  # lookback of a word without a key (punctuation only)
FIRST_SEEN = np.iinfo(np.int64).max  # lookback of a word's first occurrence in its document


def word_key(word: str) -> str:
    """The form two occurrences must share to count as the same word ("" for punctuation only)."""
    return _EDGE_PUNCTUATION.sub("", word.lower())


def bucket_names(edges: Sequence[int]) -> list[str]:
    """``[FIRST, SEGMENT, "1-e1", "e1+1-e2", ..., ">eK"]`` for increasing lookback edges."""
    names, lo = [FIRST, SEGMENT], 0
    for e in edges:
        names.append(f"{lo + 1}-{e}")
        lo = e
    return names + [f">{lo}"]


def _check_edges(edges: Sequence[int]) -> list[int]:
    edges = [int(e) for e in edges]
    if not edges or edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"lookback edges must be increasing integers >= 1, got {edges}")
    return edges


def word_lookbacks(tw: TokenWords, seg_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Per word: (first token index, lookback in tokens); the lookback is :data:`FIRST_SEEN` for a first occurrence
    and :data:`NO_KEY` for a word without a key or tokens; a word without tokens has first token -1."""
    W = len(tw.words)
    first = np.full(W, -1, dtype=np.int64)
    has = tw.word_of_token >= 0
    idx = np.nonzero(has)[0]
    # the first token of each word: the smallest index mapped to it (np.minimum.at keeps the earliest)
    first_tmp = np.full(W, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_tmp, tw.word_of_token[idx], idx)
    found = first_tmp != np.iinfo(np.int64).max
    first[found] = first_tmp[found]
    doc_of_token = np.searchsorted(tw.doc_offsets, np.arange(len(tw.ids)), side="right") - 1
    lookback = np.full(W, NO_KEY, dtype=np.int64)
    last_seen: dict[tuple[int, str], int] = {}
    for w in range(W):
        start = int(first[w])
        if start < 0:
            continue
        key = word_key(tw.words[w])
        if not key:
            continue
        doc = int(doc_of_token[start])
        pos_in_segment = (start - int(tw.doc_offsets[doc])) % seg_len
        prev = last_seen.get((doc, key))
        lookback[w] = FIRST_SEEN if prev is None else (start - prev) - pos_in_segment
        last_seen[(doc, key)] = start
    return first, lookback


def bucket_of_lookback(lookback: np.ndarray, edges: Sequence[int]) -> np.ndarray:
    """Index into :func:`bucket_names` per word (-1 for words without a key)."""
    edges = _check_edges(edges)
    out = np.full(lookback.shape, -1, dtype=np.int64)
    out[lookback == FIRST_SEEN] = 0
    rest = (lookback != NO_KEY) & (lookback != FIRST_SEEN)
    # lookback <= 0: in segment (bucket 1); then (0, e1] -> 2, (e1, e2] -> 3, ..., > eK -> K + 2
    out[rest] = 1 + np.searchsorted(np.asarray([0] + edges), lookback[rest], side="left")
    return out


def loss_by_lookback(tw: TokenWords, nll: np.ndarray, *, seg_len: int, edges: Sequence[int]) -> dict[str, Any]:
    """Per bucket: predicted tokens, words, summed NLL (nats) and mean bits per token. ``nll`` is (N,) per token,
    NaN where a token was not predicted (it is then left out)."""
    if len(nll) != len(tw.ids):
        raise ValueError(f"nll has {len(nll)} values for {len(tw.ids)} tokens")
    names = bucket_names(edges)
    _, lookback = word_lookbacks(tw, seg_len)
    word_bucket = bucket_of_lookback(lookback, edges)
    has = tw.word_of_token >= 0
    token_bucket = np.full(len(tw.ids), -1, dtype=np.int64)
    token_bucket[has] = word_bucket[tw.word_of_token[has]]
    ok = (token_bucket >= 0) & ~np.isnan(nll)
    counts = np.bincount(token_bucket[ok], minlength=len(names))
    sums = np.bincount(token_bucket[ok], weights=nll[ok], minlength=len(names))
    words = np.bincount(word_bucket[word_bucket >= 0], minlength=len(names))
    buckets = {}
    for i, name in enumerate(names):
        n = int(counts[i])
        buckets[name] = {
            "tokens": n,
            "words": int(words[i]),
            "nll": float(sums[i]),
            "bits_per_token": float(sums[i]) / n / math.log(2) if n else None,
        }
    predicted = ~np.isnan(nll)
    return {
        "seg_len": seg_len,
        "edges": list(edges),
        "buckets": buckets,
        "tokens_without_key": int(((token_bucket < 0) & has & predicted).sum()),  # punctuation-only words
        "tokens_outside_words": int((~has & predicted).sum()),  # whitespace after a document's last word
    }


@dataclass(frozen=True)
class Reach:
    """Which lookbacks a model sees at its memory lengths: raw memory up to ``mem_len`` slots back, then compressed
    slots up to ``mem_len + compression_rate * cmem_len`` tokens back."""

    mem_len: int
    cmem_len: int
    compression_rate: int

    @property
    def raw(self) -> int:
        return self.mem_len

    @property
    def total(self) -> int:
        return self.mem_len + self.compression_rate * self.cmem_len


def default_edges(reaches: Sequence[Reach]) -> list[int]:
    """Lookback edges that separate what each model sees raw, compressed, or not at all."""
    edges = {r.raw for r in reaches} | {r.total for r in reaches}
    return sorted(e for e in edges if e > 0)


__all__ = [
    "FIRST",
    "FIRST_SEEN",
    "NO_KEY",
    "SEGMENT",
    "Reach",
    "bucket_names",
    "bucket_of_lookback",
    "default_edges",
    "loss_by_lookback",
    "word_key",
    "word_lookbacks",
]
