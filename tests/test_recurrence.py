"""Loss by lookback: how far before its segment's start a word last occurred, on texts whose repeats are known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer.analysis.frequency import TokenWords, token_words
from compressive_transformer.analysis.recurrence import (
    FIRST,
    FIRST_SEEN,
    NO_KEY,
    SEGMENT,
    Reach,
    bucket_names,
    bucket_of_lookback,
    default_edges,
    loss_by_lookback,
    word_key,
    word_lookbacks,
)
from compressive_transformer.data import ByteTokenizer


def one_token_per_word(words: list[str], doc_lengths: list[int] | None = None) -> TokenWords:
    n = len(words)
    offsets = np.cumsum([0] + (doc_lengths or [n])).astype(np.int64)
    return TokenWords(np.arange(n, dtype=np.int64), offsets, np.arange(n, dtype=np.int64), list(words))


def test_known_repeats_one_token_per_word() -> None:
    #        0    1    2    3    4    5    6    7    8    9   10   11
    words = ["a", "b", "c", "a", "d", "b", "e", "f", "g", "h", "a", "c"]
    _, lb = word_lookbacks(one_token_per_word(words), seg_len=4)
    # segments [0-3] [4-7] [8-11]; lookback = segment start - previous occurrence
    assert lb[0] == lb[1] == lb[2] == lb[4] == FIRST_SEEN
    assert lb[3] == 0 - 0, "a at 3 repeats a at 0 inside the segment"
    assert lb[5] == 4 - 1, "b at 5: previous b sits 3 tokens before the segment start"
    assert lb[10] == 8 - 3, "a at 10: the most recent previous a counts (at 3)"
    assert lb[11] == 8 - 2
    edges = [2, 5]
    assert bucket_names(edges) == [FIRST, SEGMENT, "1-2", "3-5", ">5"]
    assert bucket_of_lookback(lb, edges).tolist() == [0, 0, 0, 1, 0, 3, 0, 0, 0, 0, 3, 4]


def test_documents_are_independent_and_keys_ignore_case_and_edge_punctuation() -> None:
    text_a = "Holmes said. holmes, again: HOLMES! -- Watson"
    text_b = "Watson"
    tw = token_words(ByteTokenizer(), [text_a, text_b])
    assert tw.words == ["Holmes", "said.", "holmes,", "again:", "HOLMES!", "--", "Watson", "Watson"]
    assert word_key("«Holmes,»") == "holmes" and word_key("don't") == "don't" and word_key("--") == ""
    first, lb = word_lookbacks(tw, seg_len=1000)
    assert lb[0] == FIRST_SEEN and lb[2] <= 0 and lb[4] <= 0, "one segment: the repeats are in segment"
    assert lb[5] == NO_KEY, "punctuation has no key"
    assert lb[7] == FIRST_SEEN, "Watson of the second document does not repeat the first document's"
    assert first[2] == text_a.index(" holmes,"), "a word starts with the whitespace before it"
    _, lb_short = word_lookbacks(tw, seg_len=4)
    # holmes, starts at byte 12 (its leading space) in segment [12, 16); Holmes started at 0: lookback 12
    assert lb_short[2] == 12


def reference_lookbacks(
    words: list[str], tokens_per_word: list[int], doc_lengths: list[int], seg_len: int
) -> list[int]:
    """Brute force: the word's first token, its segment's start, and a backwards scan for the same key."""
    starts, pos = [], 0
    for k in tokens_per_word:
        starts.append(pos if k > 0 else -1)
        pos += k
    doc_bounds = np.cumsum([0] + doc_lengths)
    out = []
    for w, s in enumerate(starts):
        key = word_key(words[w])
        if s < 0 or not key:
            out.append(NO_KEY)
            continue
        d = int(np.searchsorted(doc_bounds, s, side="right")) - 1
        seg_start = doc_bounds[d] + (s - doc_bounds[d]) // seg_len * seg_len
        prev = [
            starts[v] for v in range(w) if starts[v] >= doc_bounds[d] and starts[v] >= 0 and word_key(words[v]) == key
        ]
        out.append(FIRST_SEEN if not prev else int(seg_start - prev[-1]))
    return out


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.sampled_from(["x", "Y", "y.", "z", "--", "w"]), st.integers(0, 3)), min_size=1, max_size=40
    ),
    seg_len=st.integers(1, 7),
    cuts=st.lists(st.integers(1, 39), max_size=3),
)
def test_lookbacks_match_a_brute_force_scan(data: list[tuple[str, int]], seg_len: int, cuts: list[int]) -> None:
    words = [w for w, _ in data]
    tokens_per_word = [k for _, k in data]
    n_tokens = sum(tokens_per_word)
    if n_tokens == 0:
        return
    word_of_token = np.repeat(np.arange(len(words)), tokens_per_word)
    # document boundaries fall between words (a word never straddles two documents)
    word_starts = np.cumsum([0] + tokens_per_word)[:-1]
    bounds = sorted({int(word_starts[c]) for c in cuts if c < len(words)} - {0})
    doc_lengths = [b - a for a, b in zip([0] + bounds, bounds + [n_tokens]) if b > a]
    tw = TokenWords(
        np.zeros(n_tokens, dtype=np.int64), np.cumsum([0] + doc_lengths).astype(np.int64), word_of_token, words
    )
    _, lb = word_lookbacks(tw, seg_len)
    assert lb.tolist() == reference_lookbacks(words, tokens_per_word, doc_lengths, seg_len)


def test_loss_by_lookback_sums_tokens_and_nll_per_bucket() -> None:
    words = ["a", "b", "a", "--", "b", "c"]
    # a:2 tokens, b:1, a:1, --:1, b:2, c:1 -> 8 tokens
    per_word = [2, 1, 1, 1, 2, 1]
    word_of_token = np.repeat(np.arange(6), per_word)
    tw = TokenWords(np.zeros(8, dtype=np.int64), np.array([0, 8]), word_of_token, words)
    nll = np.array([np.nan, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])  # the document's first token is never predicted
    r = loss_by_lookback(tw, nll, seg_len=4, edges=[2])
    b = r["buckets"]
    # segments [0-3] [4-7]; a(0-1) first, b(2) first, a(3) in segment, --(4) no key, b(5-6) lookback 4-2=2, c(7) first
    assert b[FIRST]["tokens"] == 3 and b[FIRST]["words"] == 3 and b[FIRST]["nll"] == pytest.approx(1.0 + 2.0 + 7.0)
    assert b[SEGMENT]["tokens"] == 1 and b[SEGMENT]["nll"] == pytest.approx(3.0)
    assert b["1-2"]["tokens"] == 2 and b["1-2"]["nll"] == pytest.approx(5.0 + 6.0)
    assert b["1-2"]["bits_per_token"] == pytest.approx(5.5 / math.log(2))
    assert b[">2"]["tokens"] == 0 and b[">2"]["bits_per_token"] is None
    assert r["tokens_without_key"] == 1
    with pytest.raises(ValueError, match="nll has"):
        loss_by_lookback(tw, nll[:-1], seg_len=4, edges=[2])
    with pytest.raises(ValueError, match="increasing"):
        loss_by_lookback(tw, nll, seg_len=4, edges=[3, 3])


def test_default_edges_separate_raw_compressed_and_unseen() -> None:
    txl, ct = Reach(256, 0, 4), Reach(128, 128, 4)
    assert (ct.raw, ct.total, txl.total) == (128, 640, 256)
    assert default_edges([txl, ct]) == [128, 256, 640]
    assert default_edges([Reach(0, 0, 4)]) == []
