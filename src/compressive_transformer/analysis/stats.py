"""Intervals and tests over seeds: the mean with a Student-t interval, paired differences against a baseline, the
paired t-test, exact permutation tests, and Holm's correction for several comparisons.

With three to five seeds the normal approximation is far too narrow (the 95% t quantile is 4.30 for two degrees of
freedom against 1.96), so quantiles and tests come from ``scipy.stats``. Holm's step-down adjustment is ours: SciPy
has none (its ``false_discovery_control`` controls the false discovery rate, not the family-wise error rate).

An exact permutation test over three seeds per arm has a floor: of the 20 ways to split six values into two groups
of three, the observed one is the most extreme when every seed of one arm is above every seed of the other, so the
one-sided p-value is at least 1/20 = 0.05 (two-sided 0.1); paired over three seeds (8 sign flips) at least 1/8.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

ALTERNATIVES = ("two-sided", "greater", "less")


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    from scipy import stats  # on first use: scipy.stats takes a second to import, and most commands never need it

    return float(stats.t.ppf(p, df))


@dataclass(frozen=True)
class Interval:
    """Mean of ``n`` values with the two-sided ``level`` Student-t interval; ``half_width`` is NaN when n < 2."""

    mean: float
    half_width: float
    n: int
    std: float
    level: float

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self) | {"low": self.low, "high": self.high}
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}

    def format(self, digits: int = 3) -> str:
        if self.n == 0:
            return "-"
        if math.isnan(self.half_width):
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}"


def mean_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean and ``level`` confidence interval of the mean, assuming the values are independent draws (seeds)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    xs = [float(v) for v in values if _finite(v)]
    n = len(xs)
    if n == 0:
        return Interval(math.nan, math.nan, 0, math.nan, level)
    mean = math.fsum(xs) / n
    if n == 1:
        return Interval(mean, math.nan, 1, math.nan, level)
    std = float(np.std(xs, ddof=1))
    return Interval(mean, t_quantile(0.5 + level / 2.0, n - 1) * std / math.sqrt(n), n, std, level)


def paired_differences(values: dict[Any, float], baseline: dict[Any, float], level: float = 0.95) -> dict[str, Any]:
    """``values[k] - baseline[k]`` over the keys (seeds) both hold a finite value for, with their interval, the
    two-sided paired t-test's p-value and how many differences are below zero (the variant lower, i.e. better for a
    loss)."""
    keys = _paired_keys(values, baseline)
    diffs = {k: float(values[k]) - float(baseline[k]) for k in keys}
    iv = mean_interval(list(diffs.values()), level)
    return {
        "per_seed": {str(k): d for k, d in diffs.items()},
        "interval": iv.to_dict(),
        "p": paired_t_test(values, baseline) if len(diffs) >= 2 else None,
        "lower_in": sum(d < 0 for d in diffs.values()),
        "n": len(diffs),
    }


def paired_t_test(values: dict[Any, float], baseline: dict[Any, float], alternative: str = "two-sided") -> float:
    """p-value of the paired t-test of ``values - baseline`` over the keys both hold (scipy's ``ttest_rel``);
    ``alternative`` "greater" asks whether ``values`` exceed ``baseline``. Identical differences give 0 (or 1 for
    the opposite direction) where they are not all zero, and 1 where they are."""
    _check_alternative(alternative)
    keys = _paired_keys(values, baseline)
    if len(keys) < 2:
        raise ValueError(f"a paired t-test needs at least 2 paired values, got {len(keys)}")
    a = np.array([float(values[k]) for k in keys])
    b = np.array([float(baseline[k]) for k in keys])
    d = a - b
    if np.ptp(d) == 0:  # no spread: t is infinite (or undefined at 0), which scipy reports as NaN
        if d[0] == 0:
            return 1.0
        agrees = alternative == "two-sided" or (d[0] > 0) == (alternative == "greater")
        return 0.0 if agrees else 1.0
    from scipy import stats

    return float(stats.ttest_rel(a, b, alternative=alternative).pvalue)


def permutation_test(
    a: Sequence[float], b: Sequence[float], *, paired: bool = False, alternative: str = "two-sided"
) -> float:
    """Exact p-value of the difference of means ``mean(a) - mean(b)`` under every relabelling (scipy's
    ``permutation_test`` with all permutations enumerated): unpaired, every split of the pooled values into groups
    of len(a) and len(b); ``paired``, every sign flip of the per-seed differences (a[i] and b[i] from seed i).
    ``alternative`` "greater" asks whether ``a`` is above ``b``."""
    _check_alternative(alternative)
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if paired and len(xa) != len(xb):
        raise ValueError(f"paired samples must have equal length, got {len(xa)} and {len(xb)}")
    if min(len(xa), len(xb)) < 2:  # scipy's rule, for either kind
        raise ValueError(f"a permutation test needs at least 2 values on each side, got {len(xa)} and {len(xb)}")
    # The statistic is the sum of a's values, all moved to >= 1 first: a relabelling keeps the pooled sum (and,
    # paired, each pair's sum), so it orders the relabellings as the difference of means does, while scipy's
    # tolerance for ties, relative to the observed statistic, stays above the rounding of sums taken in another
    # order (a difference of means near 0 would leave it none)
    low = min(xa.min(), xb.min())
    from scipy import stats

    result = stats.permutation_test(
        (xa - low + 1.0, xb - low + 1.0),
        lambda x, y, axis: np.sum(x, axis=axis),
        permutation_type="samples" if paired else "independent",
        vectorized=True,
        n_resamples=np.inf,  # exact: every permutation
        alternative=alternative,
    )
    return float(result.pvalue)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the k-th smallest of m is multiplied by m - k + 1,
    then made non-decreasing in that order and capped at 1. Rejecting where the adjusted p is <= alpha controls the
    family-wise error rate at alpha (Holm 1979)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p_values[i])))
        adjusted[i] = running
    return adjusted


def _paired_keys(values: dict[Any, float], baseline: dict[Any, float]) -> list[Any]:
    return sorted(k for k in values.keys() & baseline.keys() if _finite(values[k]) and _finite(baseline[k]))


def _check_alternative(alternative: str) -> None:
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {', '.join(ALTERNATIVES)}, got {alternative!r}")


def _finite(v: Any) -> bool:
    return v is not None and math.isfinite(float(v))


__all__ = [
    "Interval",
    "holm",
    "mean_interval",
    "paired_differences",
    "paired_t_test",
    "permutation_test",
    "t_quantile",
]
