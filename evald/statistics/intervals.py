"""Count, sum and sum of squares of a measure, and the Student-t interval they give.

Why plain sums: they merge by addition across partitions, instances and windows, and the same
three numbers exported as monotonic counters let PromQL compute an interval over any range.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import t as student_t

__all__ = ["DEFAULT_MIN_N", "Interval", "Moments", "t_interval"]

#: Below this many values an interval is not published (NaN): the t quantile is exact only for
#: normal data, and for the skewed, zero-heavy ranking measures its coverage needs some n.
DEFAULT_MIN_N = 30


@dataclass(frozen=True)
class Moments:
    """n, Σy and Σy² of finite values; ``a + b`` is the state of both streams together."""

    n: int = 0
    total: float = 0.0
    squares: float = 0.0

    @classmethod
    def of(cls, values: ArrayLike) -> Moments:
        """The moments of ``values`` (NaNs are skipped: a measure undefined for a list)."""
        arr = np.asarray(values, dtype=np.float64).ravel()
        arr = arr[np.isfinite(arr)]
        return cls(int(arr.size), float(arr.sum()), float(np.dot(arr, arr)))

    def __add__(self, other: Moments) -> Moments:
        return Moments(self.n + other.n, self.total + other.total, self.squares + other.squares)

    @property
    def mean(self) -> float:
        """The sample mean; NaN when empty."""
        return self.total / self.n if self.n > 0 else math.nan

    @property
    def variance(self) -> float:
        """The unbiased sample variance (Q − S²/n)/(n − 1), clipped at 0; NaN when n < 2 or
        the sums overflowed (inf − inf: clipping it would claim a variance of 0).

        The one-pass form loses about eps·mean²/variance relative precision; for measures in
        [0, 1] that is far below anything an alert looks at.
        """
        if self.n < 2:
            return math.nan
        return _clipped((self.squares - self.total * self.total / self.n) / (self.n - 1))

    def to_json(self) -> dict[str, float | int]:
        return {"n": self.n, "sum": self.total, "sum_squares": self.squares}

    @classmethod
    def from_json(cls, data: dict[str, float | int]) -> Moments:
        return cls(int(data["n"]), float(data["sum"]), float(data["sum_squares"]))


def _clipped(variance: float) -> float:
    """max(0, variance), keeping a NaN (``max(0.0, nan)`` is 0.0)."""
    return variance if math.isnan(variance) else max(0.0, variance)


@dataclass(frozen=True)
class Interval:
    """A mean and its two-sided interval; bounds are NaN when n is below the minimum."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0


@functools.lru_cache(maxsize=4096)
def t_quantile(q: float, dof: int) -> float:
    """``t.ppf(q, dof)``, computed once per (q, dof): scipy's ppf costs tens of µs, and a
    scrape asks for it per segment, measure and window while n changes slowly."""
    return float(student_t.ppf(q, dof))


def t_interval(moments: Moments, level: float = 0.95, min_n: int = DEFAULT_MIN_N) -> Interval:
    """Mean ± t(1 − (1 − level)/2, n − 1)·s/√n; bounds NaN when n < max(min_n, 2)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    mean = moments.mean
    if moments.n < max(min_n, 2):
        return Interval(mean, math.nan, math.nan, moments.n)
    quantile = t_quantile(0.5 + level / 2.0, moments.n - 1)
    half = quantile * math.sqrt(moments.variance / moments.n)
    return Interval(mean, mean - half, mean + half, moments.n)
