"""The batch-of-streams iterator: ordering, targets, masks, resets, epochs and exact resumption."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer.core.config import ConfigError
from compressive_transformer.data import IGNORE_INDEX, Batch, StreamBatcher


def corpus(lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Token i has value i + 1 (0 stays the pad id), so every token is unique and its successor is value + 1."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return np.arange(1, offsets[-1] + 1, dtype=np.int64), offsets


def check_pass(batches: list[Batch], tokens: np.ndarray, offsets: np.ndarray, B: int, T: int) -> None:
    """Every invariant of one epoch of batches over ``corpus(lengths)``."""
    n_docs = len(offsets) - 1
    single = n_docs == 1
    doc_of = lambda v: int(np.searchsorted(offsets, v - 1, side="right")) - 1  # noqa: E731  (value -> document)
    rows: list[list[int]] = [[] for _ in range(B)]
    pieces: list[list[int]] = []
    open_piece: list[list[int] | None] = [None] * B
    for step, batch in enumerate(batches):
        assert batch.tokens.shape == batch.targets.shape == batch.input_mask.shape == (B, T)
        assert batch.tokens.dtype == batch.targets.dtype == torch.int64
        assert batch.input_mask.dtype == batch.reset.dtype == torch.bool and batch.reset.shape == (B,)
        assert batch.step == step
        for b in range(B):
            mask = batch.input_mask[b].numpy()
            n = int(mask.sum())
            assert mask[:n].all() and not mask[n:].any(), "real tokens form a prefix of the row"
            toks, tgts = batch.tokens[b].numpy(), batch.targets[b].numpy()
            assert (toks[n:] == 0).all() and (tgts[n:] == IGNORE_INDEX).all(), "padding has no input and no target"
            if n == 0:
                assert not batch.reset[b]
                continue
            docs = {doc_of(v) for v in toks[:n]}
            assert len(docs) == 1, "a row never mixes two documents in one segment"
            d = docs.pop()
            end = int(offsets[d + 1])  # value of the doc's last token is `end`
            for v, t in zip(toks[:n], tgts[:n]):
                if v == end:
                    assert t == IGNORE_INDEX, "a document's last token has no target"
                else:
                    assert t == v + 1, "the target is the next token of the same document"
            starts_doc = toks[0] - 1 == offsets[d]
            if single:
                assert bool(batch.reset[b]) == (open_piece[b] is None)
            else:
                assert bool(batch.reset[b]) == bool(starts_doc), "reset exactly where a document starts"
            if batch.reset[b]:
                open_piece[b] = []
                pieces.append(open_piece[b])  # type: ignore[arg-type]
            assert open_piece[b] is not None
            open_piece[b].extend(toks[:n].tolist())  # type: ignore[union-attr]
            rows[b].extend(toks[:n].tolist())
    for row in rows:
        assert row == sorted(row) or not single, "a single document is cut into contiguous in-order pieces"
    seen = sorted(v for p in pieces for v in p)
    assert seen == tokens.tolist(), "every token appears exactly once as an input"
    for p in pieces:
        assert p == list(range(p[0], p[0] + len(p))), "pieces are contiguous and in order"
        if not single:
            d = doc_of(p[0])
            assert p[0] - 1 == offsets[d] and p[-1] == offsets[d + 1], "each piece is a whole document"
    n_targets = sum(b.num_targets for b in batches)
    if single:
        assert n_targets == len(tokens) - 1, "a batchified document loses no prediction at row ends"
    else:
        assert n_targets == sum(max(0, int(offsets[i + 1] - offsets[i]) - 1) for i in range(n_docs)), (
            "n - 1 targets per document"
        )


lengths_st = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=12).filter(lambda xs: sum(xs) > 0)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, B=st.integers(1, 5), T=st.integers(1, 9), shuffle=st.booleans(), seed=st.integers(0, 3))
def test_one_pass_invariants(lengths: list[int], B: int, T: int, shuffle: bool, seed: int) -> None:
    tokens, offsets = corpus(lengths)
    it = StreamBatcher(tokens, offsets, batch_size=B, seg_len=T, shuffle=shuffle, seed=seed)
    batches = list(it)
    assert len(batches) == len(it) == it.segments_per_epoch
    check_pass(batches, tokens, offsets, B, T)
    assert it.tokens_seen == len(tokens)
    assert list(it) == [], "a non-repeating batcher is a single pass"


@settings(max_examples=40, deadline=None)
@given(lengths=lengths_st, B=st.integers(1, 4), T=st.integers(1, 7), cut=st.integers(0, 60), shuffle=st.booleans())
def test_resume_from_any_point(lengths: list[int], B: int, T: int, cut: int, shuffle: bool) -> None:
    tokens, offsets = corpus(lengths)
    make = lambda: StreamBatcher(tokens, offsets, batch_size=B, seg_len=T, shuffle=shuffle, seed=7, repeat=True)  # noqa: E731
    original = make()
    for _ in range(cut):
        next(original)
    state = original.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.tokens_seen == original.tokens_seen
    for _ in range(15):
        a, b = next(original), next(resumed)
        assert (a.epoch, a.step) == (b.epoch, b.step)
        for name in ("tokens", "targets", "input_mask", "reset"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert resumed.tokens_seen == original.tokens_seen


def test_single_document_is_batchified_without_losing_targets() -> None:
    tokens, offsets = corpus([103])
    batches = list(StreamBatcher(tokens, offsets, batch_size=4, seg_len=10))
    # near-equal contiguous rows of 26, 26, 26, 25 tokens -> 3 segments
    assert len(batches) == 3
    assert batches[0].reset.all() and not batches[1].reset.any()
    assert batches[0].tokens[:, 0].tolist() == [1, 27, 53, 79]
    # the last token of row 0 (value 26) predicts the first of row 1: no prediction is lost at row ends
    assert batches[2].tokens[0, 5].item() == 26 and batches[2].targets[0, 5].item() == 27
    assert sum(b.num_targets for b in batches) == 102
    check_pass(batches, tokens, offsets, 4, 10)


def test_exhausted_rows_are_padding_until_all_streams_end() -> None:
    tokens, offsets = corpus([30, 3])
    batches = list(StreamBatcher(tokens, offsets, batch_size=2, seg_len=4))
    assert len(batches) == 8
    assert batches[0].reset.tolist() == [True, True]
    for b in batches[1:]:
        assert not b.input_mask[1].any() and (b.targets[1] == IGNORE_INDEX).all() and not b.reset[1]
    assert batches[0].input_mask[1].tolist() == [True, True, True, False]
    assert batches[0].targets[1].tolist() == [32, 33, IGNORE_INDEX, IGNORE_INDEX]


def test_documents_are_dealt_to_the_least_loaded_stream() -> None:
    tokens, offsets = corpus([20, 4, 4, 4, 4])  # seg_len 4: 5 + 1 + 1 + 1 + 1 segments
    batches = list(StreamBatcher(tokens, offsets, batch_size=2, seg_len=4))
    assert len(batches) == 5
    starts_row1 = [int(b.tokens[1, 0]) for b in batches if b.reset[1]]
    assert starts_row1 == [21, 25, 29, 33]


def test_repeat_reshuffles_each_epoch_and_counts_tokens() -> None:
    tokens, offsets = corpus([5] * 12)
    it = StreamBatcher(tokens, offsets, batch_size=3, seg_len=5, shuffle=True, seed=1, repeat=True)
    with pytest.raises(TypeError):
        len(it)
    per_epoch = it.segments_per_epoch
    assert per_epoch == 4
    epochs = [[next(it) for _ in range(per_epoch)] for _ in range(3)]
    assert [b.epoch for b in epochs[2]] == [2] * per_epoch
    first = [[int(b.tokens[r, 0]) for b in e for r in range(3)] for e in epochs]
    assert first[0] != first[1] != first[2], "each epoch has its own document order"
    assert first[0] != sorted(first[0]), "epoch 0 is shuffled too"
    assert sorted(first[0]) == sorted(first[1]) == list(range(1, 61, 5))
    assert it.tokens_seen == 3 * 60
    same = StreamBatcher(tokens, offsets, batch_size=3, seg_len=5, shuffle=True, seed=1, repeat=True)
    assert torch.equal(next(same).tokens, epochs[0][0].tokens), "the shuffle is deterministic given the seed"
    unshuffled = StreamBatcher(tokens, offsets, batch_size=3, seg_len=5)
    assert [int(x) for x in next(unshuffled).tokens[:, 0]] == [1, 6, 11]


def test_state_dict_rejects_another_setup() -> None:
    tokens, offsets = corpus([10, 10, 10])
    it = StreamBatcher(tokens, offsets, batch_size=2, seg_len=4)
    next(it)
    state = it.state_dict()
    assert state["positions"] == [4, 14]  # next inputs: row 0 at token index 4, row 1 (doc 1 starts at 10) at 14
    other = StreamBatcher(tokens, offsets, batch_size=3, seg_len=4)
    with pytest.raises(ConfigError, match="batch_size"):
        other.load_state_dict(state)
    changed = StreamBatcher(*corpus([12, 8, 10]), batch_size=2, seg_len=4)
    with pytest.raises(ConfigError, match="positions"):
        changed.load_state_dict(state)


def test_accepts_a_corpus_like_object_and_validates_arguments() -> None:
    class Source:
        tokens, doc_offsets = corpus([3, 3])

    it = StreamBatcher(Source(), batch_size=1, seg_len=8)
    assert next(it).tokens[0, :3].tolist() == [1, 2, 3]
    with pytest.raises(ConfigError, match="seg_len"):
        StreamBatcher(Source(), batch_size=1, seg_len=0)
    with pytest.raises(ConfigError, match="batch_size"):
        StreamBatcher(Source(), batch_size=0, seg_len=4)
    with pytest.raises(ConfigError, match="no tokens"):
        StreamBatcher(np.zeros(0, dtype=np.int64), np.array([0, 0]), batch_size=1, seg_len=4)
    batch = next(StreamBatcher(Source(), batch_size=2, seg_len=4)).to("cpu")
    assert batch.num_tokens == 6 and batch.num_targets == 4
