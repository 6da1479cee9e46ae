"""Always-valid comparison of two arms: an asymptotic confidence sequence on the difference.

Waudby-Smith, Arnold, Wu, Wang, Ramdas, "Time-uniform central limit theory and asymptotic
confidence sequences" (Annals of Statistics, 2024; arXiv:2103.06476, eq. 9 for the boundary,
eq. 155 for the e-value, eq. 161 for the tuning), with the conventions of GrowthBook's
``SequentialTwoSidedTTest`` (gbstats), which the tests check against. The chance that the
sequence *ever* excludes the true difference is at most α however often it is looked at; the
running intersection keeps that guarantee and makes the bounds never widen.

The sequence is a function of (n, SE²): with the list-level SE² (lists independent, or no user
ids: the request-level fallback) it is gbstats' to the digit; with the SE² clustered by user
(clustered.py) the same function holds when users come back (docs/statistics.md §3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray

from evald.statistics.clustered import ClusterSums, as_sums, contrast
from evald.statistics.intervals import Moments

__all__ = [
    "DEFAULT_MIN_N",
    "DEFAULT_TUNING_N",
    "Comparison",
    "SequenceBound",
    "confidence_sequence",
    "half_width",
    "log_evalue",
    "mean_bound",
    "rho_squared",
    "sequence_bound",
]

#: N*, the total n at which the sequence is tightest (gbstats' default).
DEFAULT_TUNING_N = 5000.0
#: Lists per arm before a bound is published: the sequence is asymptotic (a CLT in time).
DEFAULT_MIN_N = 100


def rho_squared(alpha: float, tuning_n: float = DEFAULT_TUNING_N) -> float:
    """ρ² = (−2 ln α + ln(1 − 2 ln α)) / N*: the mixture variance tightest at n = N*."""
    if not 0.0 < alpha < 1.0 or tuning_n <= 0:
        raise ValueError("alpha must be in (0, 1) and the tuning n positive")
    return (-2.0 * math.log(alpha) + math.log(1.0 - 2.0 * math.log(alpha))) / tuning_n


def half_width(n: ArrayLike, se2: ArrayLike, alpha: float, tuning_n: float) -> NDArray[np.float64]:
    """√(n·SE²) · √(2(nρ² + 1)/(n²ρ²) · ln(√(nρ² + 1)/α)); element-wise over arrays."""
    n_ = np.asarray(n, dtype=np.float64)
    rho2 = rho_squared(alpha, tuning_n)
    tr = n_ * rho2 + 1.0
    return np.sqrt(n_ * np.asarray(se2)) * np.sqrt(
        2.0 * tr * np.log(np.sqrt(tr) / alpha) / (n_ * n_ * rho2)
    )


def log_evalue(
    n: ArrayLike, se2: ArrayLike, deviation: ArrayLike, alpha: float, tuning_n: float
) -> NDArray[np.float64]:
    """ln e = ρ²S²/(2(nρ² + 1)) − ½ ln(nρ² + 1), S² = n·deviation²/SE²; element-wise.

    SE² = 0 gives S² = +inf for a non-zero deviation (certain) and 0 for none.
    """
    n_ = np.asarray(n, dtype=np.float64)
    dev2 = np.square(np.asarray(deviation, dtype=np.float64))
    se2_ = np.asarray(se2, dtype=np.float64)
    rho2 = rho_squared(alpha, tuning_n)
    tr = n_ * rho2 + 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        s2 = np.where(dev2 > 0, n_ * dev2 / se2_, 0.0)
    return rho2 * s2 / (2.0 * tr) - 0.5 * np.log(tr)


@dataclass(frozen=True)
class SequenceBound:
    """The sequence at one look: Δ̂, its bounds (NaN below the minimum n) and the e-value;
    ``clustered``: SE² from the user clusters (False: list level, the request-level fallback)."""

    difference: float
    low: float
    high: float
    evalue: float
    n_control: int
    n_treatment: int
    clustered: bool = False

    @property
    def p_value(self) -> float:
        """min(1, 1/e): small when the data are unlikely under Δ = the tested value."""
        return min(1.0, 1.0 / self.evalue) if self.evalue > 0 else 1.0


def sequence_bound(
    difference: float,
    se2: float,
    n_control: int,
    n_treatment: int,
    alpha: float = 0.05,
    tuning_n: float = DEFAULT_TUNING_N,
    null_difference: float = 0.0,
    min_n: int = DEFAULT_MIN_N,
    clustered: bool = False,
) -> SequenceBound:
    """The (1 − α) asymptotic confidence sequence on Δ at one look, from Δ̂ and its SE².

    n = n_T + n_C, s² = n·SE², half-width = s · √(2(nρ² + 1)/(n²ρ²) · ln(√(nρ² + 1)/α)),
    e-value at Δ0: exp(ρ²·S²/(2(nρ² + 1)))/√(nρ² + 1) with S² = n(Δ̂ − Δ0)²/SE².
    The sequence excludes Δ0 exactly when e ≥ 1/α. No bound below ``min_n`` lists an arm, nor
    while SE² is 0: every list of both arms alike (a rare event not seen yet) says the CLT the
    sequence rests on has not kicked in, and a band of width 0 would exclude every Δ but Δ̂.
    """
    if min(n_control, n_treatment) < max(min_n, 2) or not (math.isfinite(se2) and se2 > 0):
        return SequenceBound(difference, math.nan, math.nan, 1.0, n_control, n_treatment, clustered)
    n = n_control + n_treatment
    lower, upper, evalue = _look(difference, se2, n, alpha, tuning_n, null_difference)
    return SequenceBound(difference, lower, upper, evalue, n_control, n_treatment, clustered)


def _look(
    value: float, se2: float, n: int, alpha: float, tuning_n: float, null_value: float
) -> tuple[float, float, float]:
    """(lower, upper, e-value at ``null_value``) of the sequence at one look, n terms."""
    half = float(half_width(n, se2, alpha, tuning_n))
    with np.errstate(over="ignore"):
        evalue = float(np.exp(log_evalue(n, se2, value - null_value, alpha, tuning_n)))
    return value - half, value + half, evalue


def mean_bound(
    mean: float,
    se2: float,
    n: int,
    alpha: float = 0.05,
    tuning_n: float = DEFAULT_TUNING_N,
    null_value: float = 0.0,
    min_n: int = DEFAULT_MIN_N,
    clustered: bool = False,
) -> SequenceBound:
    """The (1 − α) asymptotic confidence sequence on the mean of one sample of n terms (an
    interleaving preference: one term per compared list) at one look: the boundary of
    ``sequence_bound`` with n the sample size and SE² the mean's variance (the same theorem:
    Waudby-Smith et al. state it for the mean of one i.i.d. sequence). ``n_control`` and
    ``n_treatment`` of the result are both n. No bound below ``min_n`` terms."""
    if n < max(min_n, 2) or not math.isfinite(se2):
        return SequenceBound(mean, math.nan, math.nan, 1.0, n, n, clustered)
    lower, upper, evalue = _look(mean, se2, n, alpha, tuning_n, null_value)
    return SequenceBound(mean, lower, upper, evalue, n, n, clustered)


def confidence_sequence(
    control: Moments | ClusterSums,
    treatment: Moments | ClusterSums,
    alpha: float = 0.05,
    tuning_n: float = DEFAULT_TUNING_N,
    null_difference: float = 0.0,
    min_n: int = DEFAULT_MIN_N,
) -> SequenceBound:
    """The sequence on Δ = mean(treatment) − mean(control) since the start (``sequence_bound``).

    SE² = s_T²/n_T + s_C²/n_C from ``Moments`` (gbstats' sequence); from ``ClusterSums`` with
    a user id on some list, the variance clustered by user (``clustered.contrast``).
    """
    c = contrast(control, treatment)
    return sequence_bound(
        c.difference,
        c.variance,
        control.n,
        treatment.n,
        alpha,
        tuning_n,
        null_difference,
        min_n,
        c.clustered,
    )


@dataclass(frozen=True)
class Comparison:
    """A comparison since its declared start, folded over looks in window order.

    ``low``/``high`` are the running intersection of every published bound; ``p_value`` is the
    running minimum of min(1, 1/e) — the always-valid p-value. ``empty`` is set when the
    intersection is empty, which only happens when the data contradict every Δ: an alarm.
    """

    control: ClusterSums = field(default_factory=ClusterSums)
    treatment: ClusterSums = field(default_factory=ClusterSums)
    low: float = -math.inf
    high: float = math.inf
    p_value: float = 1.0
    looks: int = 0

    @property
    def empty(self) -> bool:
        return self.low > self.high

    def look(
        self,
        control_window: Moments | ClusterSums,
        treatment_window: Moments | ClusterSums,
        alpha: float = 0.05,
        tuning_n: float = DEFAULT_TUNING_N,
        min_n: int = DEFAULT_MIN_N,
    ) -> tuple[Comparison, SequenceBound]:
        """Add one window of each arm, look once; the new state and the look's own bound."""
        control = self.control + as_sums(control_window)
        treatment = self.treatment + as_sums(treatment_window)
        bound = confidence_sequence(control, treatment, alpha, tuning_n, min_n=min_n)
        low, high = self.low, self.high
        if math.isfinite(bound.low):
            low, high = max(low, bound.low), min(high, bound.high)
        state = replace(
            self,
            control=control,
            treatment=treatment,
            low=low,
            high=high,
            p_value=min(self.p_value, bound.p_value),
            looks=self.looks + 1,
        )
        return state, bound

    def excludes(self, value: float) -> bool:
        """True once the running intersection no longer contains ``value``."""
        return self.empty or not self.low <= value <= self.high

    def to_json(self) -> dict[str, object]:
        def num(x: float) -> float | str:
            return x if math.isfinite(x) else str(x)

        return {
            "control": self.control.to_json(),
            "treatment": self.treatment.to_json(),
            "low": num(self.low),
            "high": num(self.high),
            "p_value": self.p_value,
            "looks": self.looks,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Comparison:
        control, treatment = data["control"], data["treatment"]
        assert isinstance(control, dict) and isinstance(treatment, dict)
        return cls(
            ClusterSums.from_json(control),
            ClusterSums.from_json(treatment),
            float(data["low"]),  # type: ignore[arg-type]
            float(data["high"]),  # type: ignore[arg-type]
            float(data["p_value"]),  # type: ignore[arg-type]
            int(data["looks"]),  # type: ignore[call-overload]
        )
