"""A/B traffic with returning users: the streams docs/statistics.md's figures are measured on.

Each user has a click propensity of their own (a per-user random effect of standard deviation
``strength``), a heavy-tailed number of lists (a few users with hundreds) and comes back in
sessions of ``session`` lists, each session in a window drawn at random over the stream; each
list lands on one of ``segments`` surfaces at random. A list's measure is zero-heavy like a
ranking measure: 0 unless the user found something (probability p_u), then Beta(2, 3). Users
are assigned to an arm for good; ``shift`` lowers the treatment's measure by that share from
window ``shift_at`` on. ``treatment_share`` splits the users unequally, and ``heavy_user``
adds one user with that many lists to the treatment arm (a crawler holding most of a small
arm: what the sandwich cannot see, clustered.MIN_USERS); ``first_segment_share`` skews two
surfaces.

``simulate`` returns the window sums the engine's shares hold (clustered.row_width: n, Σy, Σy²,
lists with a user id, the bootstrap's B pairs keyed by user), per arm, surface and window; the
array forms below fold them exactly as ``fold.fold_window`` does (tested), over all surfaces at
once, so thousands of streams take seconds. ``list_level=True`` folds the first three columns
only: the variance of independent lists, the negative control.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse
from numpy.typing import NDArray

from evald.statistics.bootstrap import DEFAULT_SEED, poisson_weights
from evald.statistics.clustered import (
    LIST_COLUMNS,
    centred_replicates,
    few_users,
    sketch_variance,
)
from evald.statistics.cusum import (
    POOL_HALF_LIFE,
    cusum_update,
    forgetting,
    pooled_variance,
    run_statistic,
    stream_correlation,
)
from evald.statistics.sequential import half_width

__all__ = [
    "STRENGTHS",
    "Traffic",
    "baseline_alarms",
    "cusum_alarms",
    "first_true",
    "iid_alarm_share",
    "intraclass_correlation",
    "sequence_flags",
    "simulate",
    "with_pooled",
]

#: the per-user effect strengths of the simulations: none, mild (intra-class correlation of a
#: user's lists about 0.11, what the issue's streams had) and strong (about 0.3)
STRENGTHS = {"none": 0.0, "mild": 0.2, "strong": 0.35}
_BASE = 0.4  # mean probability that a list finds something
_CAP = 600  # lists of the heaviest user
_LOG_MEDIAN = 1.0  # lists per user: ceil(lognormal(1, 1.2)): median 3, mean 5.6, at most _CAP


@dataclass(frozen=True)
class Traffic:
    """One stream's shape."""

    users: int = 5000
    windows: int = 34
    strength: float = 0.0
    segments: int = 2
    session: int = 4
    shift: float = 0.0
    shift_at: int = 0
    replicates: int = 100
    treatment_share: float = 0.5  # of the users
    heavy_user: int = 0  # lists of one user in the treatment arm (a crawler), over every window
    first_segment_share: float = 0.0  # of the lists on segment 0, the rest on segment 1 (0: even)


def intraclass_correlation(strength: float) -> float:
    """Correlation of two lists of one user: Var(E[y|u]) / Var(y) with y = Bernoulli(p_u) ·
    Beta(2, 3), p_u = 0.4 + strength·z (unclipped): 0.16·strength² / 0.0544."""
    return 0.16 * strength * strength / (0.08 - (0.4 * _BASE) ** 2)


def simulate(traffic: Traffic, count: int, seed: int) -> NDArray[np.float64]:
    """``count`` independent streams' sums, shape (2 arms, count, segments, windows, columns);
    arm 0 is control. Each stream's users have bootstrap keys of their own (generated in
    chunks of streams, so the weights of a chunk fit in memory)."""
    rng = np.random.default_rng(seed)
    chunks = [
        _chunk(traffic, min(_CHUNK, count - first), rng, first) for first in range(0, count, _CHUNK)
    ]
    return np.concatenate(chunks, axis=1)


_CHUNK = 2  # streams generated together: small arrays stay in cache


