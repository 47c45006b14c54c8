"""Perplexity by word frequency (the paper's WikiText-103 table): word perplexity in buckets of how often each word
occurs in the train split (>10K, 1K-10K, 100-1K, <100), for word-level and subword/byte runs, checkpoints compared.

A subword or byte run is mapped back to whitespace words: the NLL of a word is the sum of the NLL of the tokens it
is made of (whitespace before a word belongs to that word, as byte-level BPE attaches it), so the words' NLLs add
up to the stream's. Token -> word comes from the tokenizer's character offsets (HuggingFace encodings), from byte
spans for the byte tokenizer, and is the identity for the word tokenizer. Words whose tokens were not all predicted
(a document's first token, a capped stream) are left out.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from compressive_transformer.analysis.streaming import stream_batches
from compressive_transformer.core.streaming import stream

# (name, lowest count, highest count) inclusive-exclusive: [lo, hi)
WIKITEXT_BUCKETS: tuple[tuple[str, float, float], ...] = (
    (">10K", 10_000, math.inf),
    ("1K-10K", 1_000, 10_000),
    ("100-1K", 100, 1_000),
    ("<100", 0, 100),
)


def _text(doc: str | bytes) -> str:
    return doc if isinstance(doc, str) else doc.decode("utf-8", errors="replace")


def word_counts(documents: Iterable[str | bytes]) -> Counter[str]:
    """Occurrences of every whitespace word in ``documents`` (the train split)."""
    counts: Counter[str] = Counter()
    for doc in documents:
        counts.update(_text(doc).split())
    return counts


@dataclass
class TokenWords:
    ids: np.ndarray  # (N,) token ids of all documents, concatenated
    doc_offsets: np.ndarray  # (D + 1,)
    word_of_token: np.ndarray  # (N,) index into ``words``, -1 for tokens that belong to no word
    words: list[str]


def _char_word_map(text: str) -> tuple[np.ndarray, list[str]]:
    """Per character: the word it belongs to; whitespace belongs to the next word (-1 after the last word)."""
    char_word = np.full(len(text), -1, dtype=np.int64)
    words: list[str] = []
    prev_end = 0
    for m in re.finditer(r"\S+", text):
        char_word[prev_end : m.end()] = len(words)  # leading whitespace, then the word itself
        words.append(m.group())
        prev_end = m.end()
    return char_word, words


def _map_document(tokenizer: Any, text: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    kind = getattr(tokenizer, "kind", "")
    if kind == "words":
        ids = np.asarray(tokenizer.encode_array(text), dtype=np.int64)
        words = text.split()
        return ids, np.arange(len(ids), dtype=np.int64), words
    if kind == "bytes":
        data = text.encode("utf-8")
        ids = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
        byte_word = np.full(len(data), -1, dtype=np.int64)
        words, prev_end = [], 0
        for m in re.finditer(rb"\S+", data):
            byte_word[prev_end : m.end()] = len(words)
            words.append(m.group().decode("utf-8", errors="replace"))
            prev_end = m.end()
        return ids, byte_word, words
    if not hasattr(tokenizer, "encode_with_offsets"):
        raise ValueError(f"cannot map {kind or type(tokenizer).__name__!r} tokens to words: no offsets available")
    char_word, words = _char_word_map(text)
    ids, spans = tokenizer.encode_with_offsets(text)
    ends = np.asarray([e for _, e in spans], dtype=np.int64)
    word_of = np.where(ends > 0, char_word[np.clip(ends - 1, 0, max(len(text) - 1, 0))], -1) if len(ends) else ends
    return np.asarray(ids, dtype=np.int64), word_of, words


def token_words(tokenizer: Any, documents: Sequence[str | bytes]) -> TokenWords:
    """Token ids of ``documents`` (as the tokenizer encodes them for training) and the word of every token."""
    ids_all, word_all, words_all, offsets = [], [], [], [0]
    for doc in documents:
        ids, word_of, words = _map_document(tokenizer, _text(doc))
        if len(ids) == 0:
            continue
        ids_all.append(ids)
        word_all.append(np.where(word_of >= 0, word_of + len(words_all), -1))
        words_all.extend(words)
        offsets.append(offsets[-1] + len(ids))
    if not ids_all:
        raise ValueError("the documents hold no tokens")
    return TokenWords(np.concatenate(ids_all), np.asarray(offsets, dtype=np.int64), np.concatenate(word_all), words_all)


@torch.no_grad()
def token_nll(
    model: torch.nn.Module,
    tw: TokenWords,
    *,
    batch_size: int = 4,
    seg_len: int | None = None,
    mem_len: int | None = None,
    cmem_len: int | None = None,
    max_segments: int = 0,
) -> np.ndarray:
    """(N,) NLL of predicting each token from everything before it in its document (memory carried, of the
    model's lengths unless given); NaN where it was not predicted (a document's first token, or beyond
    ``max_segments``)."""
    seg_len = seg_len or model.cfg.seg_len
    nll = np.full(len(tw.ids), np.nan)
    source = SimpleNamespace(tokens=tw.ids, doc_offsets=tw.doc_offsets)
    batches = stream_batches(
        source, batch_size=batch_size, seg_len=seg_len, max_segments=max_segments, track_positions=True
    )
    for step in stream(model, batches, batch_size=batch_size, mem_len=mem_len, cmem_len=cmem_len):
        batch = step.batch
        has = batch.target_positions >= 0
        logp = F.log_softmax(step.out.logits.float(), dim=-1).cpu()
        tgt = batch.targets.clamp(min=0)
        values = -logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        nll[batch.target_positions[has].numpy()] = values[has].double().numpy()
    return nll


def word_nll(tw: TokenWords, nll: np.ndarray) -> np.ndarray:
    """(W,) summed NLL of each word's tokens; NaN when any of its tokens was not predicted."""
    W = len(tw.words)
    has_word = tw.word_of_token >= 0
    idx = tw.word_of_token[has_word]
    vals = nll[has_word]
    total = np.bincount(idx, weights=np.nan_to_num(vals, nan=0.0), minlength=W)
    missing = np.bincount(idx, weights=np.isnan(vals).astype(np.float64), minlength=W)
    present = np.bincount(idx, minlength=W)
    total[(missing > 0) | (present == 0)] = np.nan
    return total


