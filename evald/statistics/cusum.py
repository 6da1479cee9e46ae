"""Drop detection: a one-sided (lower) CUSUM on standardized window means.

Page, "Continuous inspection schemes" (Biometrika, 1954); run lengths by Siegmund's
approximation (Siegmund, "Sequential Analysis", 1985, ch. X). Each window's mean is standardized
by its own n, z = (x̄ − μ0)/(σ0/√n), so z ~ N(0, 1) whatever the traffic: a traffic change with
an unchanged mean does not move the statistic. Windows below the minimum n are skipped (neither
counted nor a reset).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray

from evald.statistics.intervals import Moments

__all__ = [
    "DEFAULT_H",
    "DEFAULT_K",
    "DEFAULT_MIN_N",
    "Cusum",
    "cusum_update",
    "difference_z",
    "siegmund_arl",
    "standardized_z",
]

#: k = 0.5 is tuned to a drop of 1 standard error of a window mean (k = shift/2 is optimal);
#: h = 5 gives about 930 windows between false alarms (39 days of hourly windows) and detects a
#: 1-SE drop in about 10 windows.
DEFAULT_K = 0.5
DEFAULT_H = 5.0
DEFAULT_MIN_N = 30


def standardized_z(window: Moments, mu0: float, sigma0: float) -> float:
    """(x̄ − μ0)/(σ0/√n) against a known baseline mean and standard deviation."""
    if window.n == 0 or not sigma0 > 0:
        return math.nan
    return (window.mean - mu0) / (sigma0 / math.sqrt(window.n))


def difference_z(reference: Moments, window: Moments) -> float:
    """(x̄ − x̄_ref)/√(s²/n + s_ref²/n_ref): treatment against control in the same window, or a
    window against its own trailing baseline (seasonality cancels in the first)."""
    if window.n < 2 or reference.n < 2:
        return math.nan
    se2 = window.variance / window.n + reference.variance / reference.n
    if not se2 > 0:
        return math.nan
    return (window.mean - reference.mean) / math.sqrt(se2)


def cusum_update(statistic: ArrayLike, z: ArrayLike, k: float = DEFAULT_K) -> NDArray[np.float64]:
    """C_t = max(0, C_{t−1} − z_t − k): grows while windows fall below the baseline."""
    return np.maximum(0.0, np.asarray(statistic, dtype=np.float64) - np.asarray(z) - k)


def siegmund_arl(k: float = DEFAULT_K, h: float = DEFAULT_H, drop: float = 0.0) -> float:
    """Average run length (windows) of the lower CUSUM for a drop of ``drop`` standard errors.

    ARL ≈ (e^{−2Δb} + 2Δb − 1)/(2Δ²), Δ = drop − k, b = h + 1.166; b² when Δ = 0.
    ``drop = 0`` gives the run length to a false alarm.
    """
    delta, b = drop - k, h + 1.166
    if abs(delta) < 1e-12:
        return b * b
    return (math.exp(-2.0 * delta * b) + 2.0 * delta * b - 1.0) / (2.0 * delta * delta)


@dataclass(frozen=True)
class Cusum:
    """The statistic folded over windows in window order; ``alarm_window`` is the first alarm."""

    statistic: float = 0.0
    windows: int = 0
    alarm_window: int | None = None

    @property
    def alarmed(self) -> bool:
        return self.alarm_window is not None

    def step(
        self,
        z: float,
        n: int,
        k: float = DEFAULT_K,
        h: float = DEFAULT_H,
        min_n: int = DEFAULT_MIN_N,
    ) -> Cusum:
        """Fold one window of ``n`` lists with standardized mean ``z``."""
        if n < min_n or not math.isfinite(z):
            return self
        statistic = float(cusum_update(self.statistic, z, k))
        windows = self.windows + 1
        alarm = self.alarm_window
        if alarm is None and statistic > h:
            alarm = windows
        return replace(self, statistic=statistic, windows=windows, alarm_window=alarm)

    def to_json(self) -> dict[str, object]:
        return {
            "statistic": self.statistic,
            "windows": self.windows,
            "alarm_window": self.alarm_window,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Cusum:
        alarm = data["alarm_window"]
        return cls(
            float(data["statistic"]),  # type: ignore[arg-type]
            int(data["windows"]),  # type: ignore[call-overload]
            None if alarm is None else int(alarm),  # type: ignore[call-overload]
        )
