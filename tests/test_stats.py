"""Intervals over seeds: Student-t quantiles, the mean's interval and paired differences, against hand computations."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer.analysis.stats import incomplete_beta, mean_interval, paired_differences, t_cdf, t_quantile

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


def test_incomplete_beta_closed_forms() -> None:
    # I_x(1, 1) = x; I_x(a, 1) = x^a; I_x(1, b) = 1 - (1 - x)^b
    for x in (0.0, 0.1, 0.5, 0.93, 1.0):
        assert incomplete_beta(1, 1, x) == pytest.approx(x)
        assert incomplete_beta(3, 1, x) == pytest.approx(x**3)
        assert incomplete_beta(1, 2.5, x) == pytest.approx(1 - (1 - x) ** 2.5)


@settings(max_examples=60, deadline=None)
@given(p=st.floats(0.01, 0.999), df=st.integers(1, 60))
def test_quantile_inverts_the_cdf(p: float, df: int) -> None:
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


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