def _chunk(t: Traffic, count: int, rng: np.random.Generator, first: int) -> NDArray[np.float64]:
    users = count * t.users
    lists = np.minimum(np.ceil(np.exp(rng.normal(_LOG_MEDIAN, 1.2, users))).astype(np.int64), _CAP)
    if t.treatment_share == 0.5:
        arm_of = rng.integers(0, 2, users)
    else:
        arm_of = (rng.random(users) < t.treatment_share).astype(np.int64)
    p = np.clip(_BASE + t.strength * rng.normal(0.0, 1.0, users), 0.02, 0.98)
    if t.heavy_user:  # the first user of each stream
        lists[:: t.users], arm_of[:: t.users] = t.heavy_user, 1
    user = np.repeat(np.arange(users), lists)
    n = user.size
    rank = np.arange(n) - np.repeat(np.cumsum(lists) - lists, lists)
    session_window = rng.integers(0, t.windows, (users, _CAP // t.session + 1))
    column = rank // t.session
    window = session_window[user, np.minimum(column, _CAP // t.session)]
    if t.heavy_user:  # its sessions drawn apart: a row of _CAP's width for every user is enough
        heavy = user % t.users == 0
        sessions = rng.integers(0, t.windows, (count, t.heavy_user // t.session + 1))
        window[heavy] = sessions[user[heavy] // t.users, column[heavy]]
    if t.first_segment_share:
        segment = (rng.random(n) >= t.first_segment_share).astype(np.int64)
    else:
        segment = rng.integers(0, t.segments, n)
    y = np.zeros(n)
    found = rng.random(n) < p[user]
    y[found] = rng.beta(2.0, 3.0, int(found.sum()))
    arm = arm_of[user]
    if t.shift:
        y = np.where((arm == 1) & (window >= t.shift_at), y * (1.0 - t.shift), y)
    stream_of = user // t.users
    cells = count * 2 * t.segments * t.windows
    group = ((stream_of * 2 + arm) * t.segments + segment) * t.windows + window
    columns = [
        np.bincount(group, minlength=cells).astype(np.float64),
        np.bincount(group, y, cells),
        np.bincount(group, y * y, cells),
    ]
    out = [np.stack(columns, axis=-1)]
    if t.replicates:
        ids = np.arange(first * t.users, first * t.users + users, dtype=np.uint64)
        keys = (ids + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        w = poisson_weights(keys, t.replicates, DEFAULT_SEED).astype(np.float64)
        shape = (cells, users)
        weighted = scipy.sparse.csr_matrix((y, (group, user)), shape=shape) @ w
        weight = scipy.sparse.csr_matrix((np.ones(n), (group, user)), shape=shape) @ w
        out += [columns[0][:, None], weighted, weight]  # every list has a user id
    sums = np.concatenate(out, axis=1).reshape(count, 2, t.segments, t.windows, -1)
    return np.moveaxis(sums, 1, 0)


def with_pooled(sums: NDArray[np.float64]) -> NDArray[np.float64]:
    """The sums with one more segment, last: the pooled one (every surface summed)."""
    return np.concatenate([sums, sums.sum(axis=-3, keepdims=True)], axis=-3)


def first_true(flags: NDArray[np.bool_]) -> NDArray[np.int64]:
    """The 1-based index of the first True along the last axis; 0 where there is none."""
    return np.where(flags.any(axis=-1), flags.argmax(axis=-1) + 1, 0)


def _contrast(
    minus: NDArray[np.float64], plus: NDArray[np.float64], list_level: bool
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64] | None]:
    """(difference, variance, replicate deviations or None) of mean(plus) − mean(minus) for
    sums with columns on the last axis (clustered.contrast, element-wise)."""
    means, lists = [], []
    for side in (minus, plus):
        n, total, squares = side[..., 0], side[..., 1], side[..., 2]
        with np.errstate(divide="ignore", invalid="ignore"):
            var = np.maximum(0.0, (squares - total * total / n) / (n - 1))
            means.append(total / n)
            lists.append(np.where(n >= 2, var / n, np.nan))
    difference, variance = means[1] - means[0], lists[1] + lists[0]
    if list_level or minus.shape[-1] == LIST_COLUMNS:
        return difference, variance, None
    b = (minus.shape[-1] - LIST_COLUMNS - 1) // 2
    lo = LIST_COLUMNS + 1
    deviations = [
        centred_replicates(side[..., lo : lo + b], side[..., lo + b :], side[..., 0], side[..., 1])
        for side in (minus, plus)
    ]
    replicates = deviations[1] - deviations[0]
    few = np.logical_or(*(few_users(side[..., 0], side[..., lo + b :]) for side in (minus, plus)))
    clustered = np.where(few, np.nan, sketch_variance(variance, replicates))
    return difference, clustered, replicates


def sequence_flags(
    sums: NDArray[np.float64],
    alpha: float,
    tuning_n: float,
    min_n: int = 100,
    list_level: bool = False,
) -> NDArray[np.int64]:
    """Per segment: the first look (1-based window) at which the sequence's band on treatment
    − control since the start excludes 0 (so does the running intersection); 0: never."""
    cumulative = np.cumsum(sums, axis=-2)
    difference, variance, _ = _contrast(cumulative[0], cumulative[1], list_level)
    n_c, n_t = cumulative[0, ..., 0], cumulative[1, ..., 0]
    half = half_width(n_c + n_t, variance, alpha, tuning_n)
    looked = (np.minimum(n_c, n_t) >= max(min_n, 2)) & np.isfinite(half) & (variance > 0)
    excluded = looked & (np.abs(difference) > half)
    return first_true(excluded)


def _standardized(
    difference: NDArray[np.float64],
    variance: NDArray[np.float64],
    replicates: NDArray[np.float64] | None,
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(variance > 0, np.sqrt(variance), np.nan)
        z = difference / scale
        return z, None if replicates is None else replicates / scale[..., None]


def _cusum(
    z: NDArray[np.float64],
    zeta: NDArray[np.float64] | None,
    n: NDArray[np.float64],
    k: float,
    h: float,
    min_n: int,
) -> NDArray[np.int64]:
    """Per segment, the first window whose CUSUM is above h (0: never): Page's recursion
    without replicates, the run statistic with them (cusum.Cusum.step, element-wise)."""
    shape = z.shape[:-1]
    statistic = np.zeros(shape)
    run_sum = np.zeros(shape)
    run_windows = np.zeros(shape)
    run = None if zeta is None else np.zeros((*shape, zeta.shape[-1]))
    alarm = np.zeros((*shape, z.shape[-1]), dtype=bool)
    for t in range(z.shape[-1]):
        step = (n[..., t] >= min_n) & np.isfinite(z[..., t])
        zt = np.where(step, z[..., t], 0.0)
        fresh = statistic <= 0.0
        run_sum = np.where(step, zt + np.where(fresh, 0.0, run_sum), run_sum)
        run_windows = np.where(step, 1 + np.where(fresh, 0, run_windows), run_windows)
        if run is None or zeta is None:
            moved = cusum_update(statistic, zt, k)
        else:
            grown = np.where(fresh[..., None], 0.0, run) + np.nan_to_num(zeta[..., t, :])
            run = np.where(step[..., None], grown, run)
            moved = run_statistic(run_sum, run_windows, run, k)
        statistic = np.where(step, moved, statistic)
        alarm[..., t] = statistic > h
    return first_true(alarm)


def _pooled_cusum(
    difference: NDArray[np.float64],
    variance: NDArray[np.float64],
    replicates: NDArray[np.float64] | None,
    counts: tuple[NDArray[np.float64], NDArray[np.float64]],
    limits: tuple[float, float, int],
    half_life: float,
) -> NDArray[np.int64]:
    """Per segment, the first window whose CUSUM is above h (0: never), each window
    standardized by the stream's pooled variance (cusum.Cusum.step_contrast, element-wise)."""
    k, h, min_n = limits
    decay, shape = forgetting(half_life), difference.shape[:-1]
    statistic, run_sum, run_windows = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    variance_sum, scale_sum, pooled = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    squared_sum, sd_sum = np.zeros(shape), np.zeros(shape)
    b = 0 if replicates is None else replicates.shape[-1]
    run, stream = np.zeros((*shape, b)), np.zeros((*shape, b))
    alarm = np.zeros(difference.shape, dtype=bool)
    for t in range(difference.shape[-1]):
        n_minus, n_plus = counts[0][..., t], counts[1][..., t]
        d, v = difference[..., t], variance[..., t]
        step = (np.minimum(n_minus, n_plus) >= min_n) & np.isfinite(d) & (v > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = 1.0 / n_minus + 1.0 / n_plus
        variance_sum = np.where(step, decay * variance_sum + v, variance_sum)
        scale_sum = np.where(step, decay * scale_sum + scale, scale_sum)
        pooled = np.where(step, pooled + 1, pooled)
        predicted = np.fmax(v, pooled_variance(variance_sum, scale_sum, scale))
        sd = np.sqrt(np.where(step, predicted, 1.0))
        z = np.where(step, d / sd, 0.0)
        fresh = statistic <= 0.0
        run_sum = np.where(step, z + np.where(fresh, 0.0, run_sum), run_sum)
        run_windows = np.where(step, 1 + np.where(fresh, 0, run_windows), run_windows)
        if replicates is None:
            moved = cusum_update(statistic, z, k)
        else:
            deviations = np.where(step[..., None], replicates[..., t, :], 0.0)
            stream = np.where(step[..., None], deviations + decay * stream, stream)
            squared_sum = np.where(step, decay * decay * squared_sum + v, squared_sum)
            sd_sum = np.where(step, decay * sd_sum + np.sqrt(np.where(step, v, 0.0)), sd_sum)
            grown = np.where(fresh[..., None], 0.0, run) + deviations / sd[..., None]
            run = np.where(step[..., None], grown, run)
            rho = stream_correlation(stream, squared_sum, sd_sum, pooled)
            moved = run_statistic(run_sum, run_windows, run, k, rho)
        statistic = np.where(step, moved, statistic)
        alarm[..., t] = statistic > h
    return first_true(alarm)


def cusum_alarms(
    sums: NDArray[np.float64],
    k: float = 0.5,
    h: float = 5.0,
    min_n: int = 30,
    list_level: bool = False,
    half_life: float = POOL_HALF_LIFE,
) -> NDArray[np.int64]:
    """Per segment, the first window at which the CUSUM of treatment − control (window
    differences standardized by the stream's pooled variance) is above h; 0: never."""
    difference, variance, replicates = _contrast(sums[0], sums[1], list_level)
    counts = (sums[0, ..., 0], sums[1, ..., 0])
    return _pooled_cusum(difference, variance, replicates, counts, (k, h, min_n), half_life)


def baseline_alarms(
    sums: NDArray[np.float64],
    arm: int,
    k: float = 0.5,
    h: float = 5.0,
    min_n: int = 30,
    windows: int = 24,
    list_level: bool = False,
) -> NDArray[np.int64]:
    """Per segment, the first window at which ``arm``'s CUSUM against the sum of its trailing
    ``windows`` windows is above h; 0: never (windows with no list do not join the baseline,
    as in the fold; the simulated ones all have lists)."""
    own = sums[arm]
    zero = np.zeros_like(own[..., :1, :])
    cumulative = np.concatenate([zero, np.cumsum(own, axis=-2)], axis=-2)
    t = np.arange(own.shape[-2])
    reference = cumulative[..., t, :] - cumulative[..., np.maximum(0, t - windows), :]
    difference, variance, replicates = _contrast(reference, own, list_level)
    z, zeta = _standardized(difference, variance, replicates)
    z[..., 0] = math.nan  # no baseline before the first window
    return _cusum(z, zeta, own[..., 0], k, h, min_n)


def iid_alarm_share(
    windows: int, runs: int = 200_000, k: float = 0.5, h: float = 5.0, seed: int = 1
) -> float:
    """The chance that the CUSUM alarms within ``windows`` windows of independent N(0, 1) z's:
    what its stated run length (docs/statistics.md §4) promises over that horizon."""
    rng = np.random.default_rng(seed)
    statistic = np.zeros(runs)
    alarmed = np.zeros(runs, dtype=bool)
    for _ in range(windows):
        statistic = cusum_update(statistic, rng.normal(0.0, 1.0, runs), k)
        alarmed |= statistic > h
    return float(alarmed.mean())
