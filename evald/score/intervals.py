"""The 95% interval of a mean over queries that `evald score --mean` prints, inside the
measure's range.

Why not the t interval alone: a measure bounded to [0, 1] averaged over few queries, or with a
mean near a bound, gets a t interval reaching past the bound (RR [0.12, 1.55] at n = 3), which
no mean can take. So (docs/score.md, "Intervals"):

1. A measure whose every value sits at a bound of its range (Success@k, a binary measure) gets
   the **Wilson score interval** of a proportion: the means μ with
   |p − μ| ≤ z · sqrt(μ(1 − μ) / n), p the mean rescaled to [0, 1].
2. Any other bounded measure gets the same interval with the **effective sample size**
   n* = p(1 − p) / se², se² = s² / n the squared standard error of the rescaled mean, taken
   down by (z / t(n − 1))² for the degrees of freedom (Korn and Graubard, 1998): inside the
   range the interval is then about the t interval, near a bound it bends to stay inside.
3. An unbounded measure (DCG, CG, the counts NumRet, NumRel, NumRelRet) keeps the t interval.

Everything comes from the running count, mean and sum of squared deviations: memory stays
constant however many queries are scored.
"""

from __future__ import annotations

import math


def wilson(p: float, n: float, z: float) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``p`` over ``n`` trials (``n`` may be an
    effective, non-integer count): both ends within [0, 1]."""
    z2n = z * z / n
    center = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * math.sqrt(p * (1 - p) / n + z2n / (4 * n))
    return max(0.0, center - half), min(1.0, center + half)


def t_quantile(df: float, level: float) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom."""
    from scipy.special import stdtrit  # Student t quantile; scipy.stats costs ~1 s to import

    return float(stdtrit(df, 0.5 + level / 2))


def z_quantile(level: float) -> float:
    """The two-sided ``level`` quantile of the standard normal."""
    from scipy.special import ndtri

    return float(ndtri(0.5 + level / 2))


def mean_interval(
    count: int,
    mean: float,
    m2: float,
    *,
    span: tuple[float, float] | None,
    interior: int,
    level: float = 0.95,
) -> tuple[float, float] | None:
    """The interval of the mean of ``count`` values with sum of squared deviations ``m2``;
    ``span`` the values' range (None: unbounded), ``interior`` how many values lie strictly
    inside it. None for fewer than 2 values."""
    if count < 2:
        return None
    t = t_quantile(count - 1, level)
    if span is None:
        half = t * math.sqrt(m2 / (count - 1) / count)
        return mean - half, mean + half
    low, high = span
    width = high - low
    p = min(1.0, max(0.0, (mean - low) / width))
    z = z_quantile(level)
    if interior == 0:  # every value at a bound: a proportion
        a, b = wilson(p, count, z)
    else:
        se2 = m2 / (count - 1) / count / (width * width)
        if se2 <= 0.0:  # every value the same: no spread to speak of
            return mean, mean
        effective = p * (1 - p) / se2 * (z / t) ** 2
        a, b = wilson(p, effective, z)
    return low + a * width, low + b * width
