"""Intervals and tests over seeds: Student-t quantiles, the mean's interval, paired differences, the paired t-test,
exact permutation tests and Holm's correction, against published values and hand computations."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer.analysis.stats import (
    holm,
    mean_interval,
    paired_differences,
    paired_t_test,
    permutation_test,
    t_quantile,
)

# two-sided 95% critical values of Student's t (any statistics table)
T975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 9: 2.2622, 29: 2.0452, 120: 1.9799}


@pytest.mark.parametrize("df,expected", sorted(T975.items()))
def test_t_quantile_matches_the_table(df: int, expected: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-4)


def test_t_quantile_tends_to_the_normal_and_other_levels() -> None:
    assert t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=1e-4)
    assert t_quantile(0.995, 2) == pytest.approx(9.9248, abs=1e-3)  # 99% two-sided, df 2
    assert t_quantile(0.95, 4) == pytest.approx(2.1318, abs=1e-4)  # 90% two-sided, df 4
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError):
        t_quantile(0.9, 0)


def test_mean_interval_by_hand() -> None:
    iv = mean_interval([2.0, 4.0, 9.0])
    sd = statistics.stdev([2.0, 4.0, 9.0])
    assert iv.mean == pytest.approx(5.0)
    assert iv.std == pytest.approx(sd)
    assert iv.half_width == pytest.approx(4.3027 * sd / math.sqrt(3), rel=1e-4)
    assert (iv.low, iv.high) == pytest.approx((5.0 - iv.half_width, 5.0 + iv.half_width))
    assert iv.n == 3 and iv.level == 0.95
    wider = mean_interval([2.0, 4.0, 9.0], level=0.99)
    assert wider.half_width > iv.half_width


def test_mean_interval_edge_cases() -> None:
    one = mean_interval([1.5])
    assert one.mean == 1.5 and math.isnan(one.half_width) and one.to_dict()["half_width"] is None
    assert one.format() == "1.500"
    none = mean_interval([])
    assert none.n == 0 and none.format() == "-"
    assert mean_interval([1.0, float("nan"), 3.0]).n == 2, "non-finite values are left out"
    assert mean_interval([4.0, 4.0, 4.0]).half_width == 0.0
    with pytest.raises(ValueError):
        mean_interval([1.0, 2.0], level=1.0)


@settings(max_examples=50, deadline=None)
@given(xs=st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=8))
def test_interval_is_centred_on_the_mean_and_grows_with_the_level(xs: list[float]) -> None:
    a, b = mean_interval(xs, 0.9), mean_interval(xs, 0.95)
    assert a.mean == pytest.approx(sum(xs) / len(xs), abs=1e-9)
    assert 0.0 <= a.half_width <= b.half_width + 1e-12


def test_paired_differences_pair_by_seed() -> None:
    variant = {0: 1.00, 1: 1.10, 2: 0.95, 3: 2.0}
    baseline = {0: 1.05, 1: 1.12, 2: 0.97, 4: 0.1}  # seed 3 and 4 have no partner
    d = paired_differences(variant, baseline)
    assert d["n"] == 3 and set(d["per_seed"]) == {"0", "1", "2"}
    assert d["per_seed"]["0"] == pytest.approx(-0.05)
    assert d["lower_in"] == 3
    diffs = [-0.05, -0.02, -0.02]
    assert d["interval"]["mean"] == pytest.approx(sum(diffs) / 3)
    assert d["interval"]["half_width"] == pytest.approx(4.3027 * statistics.stdev(diffs) / math.sqrt(3), rel=1e-4)


# Student's sleep data (Cushny & Peebles; R's `sleep`): extra hours of sleep of ten patients under two drugs. R's
# `t.test(extra ~ group, data = sleep, paired = TRUE)`: t = -4.0621, df = 9, p-value = 0.002833, 95% interval
# [-2.4598858, -0.7001142], mean difference -1.58.
SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_paired_t_test_and_interval_match_the_published_sleep_example() -> None:
    a, b = dict(enumerate(SLEEP_1)), dict(enumerate(SLEEP_2))
    assert paired_t_test(a, b) == pytest.approx(0.002833, abs=5e-7)
    assert paired_t_test(a, b, alternative="less") == pytest.approx(0.002833 / 2, abs=5e-7)
    assert paired_t_test(a, b, alternative="greater") == pytest.approx(1 - 0.002833 / 2, abs=5e-7)
    d = paired_differences(a, b)
    assert d["interval"]["mean"] == pytest.approx(-1.58)
    assert (d["interval"]["low"], d["interval"]["high"]) == pytest.approx((-2.4598858, -0.7001142), abs=1e-6)
    assert d["p"] == pytest.approx(0.002833, abs=5e-7) and d["lower_in"] == 9


def test_paired_t_test_without_spread_and_bad_input() -> None:
    assert paired_t_test({0: 2.0, 1: 3.0}, {0: 1.0, 1: 2.0}) == 0.0  # every difference +1: no doubt left
    assert paired_t_test({0: 2.0, 1: 3.0}, {0: 1.0, 1: 2.0}, alternative="less") == 1.0
    assert paired_t_test({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}) == 1.0
    with pytest.raises(ValueError):
        paired_t_test({0: 1.0}, {0: 2.0})
    with pytest.raises(ValueError):
        paired_t_test({0: 1.0, 1: 2.0}, {0: 2.0, 1: 1.0}, alternative="bigger")
    assert paired_differences({0: 1.0}, {0: 2.0})["p"] is None


def test_exact_permutation_floors_with_three_seeds() -> None:
    hi, lo = [0.92, 0.99, 0.70], [0.50, 0.51, 0.49]
    assert permutation_test(hi, lo, alternative="greater") == pytest.approx(1 / 20)  # every seed above: the floor
    assert permutation_test(hi, lo) == pytest.approx(2 / 20)
    assert permutation_test(lo, hi, alternative="greater") == pytest.approx(1.0)
    assert permutation_test(hi, lo, paired=True, alternative="greater") == pytest.approx(1 / 8)
    # 0.95 + 0.9 with any of 0.6, 0.55, 0.52 or 0.5 (the observed split) sums as high or higher: 4 of 20
    assert permutation_test([0.9, 0.5, 0.95], [0.6, 0.55, 0.52], alternative="greater") == pytest.approx(4 / 20)
    with pytest.raises(ValueError):
        permutation_test([1.0, 2.0], [1.0], paired=True)
    with pytest.raises(ValueError):
        permutation_test([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        permutation_test([1.0, 2.0], [1.0, 3.0], alternative="up")


def _brute_force(a: list[float], b: list[float], paired: bool) -> float:
    """One-sided ("greater") p by enumerating every relabelling by hand."""
    observed = sum(a) / len(a) - sum(b) / len(b)
    if paired:
        d = [x - y for x, y in zip(a, b)]
        stats = [sum(s * v for s, v in zip(signs, d)) / len(d) for signs in itertools.product((1, -1), repeat=len(d))]
    else:
        pooled, n = a + b, len(a)
        stats = []
        for idx in itertools.combinations(range(len(pooled)), n):
            x = [pooled[i] for i in idx]
            y = [pooled[i] for i in range(len(pooled)) if i not in idx]
            stats.append(sum(x) / n - sum(y) / len(y))
    return sum(s >= observed - 1e-12 for s in stats) / len(stats)


@settings(max_examples=40, deadline=None)
@given(
    ab=st.integers(2, 4).flatmap(
        lambda n: st.tuples(*[st.lists(st.integers(0, 20).map(lambda v: v / 20), min_size=n, max_size=n)] * 2)
    ),
    paired=st.booleans(),
)
def test_permutation_test_equals_the_enumeration_by_hand(ab: tuple[list[float], list[float]], paired: bool) -> None:
    a, b = ab
    assert permutation_test(a, b, paired=paired, alternative="greater") == pytest.approx(
        _brute_force(a, b, paired), abs=1e-9
    )


def test_ties_at_a_zero_difference_count_as_ties() -> None:
    # the observed mean difference is 0 up to rounding, as are other relabellings summed in another order
    a, b = [-0.4, 0.3 + 1e-16, 0.4, -0.3], [-0.2, -0.2, 0.25, 0.2 - 1e-16]
    assert permutation_test(a, b, paired=True, alternative="greater") == pytest.approx(_brute_force(a, b, True))
    assert permutation_test(a, b, alternative="greater") == pytest.approx(_brute_force(a, b, False))


def test_holm_matches_the_published_example() -> None:
    # Wikipedia's Holm-Bonferroni example: p = 0.01, 0.04, 0.03, 0.005 at alpha 0.05 rejects the first and the
    # fourth; adjusted: 4 x 0.005, 3 x 0.01, 2 x 0.03, max(1 x 0.04, 0.06)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.2, 0.9]) == pytest.approx([0.4, 0.9]) and holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []


@settings(max_examples=50, deadline=None)
@given(ps=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=10))
def test_holm_lies_between_the_raw_p_and_bonferroni_and_keeps_the_order(ps: list[float]) -> None:
    adj = holm(ps)
    for p, q in zip(ps, adj):
        assert p - 1e-12 <= q <= min(1.0, len(ps) * p) + 1e-12
    for i, j in itertools.product(range(len(ps)), repeat=2):
        if ps[i] < ps[j]:
            assert adj[i] <= adj[j] + 1e-12
