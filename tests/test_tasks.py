"""Synthetic long-range tasks: answers recoverable by an oracle, exact distances, reproducible, well-formed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer.core.config import ConfigError
from compressive_transformer.experiments.tasks import (
    IGNORE_INDEX,
    MARK,
    PAD,
    QUERY,
    SEP,
    AssociativeRecallConfig,
    PasskeyConfig,
    SelectiveCopyConfig,
    Vocab,
    accuracy_by_distance,
    make_batch,
    make_example,
    task_config,
)

FAST = settings(max_examples=40, deadline=None)

# --- oracles: read only the tokens, return {answer position: (answer, distance)} ---------------------------------


def passkey_oracle(tokens: list[int], vocab: Vocab) -> dict[int, tuple[int, int]]:
    q = tokens.index(QUERY)
    key = tokens[q + 1]
    k = tokens.index(key)  # the first occurrence is the pair; the second is the query
    assert k < q and tokens[k + 1] in vocab.values
    return {q + 1: (tokens[k + 1], q + 1 - (k + 1))}


def recall_oracle(tokens: list[int], vocab: Vocab) -> dict[int, tuple[int, int]]:
    sep = tokens.index(SEP)
    table = {tokens[i]: i + 1 for i in range(sep - 1) if tokens[i] in vocab.keys and tokens[i + 1] in vocab.values}
    return {j: (tokens[table[tokens[j]]], j - table[tokens[j]]) for j in range(sep + 1, len(tokens))}


def copy_oracle(tokens: list[int], vocab: Vocab) -> dict[int, tuple[int, int]]:
    sep = tokens.index(SEP)
    data = [i for i in range(sep) if tokens[i] in vocab.values]
    marks = [j for j in range(sep + 1, len(tokens)) if tokens[j] == MARK]
    assert len(data) == len(marks)
    return {j: (tokens[i], j - i) for i, j in zip(data, marks)}


ORACLES = {PasskeyConfig: passkey_oracle, AssociativeRecallConfig: recall_oracle, SelectiveCopyConfig: copy_oracle}


def check_with_oracle(cfg, batch_size: int = 8, seed: int = 0) -> None:
    tokens, targets, distances = make_batch(cfg, batch_size, seed)
    L = cfg.seq_len
    assert tokens.shape == targets.shape == distances.shape == (batch_size, L)
    assert tokens.dtype == targets.dtype == distances.dtype == np.int64
    assert tokens.min() > PAD and tokens.max() < cfg.vocab_size
    for row_t, row_y, row_d in zip(tokens, targets, distances):
        found = ORACLES[type(cfg)](row_t.tolist(), cfg.vocab)
        answers = np.flatnonzero(row_y != IGNORE_INDEX)
        assert sorted(found) == answers.tolist()  # -100 everywhere else
        assert np.flatnonzero(row_d).tolist() == answers.tolist()
        for pos, (answer, distance) in found.items():
            assert row_y[pos] == answer and row_d[pos] == distance


# --- the three tasks ---------------------------------------------------------------------------------------------


@st.composite
def passkey_cfgs(draw: st.DrawFn) -> PasskeyConfig:
    L = draw(st.integers(4, 80))
    ds = draw(st.lists(st.integers(2, L - 2), min_size=1, max_size=4))
    return PasskeyConfig(
        seq_len=L, distances=tuple(ds), n_filler=draw(st.integers(1, 5)), n_keys=draw(st.integers(1, 5))
    )


@st.composite
def recall_cfgs(draw: st.DrawFn) -> AssociativeRecallConfig:
    n = draw(st.integers(1, 6))
    L = draw(st.integers(3 * n + 1, 80))
    gaps = draw(st.lists(st.integers(0, L - 3 * n - 1), min_size=1, max_size=3))
    return AssociativeRecallConfig(
        seq_len=L, n_pairs=n, gaps=tuple(gaps), n_keys=draw(st.integers(n, n + 3)), n_values=2
    )


@st.composite
def copy_cfgs(draw: st.DrawFn) -> SelectiveCopyConfig:
    n, gap = draw(st.integers(1, 6)), draw(st.integers(0, 10))
    L = draw(st.integers(2 * n + 1 + gap, 80))
    return SelectiveCopyConfig(seq_len=L, n_tokens=n, gap=gap, n_values=draw(st.integers(2, 4)))


@FAST
@given(st.one_of(passkey_cfgs(), recall_cfgs(), copy_cfgs()), st.integers(0, 2**32 - 1))
def test_oracle_recovers_every_answer(cfg, seed: int) -> None:
    check_with_oracle(cfg, batch_size=4, seed=seed)


@pytest.mark.parametrize("cfg", [PasskeyConfig(), AssociativeRecallConfig(), SelectiveCopyConfig(gap=100)])
def test_defaults_are_valid_and_solvable(cfg) -> None:
    check_with_oracle(cfg, batch_size=16)


def test_passkey_layout_and_distances() -> None:
    cfg = PasskeyConfig(seq_len=40, distances=(2, 7, 38))
    tokens, targets, distances = make_batch(cfg, 300, 1)
    assert set(distances[:, -1].tolist()) == {2, 7, 38}  # every listed distance is drawn, nothing else
    v = cfg.vocab
    for row, y, d in zip(tokens, targets, distances[:, -1]):
        assert row[-2] == QUERY and row[-1] in v.keys
        assert row[-1 - d] == y[-1] and row[-2 - d] == row[-1]  # value d back, its key right before it
        assert sum(t in v.keys for t in row) == 2 and sum(t in v.values for t in row) == 1


def test_recall_distances_follow_the_documented_formula() -> None:
    cfg = AssociativeRecallConfig(seq_len=50, n_pairs=4, gaps=(0, 9))
    tokens, _, distances = make_batch(cfg, 50, 2)
    n = cfg.n_pairs
    for row, dist in zip(tokens, distances):
        sep = int(np.flatnonzero(row == SEP)[0])
        gap = next(g for g in cfg.gaps if row[sep - g - 2] in cfg.vocab.keys)  # the last pair's key
        start = sep - 2 * n - gap
        for j in range(n):
            i = int(np.flatnonzero(row[start : start + 2 * n : 2] == row[-n + j])[0])
            assert dist[-n + j] == gap + 2 * (n - i) + j
    assert len(np.unique(tokens[:, -n:], axis=0)) > 1  # the queries are permuted, not in pair order


def test_selective_copy_keeps_order_and_gap() -> None:
    cfg = SelectiveCopyConfig(seq_len=30, n_tokens=5, gap=6)
    tokens, targets, distances = make_batch(cfg, 20, 3)
    for row, y, d in zip(tokens, targets, distances):
        data_pos = [i for i, t in enumerate(row) if t in cfg.vocab.values]
        assert max(data_pos) < cfg.region_len  # the gap holds only noise
        assert y[-5:].tolist() == row[data_pos].tolist()
        assert d[-5:].min() >= cfg.gap + 2


def test_seeds_reproduce() -> None:
    for cfg in (PasskeyConfig(), AssociativeRecallConfig(), SelectiveCopyConfig()):
        a, b = make_batch(cfg, 4, 123), make_batch(cfg, 4, np.random.default_rng(123))
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
        assert not np.array_equal(a[0], make_batch(cfg, 4, 124)[0])
        gen = np.random.default_rng(5)
        first, second = make_example(cfg, gen), make_example(cfg, gen)  # a generator moves on between calls
        assert not np.array_equal(first.tokens, second.tokens)


def test_vocabulary_ranges_do_not_collide() -> None:
    v = Vocab(n_filler=3, n_keys=5, n_values=7)
    specials = [PAD, SEP, QUERY, MARK]
    ids = specials + list(v.filler) + list(v.keys) + list(v.values)
    assert sorted(ids) == list(range(v.size))  # disjoint and contiguous
    assert len(set(specials)) == 4 and v.size == 4 + 3 + 5 + 7
    assert PasskeyConfig(n_filler=3, n_keys=5, n_values=7).vocab_size == v.size


# --- accuracy by distance ----------------------------------------------------------------------------------------


def test_accuracy_by_distance() -> None:
    targets = np.array([[IGNORE_INDEX, 5, 6], [IGNORE_INDEX, 5, 7]])
    distances = np.array([[0, 3, 8], [0, 3, 8]])
    preds = np.array([[9, 5, 6], [9, 4, 6]])  # distance 3: 1 of 2 right; distance 8: 1 of 2 right
    assert accuracy_by_distance(preds, targets, distances) == {3: 0.5, 8: 0.5}
    assert accuracy_by_distance(targets, targets, distances) == {3: 1.0, 8: 1.0}
    logits = np.eye(10)[preds]  # (B, L, V) scores are arg-maxed
    assert accuracy_by_distance(logits, targets, distances) == {3: 0.5, 8: 0.5}
    with pytest.raises(ValueError, match="same shape"):
        accuracy_by_distance(preds[:, :2], targets, distances)


def test_accuracy_by_distance_on_a_batch() -> None:
    cfg = AssociativeRecallConfig(seq_len=40, n_pairs=3, gaps=(0, 5))
    tokens, targets, distances = make_batch(cfg, 16, 0)
    result = accuracy_by_distance(targets, targets, distances)
    assert set(result) == set(distances[targets != IGNORE_INDEX].tolist()) and set(result.values()) == {1.0}
    wrong = np.where(targets == IGNORE_INDEX, targets, cfg.vocab.values.start - 1)
    assert set(accuracy_by_distance(wrong, targets, distances).values()) == {0.0}


# --- bad configs -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "key"),
    [
        (lambda: PasskeyConfig(seq_len=3, distances=(2,)), "passkey.seq_len"),
        (lambda: PasskeyConfig(seq_len=10, distances=(9,)), "passkey.distances"),
        (lambda: PasskeyConfig(seq_len=10, distances=(1,)), "passkey.distances"),
        (lambda: PasskeyConfig(distances=()), "passkey.distances"),
        (lambda: PasskeyConfig(n_values=1), "passkey.n_values"),
        (lambda: PasskeyConfig(n_filler=0), "passkey.n_filler"),
        (lambda: PasskeyConfig(seq_len=10.0), "passkey.seq_len"),
        (lambda: AssociativeRecallConfig(n_pairs=0), "associative_recall.n_pairs"),
        (lambda: AssociativeRecallConfig(n_pairs=5, n_keys=4), "associative_recall.n_pairs"),
        (lambda: AssociativeRecallConfig(seq_len=12, n_pairs=4, gaps=(0,)), "associative_recall.seq_len"),
        (lambda: AssociativeRecallConfig(seq_len=20, n_pairs=4, gaps=(8,)), "associative_recall.gaps"),
        (lambda: AssociativeRecallConfig(gaps=(-1,)), "associative_recall.gaps"),
        (lambda: SelectiveCopyConfig(n_tokens=0), "selective_copy.n_tokens"),
        (lambda: SelectiveCopyConfig(gap=-1), "selective_copy.gap"),
        (lambda: SelectiveCopyConfig(seq_len=10, n_tokens=4, gap=2), "selective_copy.seq_len"),
        (lambda: task_config("copy"), "task"),
        (lambda: task_config("passkey", distance=3), "passkey.distance"),
        (lambda: make_batch(PasskeyConfig(), 0, 0), "batch_size"),
    ],
)
def test_bad_configs_raise(make, key: str) -> None:
    with pytest.raises(ConfigError, match=f"^{key}:") as info:
        make()
    assert "\n" not in str(info.value)


def test_task_config_by_name_accepts_lists() -> None:
    cfg = task_config("associative_recall", seq_len=30, gaps=[1, 2], n_pairs=2)
    assert cfg == AssociativeRecallConfig(seq_len=30, gaps=(1, 2), n_pairs=2)
    check_with_oracle(cfg)