def bucket_perplexity(
    words: Sequence[str],
    nll: np.ndarray,
    counts: Counter[str] | dict[str, int],
    buckets: Sequence[tuple[str, float, float]] = WIKITEXT_BUCKETS,
) -> dict[str, dict[str, float | int]]:
    """Per bucket (and "all"): words, mean NLL per word and word perplexity exp(mean NLL)."""
    c = np.asarray([counts.get(w, 0) for w in words], dtype=np.float64)
    ok = ~np.isnan(nll)
    out: dict[str, dict[str, float | int]] = {}
    for name, lo, hi in list(buckets) + [("all", -math.inf, math.inf)]:
        sel = ok & (c >= lo) & (c < hi)
        n = int(sel.sum())
        mean = float(nll[sel].mean()) if n else math.nan
        out[name] = {
            "words": n,
            "nll": mean,
            "ppl": math.exp(mean) if n and mean < 700 else (math.inf if n else math.nan),
        }
    return out


def frequency_perplexity(
    model: torch.nn.Module,
    tokenizer: Any,
    documents: Sequence[str | bytes],
    counts: Counter[str] | dict[str, int],
    *,
    batch_size: int = 4,
    seg_len: int | None = None,
    max_segments: int = 0,
    buckets: Sequence[tuple[str, float, float]] = WIKITEXT_BUCKETS,
) -> dict[str, Any]:
    """Word perplexity of ``model`` on ``documents`` per train-frequency bucket (``counts`` from the train split)."""
    tw = token_words(tokenizer, documents)
    per_word = word_nll(tw, token_nll(model, tw, batch_size=batch_size, seg_len=seg_len, max_segments=max_segments))
    return {
        "buckets": bucket_perplexity(tw.words, per_word, counts, buckets),
        "tokenizer": getattr(tokenizer, "kind", "?"),
    }


def compare_frequency(
    results: dict[str, dict[str, Any]], buckets: Sequence[tuple[str, float, float]] = WIKITEXT_BUCKETS
) -> dict[str, Any]:
    """Side by side: ``{name: frequency_perplexity(...)}``; with two models also the relative gain of the second
    over the first per bucket (1 - ppl_2 / ppl_1, the paper's last row)."""
    out: dict[str, Any] = {
        "buckets": [{"name": n, "min": lo, "max": None if math.isinf(hi) else hi} for n, lo, hi in buckets],
        "models": results,
    }
    names = list(results)
    if len(names) == 2:
        a, b = (results[n]["buckets"] for n in names)
        out["relative_gain"] = {
            k: (1.0 - b[k]["ppl"] / a[k]["ppl"]) if a[k]["words"] and b[k]["words"] and a[k]["ppl"] > 0 else None
            for k in a
        }
        out["gain_of"] = f"{names[1]} over {names[0]}"
    return out


def frequency_table(comparison: dict[str, Any]) -> str:
    """Markdown like the paper's table: a row per model, a column per bucket, and the relative gain row."""
    cols = [b["name"] for b in comparison["buckets"]] + ["all"]
    lines = ["| model | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for name, r in comparison["models"].items():
        cells = [
            f"{r['buckets'][c]['ppl']:.4g} ({r['buckets'][c]['words']})" if r["buckets"][c]["words"] else "-"
            for c in cols
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    gain = comparison.get("relative_gain")
    if gain:
        lines.append(
            f"| gain ({comparison['gain_of']}) | "
            + " | ".join("-" if gain[c] is None else f"{100 * gain[c]:.1f}%" for c in cols)
            + " |"
        )
    return "\n".join(lines) + "\n\nword perplexity (words counted) per bucket of train-split occurrences"


__all__ = [
    "WIKITEXT_BUCKETS",
    "TokenWords",
    "bucket_perplexity",
    "compare_frequency",
    "frequency_perplexity",
    "frequency_table",
    "token_nll",
    "token_words",
    "word_counts",
    "word_nll",
]
