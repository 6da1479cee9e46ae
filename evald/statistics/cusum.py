"""Drop detection: a one-sided (lower) CUSUM on standardized window means.

Page, "Continuous inspection schemes" (Biometrika, 1954); run lengths by Siegmund's
approximation (Siegmund, "Sequential Analysis", 1985, ch. X). Each window's mean is standardized
by its own n, z = (x̄ − μ0)/(σ0/√n), so z ~ N(0, 1) whatever the traffic: a traffic change with
an unchanged mean does not move the statistic. Windows below the minimum n are skipped (neither
counted nor a reset).

When users come back, consecutive windows share users and their z's correlate: a run of m
windows carries less evidence than m independent ones. Given each window's replicate deviations
of z (clustered.py: the same user weights in every window), ``Cusum.step`` standardizes the sum
of the current run (the windows since the statistic was last 0) by the run's own clustered
variance, never below m: C_t = max(0, −Z·√(m/v) − k·m) with Z the run's Σz and
v = max(m, (1/B) Σ_b (Σ_run ζ_b)²). With v = m that is Page's recursion exactly, which is what a
step without replicates (the request-level fallback) runs (docs/statistics.md §4).

Treatment against control (``Cusum.step_contrast``) standardizes by a variance pooled over the
stream when the window's own is smaller, which with few users per window is noisy and moves
with the window's mean (a skewed, heavy-tailed z): the window's variance is taken as
max(V_t, (Σ_s w_s V_s / Σ_s w_s a_s)·a_t) with a = 1/n_minus + 1/n_plus over the windows
stepped so far, this one included, each weighing w_s = 2^(−age/POOL_HALF_LIFE) (a self-starting
chart: Hawkins, "Self-starting CUSUM charts for location and scale", The Statistician 1987,
made to forget so that a change of the measure's variance neither alarms nor deafens it for
good). The run's variance is also kept from below by the stream's correlation between windows
with replicates, taken as exchangeable: v ≥ m·(1 + (m − 1)·ρ), ρ from the spread of their
weighted replicate sums (``stream_correlation``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from evald.statistics.intervals import Moments

__all__ = [
    "DEFAULT_H",
    "DEFAULT_K",
    "DEFAULT_MIN_N",
    "POOL_HALF_LIFE",
    "Cusum",
    "cusum_update",
    "difference_z",
    "forgetting",
    "pooled_variance",
    "run_statistic",
    "siegmund_arl",
    "standardized_z",
    "stream_correlation",
]

#: k = 0.5 is tuned to a drop of 1 standard error of a window mean (k = shift/2 is optimal);
#: h = 5 gives about 930 windows between false alarms (39 days of hourly windows) and detects a
#: 1-SE drop in about 10 windows.
DEFAULT_K = 0.5
DEFAULT_H = 5.0
DEFAULT_MIN_N = 30
#: The pooled variance's half-life, in windows: a day of hourly windows, as the baseline's
#: default ``baseline_windows``. Its pool is worth 1/(1 − 2^(−1/24)) ≈ 35 windows, so its
#: estimate still varies ~4x less than a window's own, and a change of the measure's variance
#: is half forgotten in a day.
POOL_HALF_LIFE = 24.0


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


def pooled_variance(
    variance_sum: ArrayLike, scale_sum: ArrayLike, scale: ArrayLike
) -> NDArray[np.float64]:
    """(Σ_s V_s / Σ_s a_s)·a_t: a window's contrast variance predicted from the stream's, with
    a = 1/n_minus + 1/n_plus (exact when both arms' lists have the same variance per list)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        total = np.asarray(scale_sum, dtype=np.float64)
        return np.asarray(variance_sum, dtype=np.float64) / total * np.asarray(scale, np.float64)


def stream_correlation(
    stream_replicates: ArrayLike, squared_sum: ArrayLike, sd_sum: ArrayLike, windows: ArrayLike
) -> NDArray[np.float64]:
    """ρ = max(0, mean_b S_b² − Q)/(R² − Q): the correlation between two windows' contrasts,
    taken as exchangeable, implied by the spread of S_b = Σ_s w_s D_b,s, with Q = Σ_s w_s² V_s
    and R = Σ_s w_s √V_s over the stream's windows with replicates (weights w_s; 0 for fewer
    than two windows). With w = 1 and equal V it is (Φ − 1)/(t − 1), Φ the design effect."""
    t = np.asarray(windows, dtype=np.float64)
    spread = np.mean(np.square(np.asarray(stream_replicates, dtype=np.float64)), axis=-1)
    q, r = np.asarray(squared_sum, np.float64), np.asarray(sd_sum, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.fmax(0.0, spread - q) / (r * r - q)
    return np.where(t > 1, np.nan_to_num(rho, posinf=0.0), 0.0)


def forgetting(half_life: float) -> float:
    """The weight a pooled window loses per window: 2^(−1/half-life) (1: never forgets)."""
    return 2.0 ** (-1.0 / half_life)


def run_statistic(
    run_sum: ArrayLike,
    windows: ArrayLike,
    run_replicates: ArrayLike,
    k: float = DEFAULT_K,
    correlation: ArrayLike = 0.0,
) -> NDArray[np.float64]:
    """max(0, −Z·√(m/v) − k·m), v = max(m·(1 + (m − 1)·ρ), mean_b R_b²): the statistic of a
    run of m windows with Σz = Z, summed replicate deviations R (replicates on the last axis)
    and windows correlating at ρ (``correlation``) at least."""
    m = np.asarray(windows, dtype=np.float64)
    spread = np.mean(np.square(np.asarray(run_replicates, dtype=np.float64)), axis=-1)
    v = np.fmax(m * (1.0 + np.fmax(0.0, m - 1.0) * np.asarray(correlation)), spread)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(m > 0, np.sqrt(m / v), 0.0)
    return np.maximum(0.0, -np.asarray(run_sum, dtype=np.float64) * scale - k * m)


def siegmund_arl(k: float = DEFAULT_K, h: float = DEFAULT_H, drop: float = 0.0) -> float:
    """Average run length (windows) of the lower CUSUM for a drop of ``drop`` standard errors.

    ARL ≈ (e^{−2Δb} + 2Δb − 1)/(2Δ²), Δ = drop − k, b = h + 1.166; b² when Δ = 0.
    ``drop = 0`` gives the run length to a false alarm.
    """
    delta, b = drop - k, h + 1.166
    if abs(delta) < 1e-12:
        return b * b
    if -2.0 * delta * b > 700.0:  # e^700 ≈ 1e304: beyond, the run length is not a double
        return math.inf
    return (math.exp(-2.0 * delta * b) + 2.0 * delta * b - 1.0) / (2.0 * delta * delta)


@dataclass(frozen=True)
class Cusum:
    """The statistic folded over windows in window order; ``alarm_window`` is the first alarm.

    ``run_sum``, ``run_windows`` and ``run_replicates`` describe the current run (the windows
    since the statistic was last 0) of a CUSUM fed replicate deviations; a CUSUM never fed any
    keeps ``run_replicates`` None and follows Page's recursion. ``variance_sum`` and
    ``scale_sum`` (Σ V and Σ a, each window weighing 2^(−age/half-life)) over the
    ``pooled_windows`` windows ``step_contrast`` stepped are the stream's pooled variance;
    ``stream_replicates``, ``replicate_variance``, ``replicate_sd`` (Σ w D_b, Σ w² V, Σ w √V)
    over its ``replicate_windows`` windows with replicates, its correlation between windows;
    ``replicate_gap``: the windows stepped since the last with replicates, over which that
    correlation fades as the pool does (replicates that stopped, as after a restart with
    ``bootstrap_replicates: 0``, do not floor the runs of the windows after them for ever)."""

    statistic: float = 0.0
    windows: int = 0
    alarm_window: int | None = None
    run_sum: float = 0.0
    run_windows: int = 0
    run_replicates: tuple[float, ...] | None = field(default=None, repr=False)
    variance_sum: float = 0.0
    scale_sum: float = 0.0
    pooled_windows: int = 0
    stream_replicates: tuple[float, ...] | None = field(default=None, repr=False)
    replicate_variance: float = 0.0
    replicate_sd: float = 0.0
    replicate_windows: int = 0
    replicate_gap: int = 0

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
        replicates: NDArray[np.float64] | None = None,
    ) -> Cusum:
        """Fold one window of ``n`` lists with standardized mean ``z`` and, when clustered,
        the replicate deviations of z (``replicates``, one per bootstrap replicate)."""
        if n < min_n or not math.isfinite(z):
            return self
        return self._advance(z, replicates, k, h, 0.0)

    def step_contrast(
        self,
        difference: float,
        variance: float,
        n_minus: int,
        n_plus: int,
        k: float = DEFAULT_K,
        h: float = DEFAULT_H,
        min_n: int = DEFAULT_MIN_N,
        replicates: NDArray[np.float64] | None = None,
        half_life: float = POOL_HALF_LIFE,
    ) -> Cusum:
        """Fold one window's contrast (difference, its own variance and, when clustered, its
        replicate deviations D_b) standardized by the stream's pooled variance, this window
        included and earlier ones weighing half per ``half_life`` windows; the run's variance
        kept from below by the stream's correlation between windows with replicates."""
        if min(n_minus, n_plus) < min_n or not (math.isfinite(difference) and variance > 0):
            return self
        scale = 1.0 / n_minus + 1.0 / n_plus
        decay = forgetting(half_life)
        start = self
        if replicates is not None and (
            _other_size(self.stream_replicates, replicates)
            or (self.stream_replicates is None and self.pooled_windows)
        ):  # B changed, or replicates began: another kind of variance, pooled afresh
            start = replace(self, variance_sum=0.0, scale_sum=0.0, pooled_windows=0)
            start = replace(start, stream_replicates=None, replicate_windows=0)
            start = replace(start, replicate_variance=0.0, replicate_sd=0.0)
        pooled = replace(
            start,
            variance_sum=decay * start.variance_sum + variance,
            scale_sum=decay * start.scale_sum + scale,
            pooled_windows=start.pooled_windows + 1,
        )
        predicted = float(pooled_variance(pooled.variance_sum, pooled.scale_sum, scale))
        sd = math.sqrt(max(variance, predicted))
        if replicates is not None:
            before = pooled.stream_replicates
            stream = replicates + (0.0 if before is None else decay * np.asarray(before))
            pooled = replace(
                pooled,
                stream_replicates=tuple(np.asarray(stream, np.float64).tolist()),
                replicate_variance=decay * decay * pooled.replicate_variance + variance,
                replicate_sd=decay * pooled.replicate_sd + math.sqrt(variance),
                replicate_windows=pooled.replicate_windows + 1,
                replicate_gap=0,
            )
        rho, kept = 0.0, pooled.stream_replicates
        if kept is not None:
            if replicates is None:
                pooled = replace(pooled, replicate_gap=pooled.replicate_gap + 1)
            sums = (pooled.replicate_variance, pooled.replicate_sd, pooled.replicate_windows)
            rho = float(stream_correlation(kept, *sums)) * decay**pooled.replicate_gap
        deviations = None if replicates is None else replicates / sd
        return pooled._advance(difference / sd, deviations, k, h, rho)

    def _advance(
        self, z: float, replicates: NDArray[np.float64] | None, k: float, h: float, rho: float
    ) -> Cusum:
        fresh = self.statistic <= 0.0
        run_sum = z + (0.0 if fresh else self.run_sum)
        run_windows = 1 + (0 if fresh else self.run_windows)
        before = None if fresh else self.run_replicates
        if _other_size(before, replicates):  # B changed mid-run: the run's replicates are unknown
            before = None
        parts = [np.asarray(x, dtype=np.float64) for x in (before, replicates) if x is not None]
        summed = parts[0] + parts[1] if len(parts) == 2 else parts[0] if parts else None
        if summed is None and rho == 0.0:  # Page's recursion, exactly
            statistic = float(cusum_update(self.statistic, z, k))
        else:  # a window without replicates adds its z and nothing to the run's deviations
            spread = np.zeros(1) if summed is None else summed
            statistic = float(run_statistic(run_sum, run_windows, spread, k, rho))
        windows = self.windows + 1
        alarm = self.alarm_window
        if alarm is None and statistic > h:
            alarm = windows
        return replace(
            self,
            statistic=statistic,
            windows=windows,
            alarm_window=alarm,
            run_sum=run_sum,
            run_windows=run_windows,
            run_replicates=None if summed is None else tuple(summed.tolist()),
        )

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {
            "statistic": self.statistic,
            "windows": self.windows,
            "alarm_window": self.alarm_window,
            "run_sum": self.run_sum,
            "run_windows": self.run_windows,
        }
        if self.run_replicates is not None:
            doc["run_replicates"] = list(self.run_replicates)
        if self.pooled_windows:
            doc["variance_sum"] = self.variance_sum
            doc["scale_sum"] = self.scale_sum
            doc["pooled_windows"] = self.pooled_windows
        if self.stream_replicates is not None:
            doc["stream_replicates"] = list(self.stream_replicates)
            doc["replicate_variance"] = self.replicate_variance
            doc["replicate_sd"] = self.replicate_sd
            doc["replicate_windows"] = self.replicate_windows
            if self.replicate_gap:
                doc["replicate_gap"] = self.replicate_gap
        return doc

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cusum:
        """The ``to_json`` form (the run and stream fields default for a state written without
        them: a state of an older release pools from its next window on)."""
        alarm = data["alarm_window"]
        replicates = data.get("run_replicates")
        stream = data.get("stream_replicates") if "replicate_windows" in data else None
        return cls(
            float(data["statistic"]),
            int(data["windows"]),
            None if alarm is None else int(alarm),
            float(data.get("run_sum", 0.0)),
            int(data.get("run_windows", 0)),
            None if replicates is None else tuple(float(x) for x in replicates),
            float(data.get("variance_sum", 0.0)),
            float(data.get("scale_sum", 0.0)),
            int(data.get("pooled_windows", 0)),
            None if stream is None else tuple(float(x) for x in stream),
            float(data.get("replicate_variance", 0.0)),
            float(data.get("replicate_sd", 0.0)),
            int(data.get("replicate_windows", 0)),
            int(data.get("replicate_gap", 0)),
        )


def _other_size(kept: tuple[float, ...] | None, replicates: NDArray[np.float64] | None) -> bool:
    """Whether replicate sums kept and a window's are of two B (``bootstrap_replicates`` changed
    between two runs): they do not add up."""
    return kept is not None and replicates is not None and len(kept) != len(replicates)
