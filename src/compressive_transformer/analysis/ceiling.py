"""How much of the ceiling gap a compressed memory recovers: (baseline - candidate) / (baseline - ceiling).

The baseline is Transformer-XL at the Compressive Transformer's attention cost, the ceiling Transformer-XL with the
Compressive Transformer's reach uncompressed; 0 means the compressed memory is worth nothing beyond the baseline, 1
that it is worth as much as keeping everything raw. Losses are per seed, and every seed trains every arm on the
same data order, so the differences are paired by seed.

The interval of a ratio of two means is Fieller's (paired form: the covariance of numerator and denominator over
seeds enters), with Student's t on n - 1 degrees of freedom. It is the set of ratios R for which ā - R b̄ is not
significantly different from zero, so it is exact under normality and honest about a denominator near zero: when
the ceiling gap itself is not clearly above zero the interval is unbounded and is reported as such (``None``).
With three seeds t is 4.30 and the interval is wide; a per-seed ratio is shown beside it, never averaged alone
(a seed whose gap is near zero would dominate such a mean).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from compressive_transformer.analysis.stats import mean_interval, t_quantile


@dataclass(frozen=True)
class RatioInterval:
    """ā / b̄ with its Fieller interval; ``low``/``high`` are None when the interval is unbounded."""

    ratio: float
    low: float | None
    high: float | None
    n: int
    level: float

    @property
    def bounded(self) -> bool:
        return self.low is not None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}

    def format(self, digits: int = 2) -> str:
        if self.n == 0 or not math.isfinite(self.ratio):
            return "-"
        if not self.bounded:
            return f"{self.ratio:.{digits}f} [unbounded]"
        return f"{self.ratio:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def fieller_interval(num: Sequence[float], den: Sequence[float], level: float = 0.95) -> RatioInterval:
    """Ratio of the means of paired samples ``num`` and ``den`` and its two-sided ``level`` Fieller interval."""
    if len(num) != len(den):
        raise ValueError(f"paired samples must have equal length, got {len(num)} and {len(den)}")
    n = len(num)
    if n == 0:
        return RatioInterval(math.nan, None, None, 0, level)
    a, b = sum(num) / n, sum(den) / n
    ratio = a / b if b != 0 else math.nan
    if n < 2:
        return RatioInterval(ratio, None, None, n, level)
    saa = sum((x - a) ** 2 for x in num) / (n - 1) / n  # variances and covariance of the two means
    sbb = sum((y - b) ** 2 for y in den) / (n - 1) / n
    sab = sum((x - a) * (y - b) for x, y in zip(num, den)) / (n - 1) / n
    t2 = t_quantile(0.5 + level / 2.0, n - 1) ** 2
    # R is inside when (a - R b)^2 <= t^2 (saa - 2 R sab + R^2 sbb): the quadratic A R^2 - 2 B R + C <= 0
    qa, qb, qc = b * b - t2 * sbb, a * b - t2 * sab, a * a - t2 * saa
    disc = qb * qb - qa * qc
    if qa <= 0:  # the denominator's mean is not clearly away from zero: no bounded interval
        return RatioInterval(ratio, None, None, n, level)
    root = math.sqrt(max(disc, 0.0))  # >= 0 whenever qa > 0; a negative value is rounding (no spread at all)
    return RatioInterval(ratio, (qb - root) / qa, (qb + root) / qa, n, level)


def recovered_fraction(
    baseline: Mapping[Any, float],
    candidate: Mapping[Any, float],
    ceiling: Mapping[Any, float],
    level: float = 0.95,
) -> dict[str, Any]:
    """(baseline - candidate) / (baseline - ceiling) per seed and as a ratio of mean gaps with its Fieller interval,
    over the seeds all three hold. Lower loss is better, so a positive gap is an improvement over the baseline."""
    seeds = sorted(set(baseline) & set(candidate) & set(ceiling))
    gained = [baseline[s] - candidate[s] for s in seeds]
    gap = [baseline[s] - ceiling[s] for s in seeds]
    return {
        "seeds": [str(s) for s in seeds],
        "gained": gained,
        "gap": gap,
        "per_seed": {str(s): (g / c if c != 0 else None) for s, g, c in zip(seeds, gained, gap)},
        "fraction": fieller_interval(gained, gap, level).to_dict(),
        "gap_interval": mean_interval(gap, level).to_dict(),  # the ceiling gap alone
    }


__all__ = ["RatioInterval", "fieller_interval", "recovered_fraction"]
