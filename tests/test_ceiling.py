"""The recovered fraction of the ceiling gap and Fieller's interval of a ratio of paired means."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from compressive_transformer.analysis.ceiling import fieller_interval, recovered_fraction
from compressive_transformer.analysis.stats import mean_interval


def test_a_fixed_denominator_gives_the_t_interval_of_the_numerator_scaled() -> None:
    num = [0.010, 0.014, 0.006]
    r = fieller_interval(num, [0.02, 0.02, 0.02])
    t = mean_interval(num)
    assert r.ratio == pytest.approx(t.mean / 0.02)
    assert (r.low, r.high) == (pytest.approx(t.low / 0.02), pytest.approx(t.high / 0.02))


def test_a_denominator_not_clearly_above_zero_gives_no_bounded_interval() -> None:
    r = fieller_interval([0.01, 0.02, 0.015], [0.02, -0.015, 0.001])
    assert not r.bounded and r.format().endswith("[unbounded]")
    assert not fieller_interval([0.1], [0.2]).bounded  # one seed: no interval at all


finite = st.floats(-1.0, 1.0, allow_nan=False)


@given(st.lists(st.tuples(finite, st.floats(0.05, 1.0)), min_size=2, max_size=6), st.floats(0.1, 10.0))
def test_the_interval_holds_the_ratio_and_scales_with_the_numerator(pairs, k: float) -> None:
    num, den = [p[0] for p in pairs], [p[1] for p in pairs]
    r = fieller_interval(num, den)
    if r.bounded:
        assert r.low - 1e-9 <= r.ratio <= r.high + 1e-9
        scaled = fieller_interval([k * x for x in num], den)
        assert scaled.bounded
        assert scaled.low == pytest.approx(k * r.low, rel=1e-6, abs=1e-9)
        assert scaled.high == pytest.approx(k * r.high, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize(
    "num,den", [([0.010, 0.014, 0.006], [0.021, 0.018, 0.024]), ([1.2, 0.7, 1.9, 1.1], [2.0, 1.1, 2.6, 2.2])]
)
def test_fieller_endpoints_are_where_the_t_test_of_num_minus_r_den_is_just_rejected(num, den) -> None:
    # Fieller's interval is the set of R for which mean(num - R den) = 0 is not rejected by the one-sample t-test
    # (Fieller 1954): at each end scipy's test has p = 1 - level exactly, inside it is above, outside below
    r = fieller_interval(num, den, level=0.95)
    assert r.bounded

    def p(ratio: float) -> float:
        return float(stats.ttest_1samp([x - ratio * y for x, y in zip(num, den)], 0.0).pvalue)

    assert p(r.low) == pytest.approx(0.05, abs=1e-9) and p(r.high) == pytest.approx(0.05, abs=1e-9)
    assert p(r.ratio) > 0.05 and p(r.low - 0.01) < 0.05 and p(r.high + 0.01) < 0.05


def test_recovered_fraction_per_seed_and_paired() -> None:
    base = {0: 2.00, 1: 2.10, 2: 2.05}
    ceiling = {0: 1.96, 1: 2.06, 2: 2.01}
    half = {0: 1.98, 1: 2.08, 2: 2.03}
    out = recovered_fraction(base, half, ceiling)
    assert out["per_seed"] == {s: pytest.approx(0.5) for s in ("0", "1", "2")}
    assert out["fraction"]["ratio"] == pytest.approx(0.5)
    # the gaps are identical on every seed, so the interval collapses onto the ratio
    assert out["fraction"]["low"] == pytest.approx(0.5) and out["fraction"]["high"] == pytest.approx(0.5)
    assert recovered_fraction(base, base, ceiling)["fraction"]["ratio"] == 0.0
    assert math.isclose(out["gap_interval"]["mean"], 0.04)
